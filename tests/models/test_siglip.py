"""SigLIP as a model of two towers: it learns which text goes with which image by the sigmoid loss, from pairs
without labels; a named size is the checkpoint's configuration."""

import keras
import numpy as np
import pytest

import keras_tfm
from tests.models.test_clip import paired


def small_siglip():
    vision = keras_tfm.ViT(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=16, include_top=False,
                           use_class_token=False, pooling="attention", activation="gelu_approximate")  # fmt: skip
    text = keras_tfm.CLIPTextEncoder(vocabulary_size=12, max_length=4, num_layers=1, num_heads=2, hidden_dim=16,
                                     causal=False, pooling="last_token", pad_token_id=11)  # fmt: skip
    return keras_tfm.SigLIP(vision, text)


# Keras' fit on one backend: SigLIP's outputs on every backend (tests/convert/test_siglip.py), the sigmoid loss on
# every backend (tests/test_losses.py), and CLIP, of the same towers' machinery, learns on every backend (test_clip.py)
@pytest.mark.backend_independent
def test_siglip_learns_the_pairs_without_labels(rng):
    model = small_siglip()
    data = paired(rng)  # texts: start, the colour's word, end (11, also the padding: pooled at the last place)
    model.compile(optimizer=keras.optimizers.Adam(3e-3))  # the default loss: SigmoidLoss on logits_per_text
    before = model.evaluate(data, batch_size=8, verbose=0)
    model.fit(data, batch_size=8, epochs=40, shuffle=False, verbose=0)  # a plateau first: the bias alone learned
    after = model.evaluate(data, batch_size=8, verbose=0)
    # each image's 8 questions: answered at chance they cost 8 ln 2 = 5.5; by the best bias alone, without telling
    # the pairs apart, ln 8 + 7 ln 8/7 = 3.0
    assert before > 3.0 and after < 1.0, (before, after)


@pytest.mark.backend_independent  # Keras' saving; the model's outputs on every backend: tests/convert/test_siglip.py
def test_a_keras_file_holds_both_towers_and_the_pooling_head(rng, tmp_path):
    model = small_siglip()
    data = paired(rng, 8)
    expected = keras.ops.convert_to_numpy(model(data)["logits_per_text"])
    model.save(tmp_path / "siglip.keras")
    loaded = keras_tfm.load(str(tmp_path / "siglip.keras"))
    assert loaded.get_config() == model.get_config() and loaded.vision_encoder.attention_pool is not None
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(data)["logits_per_text"]), expected, atol=1e-6)


@pytest.mark.backend_independent  # configuration only: nothing is built
def test_a_named_size_is_the_checkpoints_configuration():
    """siglip_base_patch16_224() has the towers `from_huggingface` makes of transformers' default SiglipConfig (that
    of google/siglip-base-patch16-224), whose parameter counts equal SiglipModel's (tests/convert/test_siglip.py)."""
    transformers = pytest.importorskip("transformers")
    from keras_tfm.convert.siglip import _text_tower, _vision_tower

    config = transformers.SiglipConfig().to_dict()
    model = keras_tfm.siglip_base_patch16_224()
    for tower, made in ((model.vision_encoder, _vision_tower(config["vision_config"])),
                        (model.text_encoder, _text_tower(config["text_config"]))):  # fmt: skip
        assert tower.get_config() == made.get_config()
    assert (
        keras_tfm.siglip_so400m_patch14_224(vision_image_size=384, vision_patch_size=16).vision_encoder.grid_size == 24
    )
