"""YOLOS: it learns to find generated shapes, trains on every backend (the matching on the host inside the compiled
step), saves and reloads, answers boxes in each image's own pixels, and refuses bad input by name."""

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.data import ImageProcessor, make_shapes
from keras_tfm.detection import center_to_corners, coco_average_precision, detections
from keras_tfm.errors import InputError
from tests.checks import to_numpy

pytest.importorskip("scipy")
BACKEND = keras.backend.backend()


def tiny_yolos(**overrides) -> keras_tfm.YOLOS:
    settings = dict(image_shape=(32, 32), patch_size=4, num_classes=3, num_detection_tokens=2, num_layers=2,
                    num_heads=4, hidden_dim=64, intermediate_dim=128, mid_position_embeddings=False)  # fmt: skip
    return keras_tfm.YOLOS(**{**settings, **overrides})


def targets_of(count: int) -> dict:
    return {"labels": np.zeros((count, 1), "int32"), "boxes": np.full((count, 1, 4), 0.5, "float32")}


def targets(shapes) -> dict:
    return {"labels": shapes.labels, "boxes": shapes.boxes}


def truth_in_pixels(shapes, side: int) -> list[dict]:
    return [{"labels": labels[labels >= 0], "boxes": to_numpy(center_to_corners(boxes[labels >= 0])) * side}
            for labels, boxes in zip(shapes.labels, shapes.boxes)]  # fmt: skip


def map_50(model, shapes) -> float:
    outputs = model.predict(shapes.images.astype("float32") / 255, verbose=0)
    found = detections(outputs["logits"], outputs["pred_boxes"], [(32, 32)] * len(shapes.images), threshold=0.0)
    return coco_average_precision(found, truth_in_pixels(shapes, 32))["map_50"]


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="learning once, on the fastest backend here; each backend's step below")
def test_yolos_learns_to_find_shapes():
    """One shape per picture, on textured backgrounds: COCO's mAP at IoU 0.5 from about 0 untrained to over 0.4,
    the set-prediction loss from about 8 to under 2.5 (160 steps)."""
    pytest.importorskip("pycocotools")
    shapes = make_shapes(32, image_size=32, max_shapes=1, seed=0)
    keras.utils.set_random_seed(0)
    model = tiny_yolos()
    untrained = map_50(model, shapes)
    model.compile(optimizer=keras.optimizers.Adam(1e-3, clipnorm=1.0))
    history = model.fit(shapes.images.astype("float32") / 255, targets(shapes), epochs=80, batch_size=16, verbose=0)
    assert history.history["loss"][0] > 6 and history.history["loss"][-1] < 2.5, history.history["loss"][::10]
    assert untrained < 0.05 and map_50(model, shapes) > 0.4


def test_every_backend_trains_with_the_matching_inside_its_compiled_step(tmp_path):
    """XLA on JAX (SciPy through `pure_callback`), a graph on TensorFlow (through `numpy_function`), eager PyTorch:
    the weights move, the loss is finite; the `.keras` file gives the same outputs."""
    shapes = make_shapes(8, image_size=32, max_shapes=2, seed=1)
    model = tiny_yolos(num_layers=1, mid_position_embeddings=True)
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    history = model.fit(shapes.images.astype("float32") / 255, targets(shapes), epochs=1, batch_size=4, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert all(not np.allclose(a, to_numpy(b)) for a, b in zip(before, model.trainable_weights))
    model.save(tmp_path / "yolos.keras")
    loaded = keras.saving.load_model(tmp_path / "yolos.keras")
    images = shapes.images[:2].astype("float32") / 255
    for name, value in model(images).items():
        np.testing.assert_allclose(to_numpy(loaded(images)[name]), to_numpy(value), atol=1e-6)


@pytest.mark.backend_independent
def test_detect_answers_each_images_objects_in_its_own_pixels():
    model = tiny_yolos(class_names=["circle", "square", "triangle"])
    model.image_processor = ImageProcessor(size={"shortest_edge": 32, "longest_edge": 64}, resample=2,
                                           processor_type="YolosImageProcessor")  # fmt: skip
    pictures = [np.zeros((40, 64, 3), "uint8"), np.zeros((64, 40, 3), "uint8")]
    found = model.detect(pictures, threshold=0.0)
    for picture, result in zip(pictures, found, strict=True):
        outputs = model(model.preprocess_images([picture]))
        expected = detections(to_numpy(outputs["logits"]), to_numpy(outputs["pred_boxes"]), [picture.shape[:2]], 0.0)[0]
        np.testing.assert_allclose(result["boxes"], expected["boxes"], atol=1e-4)
        assert (
            result["names"] == [model.class_names[label] for label in expected["labels"]] and len(result["names"]) == 2
        )
    assert isinstance(model.detect(pictures[0], threshold=0.0), dict)
    with pytest.raises(InputError, match=r"^threshold: detect: expected a score in \[0, 1\); received 1.5"):
        model.detect(pictures, threshold=1.5)
    with pytest.raises(InputError, match=r"detects nothing; load it with its detection head"):
        tiny_yolos(include_top=False).detect(pictures)


@pytest.mark.backend_independent
def test_bad_targets_and_settings_are_refused_by_name():
    model = tiny_yolos(num_layers=1)
    images = np.zeros((2, 32, 32, 3), "float32")
    with pytest.raises(InputError, match=r"^y: YOLOS.fit: expected targets \{'labels'.*; received \w+"):
        model.fit(images, np.zeros((2, 3)), epochs=1, verbose=0)
    objects = {"labels": np.asarray([[0, -1], [3, 1]]), "boxes": np.full((2, 2, 4), 0.5, "float32")}
    with pytest.raises(InputError, match=r"^y: YOLOS.fit: labels must be class ids in \[0, num_classes=3\).*\[-1, 3\]"):
        model.fit(images, objects, epochs=1, verbose=0)
    with pytest.raises(InputError, match=r"^validation_data: YOLOS.fit: boxes must be \(batch, objects, 4\)"):
        model.fit(images, targets_of(2), validation_data=(images, {**targets_of(2), "boxes": np.zeros((2, 4))}))
    with pytest.raises(InputError, match=r"^image_shape: YOLOS: expected \(height, width\), two integers >= 1"):
        keras_tfm.YOLOS(image_shape=32)
    with pytest.raises(InputError, match=r"^loss_settings: YOLOS: expected a dict of class_cost, .*'eos'"):
        keras_tfm.YOLOS(loss_settings={"eos": 0.1})
    with pytest.raises(InputError, match=r"YOLOS expects `images` of shape \(batch, height, width, 3\)"):
        model(np.zeros((2, 32, 32), "float32"))
