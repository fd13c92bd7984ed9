"""The ViT recipe: a short run on the offline digits, fine-tuning a checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest

from keras_tfm.data import load_images
from keras_tfm.errors import InputError
from tests.recipes.helpers import (
    _check_vit_written_for_transformers,
    recipe,
    recipe_args,
    recipe_function,
    saved_weight,
)


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_vit_recipe_short_run_on_the_offline_digits(tmp_path):
    out = tmp_path / "run"
    done = recipe(
        "vit.py",
        "--steps",
        "4",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "16",
        "--num-layers",
        "1",
        "--hidden-dim",
        "48",
        "--intermediate-dim",
        "96",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
        "--erasing",
        "0.5",
        "--mixup",
        "0.2",
        "--cutmix",
        "1.0",
        "--flip",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scikit-learn's bundled 8x8 handwritten digits" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 4 and 0.0 <= metrics["validation_accuracy"] <= 1.0
    flip_averaged = metrics["validation_accuracy_flip_averaged"]
    assert 0.0 <= flip_averaged <= 1.0 and f"averaged with their mirror images {flip_averaged:.4f}" in done.stdout
    for name in ("learning_curves.png", "attention_maps.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "checkpoint" / "state.json").read_text())["epoch"] == 2
    _check_vit_written_for_transformers(out, metrics)


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_vit_recipe_fine_tunes_a_hugging_face_checkpoint(tmp_path):
    """--from-huggingface: the checkpoint's architecture and weights, a head for the data's 10 classes,
    grayscale digits as RGB, resized and cropped as its image processor does; flags that would change the architecture are refused."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    checkpoint = tmp_path / "checkpoint"
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        num_hidden_layers=1,
        hidden_size=24,
        num_attention_heads=2,
        intermediate_size=48,
        num_labels=7,
    )
    hf = transformers.ViTForImageClassification(config)
    hf.save_pretrained(str(checkpoint))
    # resizes to 20 and crops the center 16 x 16, the checkpoint's size
    transformers.DeiTImageProcessor(
        size={"height": 20, "width": 20}, crop_size={"height": 16, "width": 16}
    ).save_pretrained(str(checkpoint))
    checkpoint_settings = recipe_function("vit.py", "checkpoint_settings")
    with pytest.raises(InputError, match="^patch_size: `from_huggingface` takes the architecture from the checkpoint"):
        checkpoint_settings(
            recipe_args(from_huggingface=str(checkpoint), model="vit_small_images", patch_size=8, pooling="token")
        )

    out = tmp_path / "run"
    # Learning rate 0: the weights stay the checkpoint's, to be compared below.
    done = recipe(
        "vit.py",
        "--from-huggingface",
        str(checkpoint),
        "--steps",
        "2",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "16",
        "--learning-rate",
        "0",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with torch.device("meta"):
        ten_classes = transformers.ViTForImageClassification(
            transformers.ViTConfig(
                **{**{k: v for k, v in config.to_dict().items() if k not in ("id2label", "label2id")}, "num_labels": 10}
            )
        )
    assert f"{sum(p.numel() for p in ten_classes.parameters()):,} parameters" in done.stdout
    assert (
        "Images: 8x8x3, to the model at 16x16 through the checkpoint's image processor: resize to 20x20 (bicubic), "
        "center crop 16x16, rescale, normalize" in " ".join(done.stdout.split())  # the log wraps long lines
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == f"from_huggingface {checkpoint}" and 0.0 <= metrics["validation_accuracy"] <= 1.0
    patch_kernel = hf.state_dict()["vit.embeddings.patch_embeddings.projection.weight"].numpy().transpose(2, 3, 1, 0)
    np.testing.assert_allclose(saved_weight(out / "checkpoint", patch_kernel.shape), patch_kernel, atol=1e-6, rtol=0)
    # written back for transformers with the checkpoint's processor, grayscale made RGB, and the data's classes
    processor = json.loads((out / "huggingface" / "preprocessor_config.json").read_text())
    assert processor["image_processor_type"] == "DeiTImageProcessor" and processor["do_convert_rgb"]
    assert processor["size"] == {"height": 20, "width": 20} and processor["crop_size"] == {"height": 16, "width": 16}
    tuned = transformers.AutoModelForImageClassification.from_pretrained(out / "huggingface")
    assert tuned.config.image_size == 16 and tuned.config.id2label == {i: str(i) for i in range(10)}
    # the recorded accuracy is the trained model's on what transformers' processor makes of the test images
    test_images, test_labels = load_images(None, None, None, log=lambda line: None).test
    pixels = transformers.AutoImageProcessor.from_pretrained(out / "huggingface")(
        list(np.repeat(test_images, 3, axis=-1)), return_tensors="pt"
    )["pixel_values"]
    with torch.no_grad():
        predicted = tuned(pixels).logits.numpy().argmax(-1)
    assert metrics["validation_accuracy"] == pytest.approx(np.mean(predicted == test_labels), abs=1e-6)
    gray = np.arange(64, dtype="uint8").reshape(8, 8, 1) * 4
    assert transformers.AutoImageProcessor.from_pretrained(out / "huggingface")(gray, return_tensors="np")[
        "pixel_values"
    ].shape == (1, 3, 16, 16)
