"""YOLOS on this machine: images searched for objects per second, and training steps, keras_tfm (each Keras backend)
vs Hugging Face transformers (PyTorch), on the same configuration with random weights. keras-hub has no YOLOS.

    python benchmarks/yolos.py

YOLOS-Tiny's shape (12 layers, 3 heads, 192 wide, 100 detection tokens, no mid positions, COCO's 91 classes).
Inference: 512x512 images (1,024 patches) in batches of 2 (keras_tfm's compiled `predict_on_batch`, transformers'
forward under `no_grad`). Training: 256x256 images in batches of 4, three objects each, with AdamW and the
set-prediction loss, its Hungarian matching by SciPy in both (keras_tfm's step: XLA on JAX, a graph on
TensorFlow, eager on PyTorch).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKENDS, _best_window, hugging_face_image_throughput, keras_train_throughput, main  # noqa: E402

INFERENCE_BATCH, INFERENCE_SIDE, TRAIN_BATCH, TRAIN_SIDE, OBJECTS = 2, 512, 4, 256, 3
WARMUP, STEPS, WINDOWS = 2, 3, 3
CONTENDERS = [(f"keras_tfm ({backend})", "keras_tfm", backend) for backend in BACKENDS]
CONTENDERS.append(("hugging_face (torch)", "hugging_face", "torch"))


def hugging_face_yolos():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.YolosConfig(hidden_size=192, num_attention_heads=3, intermediate_size=768,
                                      image_size=[800, 1333], use_mid_position_embeddings=False, num_labels=91)  # fmt: skip
    return transformers.YolosForObjectDetection(config)


def data(task: str):
    import numpy as np

    rng = np.random.default_rng(0)
    side, batch = (INFERENCE_SIDE, INFERENCE_BATCH) if task == "inference" else (TRAIN_SIDE, TRAIN_BATCH * STEPS)
    images = rng.random((batch, side, side, 3), dtype="float32")
    labels = rng.integers(0, 91, (batch, OBJECTS)).astype("int32")
    boxes = np.concatenate([rng.uniform(0.3, 0.7, (batch, OBJECTS, 2)), rng.uniform(0.1, 0.3, (batch, OBJECTS, 2))], -1)
    return images, {"labels": labels, "boxes": boxes.astype("float32")}


def worker(contender: str, task: str) -> dict:
    images, objects = data(task)
    if contender == "hugging_face":
        return _hugging_face(task, images, objects)
    from keras_tfm.convert import from_huggingface

    model = from_huggingface(hugging_face_yolos())
    if task == "inference":
        return _best_window(lambda i: model.predict_on_batch(images), WARMUP, STEPS, WINDOWS, len(images), 1.0)
    return keras_train_throughput(model, images, objects, TRAIN_BATCH, WARMUP, STEPS, metrics=[])


def _hugging_face(task: str, images, objects) -> dict:
    import torch

    targets = [{"class_labels": torch.tensor(labels).long(), "boxes": torch.tensor(boxes)}
               for labels, boxes in zip(objects["labels"], objects["boxes"])]  # fmt: skip
    return hugging_face_image_throughput(hugging_face_yolos(), images, targets, task, TRAIN_BATCH, WARMUP, STEPS,
                                         WINDOWS)  # fmt: skip


if __name__ == "__main__":
    main(
        __doc__,
        __file__,
        worker,
        {
            "inference": ("YOLOS-Tiny detection, 512x512, batch 2", "images/s"),
            "training": ("YOLOS-Tiny training, 256x256, batch 4, AdamW", "images/s"),
        },
        contenders=CONTENDERS,
        baselines={"Hugging Face": "hugging_face (torch)"},
    )
