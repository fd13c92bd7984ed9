"""SegFormer as a Keras model: it learns to label pixels, a `.keras` file holds it whole, its named sizes are the
checkpoints', and bad arguments are refused by name. Its outputs against transformers on every backend:
tests/convert/test_segformer.py."""

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import InputError
from tests.checks import to_numpy

SMALL = dict(num_classes=3, stage_widths=(8, 16), stage_depths=(1, 1), stage_heads=(1, 2),
             stage_reduction_ratios=(2, 1), stage_patch_sizes=(7, 3), stage_strides=(4, 2), stage_mlp_ratios=(2, 2),
             decoder_dim=16, drop_path_rate=0.0, classifier_dropout=0.0)  # fmt: skip


def shapes(rng, count: int, side: int = 32):
    """Noisy images with a bright square (class 1) and a dark one (class 2) on the background (class 0); the
    pixels at the squares' edges are unlabelled (255), as ADE20k's boundaries are."""
    images = rng.normal(0.0, 0.3, size=(count, side, side, 3)).astype("float32")
    labels = np.zeros((count, side, side), "int32")
    for image, label in zip(images, labels):
        for value, cls in ((2.0, 1), (-2.0, 2)):
            top, left = rng.integers(0, side - 12, size=2)
            size = rng.integers(8, 12)
            image[top : top + size, left : left + size] += value
            label[top : top + size, left : left + size] = cls
            label[top, left : left + size] = 255
    return images, labels


# Keras' fit on one backend; the outputs and the loss on every backend: tests/convert/test_segformer.py
@pytest.mark.backend_independent
def test_segformer_learns_to_label_pixels(rng):
    model = keras_tfm.SegFormer(**SMALL)  # compiled by default: SegmentationCrossEntropy, MeanIoU
    images, labels = shapes(rng, 64)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    before = model.evaluate(images[32:], labels[32:], verbose=0, return_dict=True)
    model.fit(images[:32], labels[:32], batch_size=16, epochs=20, verbose=0)
    after = model.evaluate(images[32:], labels[32:], verbose=0, return_dict=True)
    # the classes' shares alone (about 0.8, 0.1, 0.1) cost 0.64 nats: held-out images below that see the squares
    assert before["loss"] > 0.9 and after["loss"] < 0.3, (before, after)
    assert after["mean_iou"] > 0.5, after  # all background: about 0.27 (class 0's IoU 0.8, the squares' 0)


@pytest.mark.backend_independent  # Keras' saving; the outputs on every backend: tests/convert/test_segformer.py
def test_a_keras_file_holds_the_encoder_and_the_decoder_with_its_statistics(rng, tmp_path):
    model = keras_tfm.SegFormer(**SMALL, class_names=["ground", "bright", "dark"])
    images, labels = shapes(rng, 8)
    model.fit(images, labels, epochs=1, verbose=0)  # moves the batch norm's running statistics
    expected = to_numpy(model(images))
    model.save(tmp_path / "segformer.keras")
    loaded = keras_tfm.load(str(tmp_path / "segformer.keras"))
    assert loaded.get_config() == model.get_config() and loaded.class_names == ["ground", "bright", "dark"]
    np.testing.assert_allclose(to_numpy(loaded(images)), expected, atol=1e-6)
    assert to_numpy(loaded.decoder.batch_norm.moving_mean).any()


@pytest.mark.backend_independent  # configuration only: nothing is built
def test_the_named_sizes_are_the_checkpoints_configurations():
    """segformer_b0() is transformers' default SegformerConfig (nvidia/segformer-b0-finetuned-ade-512-512), whose
    parameter count the small model's equality with SegformerForSemanticSegmentation vouches for; B1-B5 are wider
    and deeper as the paper's table says."""
    transformers = pytest.importorskip("transformers")
    from keras_tfm.convert.segformer import STAGES

    config = transformers.SegformerConfig().to_dict()
    model = keras_tfm.segformer_b0()
    assert all(list(getattr(model, ours)) == list(config[theirs]) for ours, theirs in STAGES.items())
    assert (model.decoder_dim, model.num_classes) == (config["decoder_hidden_size"], 150)
    depths = {size: tuple(getattr(keras_tfm, f"segformer_{size}")().stage_depths) for size in ("b2", "b3", "b4", "b5")}
    assert depths == {"b2": (3, 4, 6, 3), "b3": (3, 4, 18, 3), "b4": (3, 8, 27, 3), "b5": (3, 6, 40, 3)}
    assert keras_tfm.segformer_b1().stage_widths == [64, 128, 320, 512] and keras_tfm.segformer_b5().decoder_dim == 768


@pytest.mark.backend_independent  # constructor checks and NumPy labels: nothing backend-specific runs
@pytest.mark.parametrize(
    "arguments, words",
    [
        (dict(stage_widths=(8, 16, 24)), "one value per stage"),
        (dict(stage_heads=(3, 2)), "multiples of stage_heads"),
        (dict(stage_strides=(4, 0)), "stage_strides must hold integers >= 1"),
        (dict(stage_mlp_ratios=[]), "stage_mlp_ratios must be a non-empty list"),
        (dict(decoder_dim=0), "decoder_dim must be an integer >= 1"),
    ],
)
def test_bad_stage_arguments_are_refused_by_name(arguments, words):
    with pytest.raises(InputError, match=words):
        keras_tfm.SegFormer(**{**SMALL, **arguments})


@pytest.mark.backend_independent
def test_bad_images_and_labels_are_refused_by_name(rng):
    model = keras_tfm.SegFormer(**SMALL)
    with pytest.raises(InputError, match=r"images.*\(batch, height, width, 3\)"):
        model(np.zeros((1, 32, 32, 1), "float32"))
    images, labels = shapes(rng, 4)
    labels[0, 0, 0] = 7  # neither a class nor the ignored 255
    with pytest.raises(InputError, match="num_classes"):
        model.fit(images, labels, epochs=1, verbose=0)
    with pytest.raises(InputError, match="include_top"):
        keras_tfm.SegFormer(**{**SMALL, "include_top": False}).segment(images)
