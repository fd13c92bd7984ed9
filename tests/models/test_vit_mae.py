"""ViTMAE as a Keras model: `fit(images)` learns without labels, a `.keras` file holds it, `reconstruct` draws what
it saw and made, bad arguments are refused by name. Its outputs and loss against transformers on every backend:
tests/convert/test_vit_mae.py."""

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import InputError
from tests.checks import to_numpy


def small_mae(**overrides) -> keras_tfm.ViTMAE:
    encoder = keras_tfm.ViT(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32,
                            intermediate_dim=64, include_top=False)  # fmt: skip
    return keras_tfm.ViTMAE(encoder, **{**dict(decoder_dim=32, decoder_layers=1, decoder_heads=2,
                                               decoder_intermediate_dim=64, seed=0), **overrides})  # fmt: skip


def ramps(rng, count: int, side: int = 16) -> np.ndarray:
    """Images that are planes, `a x + b y + c` per channel: a hidden patch follows from the visible ones."""
    y, x = (np.mgrid[:side, :side] - (side - 1) / 2) / (side / 2)
    a, b, c = rng.normal(size=(3, count, 1, 1, 1))
    return (a * x[..., None] + b * y[..., None] + c * np.array([1.0, 0.5, -0.5])).astype("float32")


# Keras' fit on one backend; the outputs and the loss on every backend: tests/convert/test_vit_mae.py
@pytest.mark.backend_independent
def test_fit_on_images_alone_learns_to_fill_in_hidden_patches(rng):
    model = small_mae()
    images = ramps(rng, 160)
    model.compile(optimizer=keras.optimizers.Adam(3e-3))  # no loss: the model's own (compute_loss)
    before = model.evaluate(images[128:], verbose=0)
    model.fit(images[:128], batch_size=32, epochs=30, verbose=0)
    after = model.evaluate(images[128:], verbose=0)
    # predicting zeros costs about 1.3; each image's exact colour, without its slopes, 0.66
    assert before > 1.0 and after < 0.25, (before, after)


@pytest.mark.backend_independent  # Keras' saving; the outputs on every backend: tests/convert/test_vit_mae.py
def test_a_keras_file_holds_the_encoder_the_decoder_and_the_frozen_positions(rng, tmp_path):
    model = small_mae(normalize_targets=True, mask_ratio=0.5)
    images, noise = ramps(rng, 2), rng.random((2, 16)).astype("float32")
    expected = to_numpy(model(images, noise=noise)["logits"])
    model.save(tmp_path / "mae.keras")
    loaded = keras_tfm.load(str(tmp_path / "mae.keras"))
    assert loaded.get_config() == model.get_config()
    np.testing.assert_allclose(to_numpy(loaded(images, noise=noise)["logits"]), expected, atol=1e-6)
    trainable = {weight.path for weight in loaded.trainable_weights}
    assert not any("position" in path for path in trainable)  # both tables fixed, as the paper's


@pytest.mark.backend_independent
def test_reconstruct_shows_the_visible_patches_and_predicts_the_hidden(rng):
    model = small_mae()
    images, noise = ramps(rng, 2), rng.random((2, 16)).astype("float32")
    pictures = model.reconstruct(images, noise=noise)
    hidden = to_numpy(model(images, noise=noise)["mask"]).reshape(2, 4, 4).repeat(4, 1).repeat(4, 2)[..., None] > 0
    np.testing.assert_allclose(pictures["pasted"], np.where(hidden, pictures["reconstruction"], images), atol=1e-6)
    np.testing.assert_array_equal(pictures["masked"], np.where(hidden, 0.0, images))
    np.testing.assert_array_equal(pictures["hidden"], hidden)
    np.testing.assert_allclose(to_numpy(model.unpatchify(model.patchify(images))), images)


@pytest.mark.backend_independent  # configuration only: nothing is built
def test_the_named_size_is_the_checkpoints_configuration():
    """vit_mae_base() is transformers' default ViTMAEConfig (facebook/vit-mae-base); with equal configurations
    the small model's equal parameter count (tests/convert/test_vit_mae.py) carries over."""
    config = pytest.importorskip("transformers").ViTMAEConfig()
    model = keras_tfm.vit_mae_base()
    encoder = model.encoder
    assert (encoder.image_size, encoder.patch_size, encoder.num_layers, encoder.num_heads, encoder.hidden_dim,
            encoder.intermediate_dim, encoder.layer_norm_epsilon) == (config.image_size, config.patch_size,
            config.num_hidden_layers, config.num_attention_heads, config.hidden_size, config.intermediate_size,
            config.layer_norm_eps)  # fmt: skip
    assert (model.decoder_dim, model.decoder_layers, model.decoder_heads, model.decoder_intermediate_dim,
            model.mask_ratio, model.normalize_targets) == (config.decoder_hidden_size, config.decoder_num_hidden_layers,
            config.decoder_num_attention_heads, config.decoder_intermediate_size, config.mask_ratio,
            config.norm_pix_loss)  # fmt: skip


@pytest.mark.backend_independent  # constructor checks and shapes: nothing backend-specific runs
def test_bad_arguments_and_images_are_refused_by_name():
    with pytest.raises(InputError, match="mask_ratio"):
        small_mae(mask_ratio=1.0)
    with pytest.raises(InputError, match="encoder"):
        keras_tfm.ViTMAE(keras_tfm.vit_tiny(image_size=16, patch_size=4, num_layers=1))  # with its classifier
    with pytest.raises(InputError, match=r"images \(batch, 16, 16, 3\)"):
        small_mae()(np.zeros((1, 32, 32, 3), "float32"))
