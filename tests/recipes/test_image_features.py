"""The image-features recipe: frozen features scored by a linear probe and k-NN beside raw pixels, drawn as
colours; a checkpoint's backbone with its processor."""

from __future__ import annotations

import json

import pytest

from tests.recipes.helpers import recipe


@pytest.mark.backend_independent
def test_features_of_a_random_backbone_and_of_a_checkpoint_are_scored_and_drawn(tmp_path):
    """On the offline digits: every score well above chance (0.1), written with the picture. A DINOv2
    checkpoint (random weights, its processor resizing the 8x8 digits to 28) goes through the same steps."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("sklearn")
    flags = ["--train-examples", "600", "--test-examples", "300", "--k", "5"]
    done = recipe("image_features.py", *flags, "--output-dir", str(tmp_path / "random"))
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = json.loads((tmp_path / "random" / "metrics.json").read_text())
    for name in ("features", "pixels"):
        assert metrics[name]["linear_probe"] > 0.5 and metrics[name]["knn"] > 0.5, metrics
    assert (tmp_path / "random" / "patch_features.png").read_bytes()[:4] == b"\x89PNG"
    config = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2,
                                       image_size=28, patch_size=7)  # fmt: skip
    transformers.Dinov2Model(config).save_pretrained(tmp_path / "dinov2")
    transformers.BitImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}).save_pretrained(
        tmp_path / "dinov2"
    )
    done = recipe("image_features.py", *flags, "--pooling", "mean", "--from-huggingface", str(tmp_path / "dinov2"),
                  "--output-dir", str(tmp_path / "dinov2-run"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = json.loads((tmp_path / "dinov2-run" / "metrics.json").read_text())
    assert metrics["backbone"].endswith("dinov2") and metrics["features"]["knn"] > 0.3, metrics
    refused = recipe("image_features.py", "--k", "0", "--output-dir", str(tmp_path / "bad"))
    assert refused.returncode == 2 and "--k" in refused.stderr
