"""The masked-autoencoder recipe: a small ViTMAE pretrains on the offline digits without their labels, scores a
linear probe on its features beside a random encoder's, draws its reconstructions, and writes a checkpoint
transformers loads (resuming is the shared runtime's: tests/training)."""

from __future__ import annotations

import json

import pytest

from tests.recipes.helpers import recipe


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_mae_recipe_pretrains_probes_and_draws(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("sklearn")
    out = tmp_path / "run"
    done = recipe(
        "mae.py", "--epochs", "3", "--probe-examples", "600", "--test-examples", "300", "--output-dir", str(out)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["validation_loss"] < 0.8, metrics  # normalized patches predicted as zeros: about 1
    assert min(metrics["probe_accuracy_pretrained"], metrics["probe_accuracy_random"]) > 0.5, metrics  # chance 0.1
    assert (out / "reconstructions.png").read_bytes()[:4] == b"\x89PNG"
    hf = transformers.ViTMAEForPreTraining.from_pretrained(out / "huggingface")
    assert sum(p.numel() for p in hf.parameters()) == metrics["parameters"]
    refused = recipe("mae.py", "--mask-ratio", "1.5", "--output-dir", str(tmp_path / "bad"))
    assert refused.returncode == 2 and "--mask-ratio" in refused.stderr
