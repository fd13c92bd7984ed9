"""The CLIP recipe: a small CLIP learns the offline digits from captions alone and classifies held-out digits
zero-shot; its checkpoint is one transformers loads."""

from __future__ import annotations

import json

import pytest

from tests.recipes.helpers import recipe


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_clip_recipe_learns_captions_and_classifies_zero_shot(tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "run"
    done = recipe("clip.py", "--epochs", "6", "--test-examples", "360", "--output-dir", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["zero_shot_accuracy"] > 0.5, metrics  # chance: 0.1 (ten digits)
    assert (
        metrics["retrieval_precision_at_5"] > 0.4
        and f"zero-shot accuracy {metrics['zero_shot_accuracy']:.4f}" in done.stdout
    )
    assert json.loads((out / "checkpoint" / "state.json").read_text())["epoch"] == 6
    assert (out / "learning_curves.png").read_bytes()[:4] == b"\x89PNG"
    hf = transformers.CLIPModel.from_pretrained(out / "huggingface")  # written with its tokenizer for transformers
    assert sum(p.numel() for p in hf.parameters()) == metrics["parameters"]
    refused = recipe("clip.py", "--embedding-dim", "0", "--output-dir", str(tmp_path / "bad"))
    assert refused.returncode == 2 and "--embedding-dim" in refused.stderr
    refused = recipe("clip.py", "--max-length", "64", "--output-dir", str(tmp_path / "bad2"))
    assert refused.returncode != 0 and "--max-length" in refused.stdout + refused.stderr


@pytest.mark.backend_independent
def test_clip_recipe_fine_tunes_a_checkpoint(tmp_path):
    """--from-huggingface: the checkpoint's towers, tokenizer and image processor (the 8x8 digits resized to its
    16 pixels); its size cannot be changed by flags."""
    transformers = pytest.importorskip("transformers")
    from tests.convert.test_clip import write_clip_checkpoint

    write_clip_checkpoint(tmp_path / "checkpoint")
    out = tmp_path / "run"
    flags = ["--from-huggingface", str(tmp_path / "checkpoint"), "--epochs", "1", "--test-examples", "50"]
    done = recipe("clip.py", *flags, "--output-dir", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (
        metrics["model"] == f"from_huggingface {tmp_path / 'checkpoint'}" and 0.0 <= metrics["zero_shot_accuracy"] <= 1
    )
    tuned = transformers.CLIPModel.from_pretrained(out / "huggingface")
    assert tuned.config.projection_dim == 8 and (out / "huggingface" / "preprocessor_config.json").is_file()
    refused = recipe("clip.py", *flags, "--embedding-dim", "32", "--output-dir", str(tmp_path / "bad"))
    assert refused.returncode != 0 and "takes the model from the checkpoint" in refused.stdout + refused.stderr
