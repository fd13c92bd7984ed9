"""ViT training speed on this machine: images/s, keras_tfm vs keras-hub (each Keras backend) vs
Hugging Face transformers (PyTorch), same configuration.

    python benchmarks/vit.py

Configuration: 32x32x3 images, patch 4, 6 layers, 3 heads, 192 wide, MLP 768, batch 32,
10 classes, class-token pooling, AdamW, random images.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import keras_train_throughput, main, torch_train_throughput  # noqa: E402

CONFIG = dict(
    image_size=32, patch_size=4, num_layers=6, num_heads=3, hidden_dim=192, intermediate_dim=768, num_classes=10
)
BATCH, WARMUP_STEPS, STEPS, WINDOWS = 32, 5, 15, 4  # STEPS: per timed window


def data():
    import numpy as np

    rng = np.random.default_rng(0)
    n = BATCH * (WARMUP_STEPS + STEPS)
    return rng.random((n, 32, 32, 3), dtype="float32"), rng.integers(0, 10, size=(n,)).astype("int32")


def worker(contender: str, task: str = "train") -> dict:
    images, labels = data()
    if contender == "keras_tfm":
        import keras_tfm

        model = keras_tfm.ViT(**CONFIG)
        return keras_train_throughput(model, images, labels, BATCH, WARMUP_STEPS, STEPS, WINDOWS)
    if contender == "keras_hub":
        import keras_hub

        backbone = keras_hub.models.ViTBackbone(
            image_shape=(32, 32, 3),
            patch_size=4,
            num_layers=6,
            num_heads=3,
            hidden_dim=192,
            mlp_dim=768,
        )
        model = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=10, preprocessor=None)
        return keras_train_throughput(model, images, labels, BATCH, WARMUP_STEPS, STEPS, WINDOWS)
    if contender == "hugging_face":
        import torch
        import transformers

        config = transformers.ViTConfig(
            image_size=32,
            patch_size=4,
            num_hidden_layers=6,
            num_attention_heads=3,
            hidden_size=192,
            intermediate_size=768,
            num_labels=10,
        )
        model = transformers.ViTForImageClassification(config)
        x = torch.tensor(images).permute(0, 3, 1, 2).contiguous()
        y = torch.tensor(labels, dtype=torch.long)
        batches = [(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(len(x) // BATCH)]

        def loss_fn(model, inputs, targets):
            return torch.nn.functional.cross_entropy(model(inputs).logits, targets)

        return torch_train_throughput(model, loss_fn, batches, WARMUP_STEPS, STEPS, WINDOWS)
    raise ValueError(contender)


if __name__ == "__main__":
    main(
        __doc__,
        __file__,
        worker,
        {
            "train": (
                "ViT training, 32x32x3, patch 4, 6 layers / 3 heads / 192 wide, MLP 768, batch 32",
                "train images/s",
            )
        },
    )
