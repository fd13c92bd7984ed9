"""The segmentation and detection recipes: short runs on the generated shapes leave their metrics, pictures and a
checkpoint transformers loads; a detector fine-tunes a YOLOS checkpoint (resuming is the shared runtime's:
tests/training; learning is each model's: tests/models)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.recipes.helpers import recipe

SHORT = ["--epochs", "1", "--train-images", "64", "--test-images", "8", "--image-size", "32", "--batch-size", "16"]


# The recipes' pipelines, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_segmentation_recipe_scores_mean_iou_draws_maps_and_writes_a_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "run"
    done = recipe("segmentation.py", *SHORT, "--output-dir", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= metrics["validation_mean_iou"] <= 1.0 and metrics["data"].startswith("generated shapes")
    assert f"mean IoU on 8 test pictures: {metrics['validation_mean_iou']:.4f}" in done.stdout
    assert (out / "segmentation.png").read_bytes()[:4] == b"\x89PNG"
    hf = transformers.SegformerForSemanticSegmentation.from_pretrained(out / "huggingface")
    assert hf.config.id2label[3] == "triangle" and sum(p.numel() for p in hf.parameters()) == metrics[
        "trainable_parameters"]  # fmt: skip
    refused = recipe("segmentation.py", "--num-layers", "2", "--output-dir", str(tmp_path / "bad"))
    assert refused.returncode == 2 and "--num-layers: the recipe's SegFormer has stages" in refused.stderr


@pytest.mark.backend_independent
def test_detection_recipe_scores_coco_map_draws_boxes_and_fine_tunes_a_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    pytest.importorskip("pycocotools")
    tiny = ["--num-layers", "1", "--hidden-dim", "32", "--num-heads", "2"]
    out = tmp_path / "run"
    done = recipe("detection.py", *SHORT, *tiny, "--output-dir", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"map", "map_50", "map_75"} <= set(metrics) and 0.0 <= metrics["map"] <= 1.0
    assert (out / "detections.png").read_bytes()[:4] == b"\x89PNG"
    trained = transformers.YolosForObjectDetection.from_pretrained(out / "huggingface")
    assert trained.config.id2label == {0: "circle", 1: "square", 2: "triangle"}
    # a checkpoint with 5 classes and mid positions: a new head of 3, its processor at the pictures' size
    torch.manual_seed(0)
    config = transformers.YolosConfig(image_size=[48, 48], patch_size=8, num_hidden_layers=2, hidden_size=32,
                                      num_attention_heads=2, intermediate_size=64, num_detection_tokens=4, num_labels=5)  # fmt: skip
    checkpoint = transformers.YolosForObjectDetection(config)
    checkpoint.save_pretrained(tmp_path / "checkpoint")
    transformers.YolosImageProcessor().save_pretrained(tmp_path / "checkpoint")
    tuned = tmp_path / "tuned"
    done = recipe("detection.py", *SHORT, "--learning-rate", "0", "--from-huggingface", str(tmp_path / "checkpoint"),
                  "--output-dir", str(tuned))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reloaded = transformers.YolosForObjectDetection.from_pretrained(tuned / "huggingface")
    assert reloaded.config.num_labels == 3 and reloaded.config.use_mid_position_embeddings
    ours, theirs = dict(reloaded.named_parameters()), dict(checkpoint.named_parameters())
    for name in ("vit.embeddings.detection_tokens", "vit.encoder.layer.1.output.dense.weight"):  # learning rate 0
        np.testing.assert_allclose(ours[name].detach().numpy(), theirs[name].detach().numpy(), atol=1e-6)
    assert ours["class_labels_classifier.layers.2.weight"].shape == (4, 32)  # a new head: 3 shapes and none
