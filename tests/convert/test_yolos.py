"""YOLOS (`YolosForObjectDetection`, `YolosModel`) from and to transformers, built from small random configurations
offline: logits and boxes at the trained image size and at another (positions resized), the set-prediction loss
with its Hungarian matching, the post-processing and the image processor."""

import numpy as np
import pytest

import keras_tfm
from keras_tfm.data import ImageProcessor
from keras_tfm.detection import detections, set_prediction_losses
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("scipy")

CONFIG = dict(image_size=[32, 48], patch_size=8, num_hidden_layers=2, hidden_size=16, num_attention_heads=2,
              intermediate_size=32, num_detection_tokens=6, num_labels=3)  # fmt: skip


def hf_yolos(cls=None, **options):
    """A small YOLOS with every parameter drawn wide (transformers starts the box head's last layer near zero,
    which would hide a wrong box head)."""
    torch.manual_seed(0)
    hf = (cls or transformers.YolosForObjectDetection)(transformers.YolosConfig(**{**CONFIG, **options}))
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.normal_(0.0, 0.3)
    return hf.eval()


def run_hf(hf, images, **kwargs):
    with torch.no_grad():
        return hf(torch.tensor(images).permute(0, 3, 1, 2), **kwargs)


def objects(rng, counts, slots=3):
    """Padded targets for `fit` and transformers' list of dicts, the same objects."""
    labels, boxes, listed = np.full((len(counts), slots), -1, "int32"), np.zeros((len(counts), slots, 4), "float32"), []
    for row, count in enumerate(counts):
        labels[row, :count] = rng.integers(0, 3, count)
        boxes[row, :count] = np.concatenate([rng.uniform(0.2, 0.8, (count, 2)), rng.uniform(0.05, 0.3, (count, 2))], 1)
        listed.append(
            {"class_labels": torch.tensor(labels[row, :count]).long(), "boxes": torch.tensor(boxes[row, :count])}
        )
    return labels, boxes, listed


@pytest.mark.parametrize("mid", [True, False])
def test_yolos_gives_transformers_logits_boxes_and_loss_and_round_trips(rng, tmp_path, mid):
    hf = hf_yolos(use_mid_position_embeddings=mid)
    model = keras_tfm.from_huggingface(hf)  # transformers 5's names, from memory
    assert isinstance(model, keras_tfm.YOLOS) and model.count_params() == sum(p.numel() for p in hf.parameters())
    labels, boxes, listed = objects(rng, [3, 1])
    for shape in ((32, 48), (40, 24)) if mid else ((32, 48),):  # another size: the position tables resized
        images = rng.normal(size=(2, *shape, 3)).astype("float32")
        expected = run_hf(hf, images, labels=listed)
        outputs = model(images)
        for name in ("logits", "pred_boxes"):
            np.testing.assert_allclose(to_numpy(outputs[name]), getattr(expected, name).numpy(), atol=1e-4, rtol=0)
    losses = set_prediction_losses(outputs["logits"], outputs["pred_boxes"], labels, boxes)
    for name, value in expected.loss_dict.items():
        if name != "cardinality_error":  # logged by transformers, not a loss
            assert float(to_numpy(losses[name])) == pytest.approx(value.item(), abs=1e-5), name
    assert float(to_numpy(losses["loss"])) == pytest.approx(expected.loss.item(), abs=1e-5)
    keras_tfm.save_huggingface(model, str(tmp_path / "ours"))  # the published names
    reloaded = transformers.YolosForObjectDetection.from_pretrained(tmp_path / "ours").eval()
    np.testing.assert_allclose(run_hf(reloaded, images).logits.numpy(), expected.logits.numpy(), atol=1e-6, rtol=0)
    assert reloaded.config.use_mid_position_embeddings == mid and reloaded.config.eos_coefficient == 0.1


@pytest.mark.backend_independent
def test_the_encoder_alone_and_a_new_head_load_from_transformers(rng, tmp_path):
    hf = hf_yolos(transformers.YolosModel)
    model = keras_tfm.from_huggingface(hf)
    pooler = sum(p.numel() for name, p in hf.named_parameters() if name.startswith("pooler."))
    assert not model.include_top and model.count_params() == sum(p.numel() for p in hf.parameters()) - pooler
    images = rng.normal(size=(1, 32, 48, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(images)), run_hf(hf, images).last_hidden_state.numpy(), atol=1e-4)
    hf_yolos(image_size=[36, 50], use_mid_position_embeddings=False).save_pretrained(
        tmp_path / "detector"
    )  # sides the patch does not divide (YOLOS-Ti: 1333)
    five = keras_tfm.from_huggingface(str(tmp_path / "detector"), num_classes=5)  # a new head: fine-tuning
    assert to_numpy(five(images)["logits"]).shape == (1, 6, 6) and five.class_names[0] == "LABEL_0"


@pytest.mark.backend_independent  # NumPy, Pillow
def test_post_processing_and_the_processor_equal_transformers(rng, tmp_path):
    from PIL import Image

    hf_processor = transformers.YolosImageProcessor(size={"shortest_edge": 96, "longest_edge": 160})
    hf_processor.save_pretrained(tmp_path)
    processor = ImageProcessor.from_huggingface(str(tmp_path))
    for shape in ((70, 130, 3), (200, 90, 3), (50, 400, 3)):  # each side capped, rounded down to 16
        image = rng.integers(0, 256, shape).astype("uint8")
        expected = hf_processor(Image.fromarray(image), return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)
        np.testing.assert_allclose(processor(image)[0], expected, atol=1e-5)
    logits = rng.normal(size=(2, 6, 4)).astype("float32") * 3
    pred_boxes = rng.uniform(0.1, 0.9, (2, 6, 4)).astype("float32")
    outputs = transformers.models.yolos.modeling_yolos.YolosObjectDetectionOutput(
        logits=torch.tensor(logits), pred_boxes=torch.tensor(pred_boxes)
    )
    sizes = [(70, 130), (200, 90)]
    expected = hf_processor.post_process_object_detection(outputs, threshold=0.4, target_sizes=sizes)
    for ours, theirs in zip(detections(logits, pred_boxes, sizes, 0.4), expected, strict=True):
        assert len(ours["scores"]) and list(ours["labels"]) == theirs["labels"].tolist()
        np.testing.assert_allclose(ours["scores"], theirs["scores"].numpy(), atol=1e-6)
        np.testing.assert_allclose(ours["boxes"], theirs["boxes"].numpy(), atol=1e-4)
