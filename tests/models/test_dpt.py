"""DPT: a ViT backbone, DPT's neck and a depth or segmentation head as parts of one model. It learns depth from
pictures, trains on every backend and reloads from its `.keras` file, composes its parts from their configs, and
refuses parts that do not fit by name. The outputs against transformers: tests/convert/test_dpt.py."""

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.data import ImageProcessor, make_shapes
from keras_tfm.errors import InputError
from keras_tfm.layers import ConvSegmentationHead, DepthHead, DPTNeck
from tests.checks import to_numpy

BACKEND = keras.backend.backend()


def tiny_dpt(head, readout: str = "ignore", **overrides) -> keras_tfm.DPT:
    backbone = keras_tfm.ViT(image_size=32, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32,
                             include_top=False)  # fmt: skip
    neck = DPTNeck((16, 32), (2, 1), fusion_dim=16, readout=readout, fusion_upsampling="next_map")
    return keras_tfm.DPT(backbone, neck, head, backbone_layers=(1, 2), **overrides)


def squares_and_depths(count: int):
    """Noisy pictures of a bright and a dark square (tests/models/test_segformer.py's) and their disparity: the
    background at 1, the bright square nearest (3), the dark one at 2."""
    from tests.models.test_segformer import shapes

    images, labels = shapes(np.random.default_rng(0), count)
    return images, np.choose(np.where(labels == 255, 0, labels), [1.0, 3.0, 2.0]).astype("float32")


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="learning once, on the fastest backend here; each backend's step below")
def test_dpt_learns_the_depth_of_pictures_it_has_not_seen(tmp_path):
    """The default loss of a relative depth head (scale-and-shift invariant) on held-out pictures: a flat
    prediction scores the targets' mean absolute deviation, the untrained model about as much; trained, less than
    half of it. Its `.keras` file gives the same depths."""
    images, depths = squares_and_depths(64)
    keras.utils.set_random_seed(0)
    model = tiny_dpt(DepthHead(8), head_resolution="image")
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    held_out = depths[48:]
    flat = float(np.mean(np.abs(held_out - held_out.mean(axis=(1, 2), keepdims=True))))
    before = model.evaluate(images[48:], held_out, verbose=0)
    model.fit(images[:48], depths[:48], batch_size=16, epochs=50, verbose=0)
    after = model.evaluate(images[48:], held_out, verbose=0)
    assert before > 0.8 * flat and after < 0.5 * flat, (before, after, flat)
    model.save(tmp_path / "depth.keras")
    reloaded = keras_tfm.load(str(tmp_path / "depth.keras"))
    np.testing.assert_allclose(to_numpy(reloaded(images[:2])), to_numpy(model(images[:2])), atol=1e-5)


@pytest.mark.skipif(BACKEND == "jax", reason="JAX's compiled fit of a DPT: the learning test above")
def test_every_backend_fits_a_segmenting_dpt_and_its_keras_file_reloads(tmp_path):
    """The default loss and metric (cross-entropy, mean IoU), compiled as each backend compiles (XLA on
    TensorFlow); the batch norm's statistics move; the `.keras` file holds the three parts' configs and gives the
    same logits. On JAX the keras file is the learning test's."""
    shapes = make_shapes(8, image_size=32, max_shapes=2, seed=2)
    model = tiny_dpt(
        ConvSegmentationHead(4),
        readout="project",
        head_resolution="image",
        class_names=["ground", "circle", "square", "triangle"],
    )
    model.build()
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    history = model.fit(shapes.images / 255, shapes.masks.astype("int32"), batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all() and "mean_iou" in history.history
    assert len(before) > 40 and all(not np.allclose(a, to_numpy(b)) for a, b in zip(before, model.trainable_weights))
    assert to_numpy(model.head.batch_norm.moving_mean).any()
    model.image_processor = ImageProcessor(size={"height": 32, "width": 32}, do_normalize=False)  # x / 255
    model.save(tmp_path / "dpt.keras")
    loaded = keras_tfm.load(str(tmp_path / "dpt.keras"))
    assert loaded.get_config() == model.get_config() and isinstance(loaded.neck, DPTNeck)
    images = shapes.images[:2] / 255
    np.testing.assert_allclose(to_numpy(loaded(images)), to_numpy(model(images)), atol=1e-5)
    expected = np.argmax(to_numpy(model(shapes.images[:1] / 255))[0], axis=-1)
    np.testing.assert_array_equal(loaded.segment(shapes.images[0]), expected)
    assert loaded.class_names[1] == "circle"


@pytest.mark.backend_independent  # configuration only: nothing is built
def test_the_named_sizes_are_the_checkpoints_configurations():
    large = keras_tfm.dpt_large()
    assert (large.backbone.num_layers, large.backbone.hidden_dim, large.backbone_layers) == (24, 1024, [6, 12, 18, 24])
    assert large.neck.readout == "project" and large.num_classes == 150 and not large.normalize_features
    small = keras_tfm.depth_anything_v2_small()
    assert (small.backbone.hidden_dim, small.backbone.patch_size, small.backbone_layers) == (384, 14, [3, 6, 9, 12])
    assert small.neck.reassemble_widths == [48, 96, 192, 384] and small.neck.fusion_dim == 64
    assert small.normalize_features and small.head_resolution == "image" and not small.include_top
    assert keras_tfm.depth_anything_v2_large().backbone_layers == [5, 12, 18, 24]


@pytest.mark.backend_independent  # constructor checks: nothing is built
def test_parts_that_do_not_fit_are_refused_by_name():
    backbone = keras_tfm.ViT(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, include_top=False)
    neck = DPTNeck((8, 8), (2, 1), fusion_dim=8, readout="ignore")
    with pytest.raises(InputError, match=r"^backbone_layers: DPT: the neck reassembles 2 maps; received 3"):
        keras_tfm.DPT(backbone, neck, DepthHead(), backbone_layers=(0, 1, 2))
    with pytest.raises(InputError, match=r"backbone_layers: DPT: expected a list of layer numbers in \[0, 2\]"):
        keras_tfm.DPT(backbone, neck, DepthHead(), backbone_layers=(1, 3))
    with pytest.raises(InputError, match=r"^head: DPT: expected a DepthHead or ConvSegmentationHead; received <Dense"):
        keras_tfm.DPT(backbone, neck, keras.layers.Dense(2), backbone_layers=(1, 2))
    with pytest.raises(InputError, match=r"reassemble_factors: DPTNeck: expected 2 factors .* received \[2, 0.3\]"):
        DPTNeck((8, 8), (2, 0.3))
    with pytest.raises(InputError, match=r"estimates depth \(a DepthHead\): use estimate_depth"):
        keras_tfm.DPT(backbone, neck, DepthHead(), backbone_layers=(1, 2)).segment(np.zeros((16, 16, 3), "uint8"))
