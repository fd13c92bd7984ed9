"""SegFormer on this machine: images segmented per second, and training steps, keras_tfm (each Keras backend) vs
Hugging Face transformers (PyTorch) and keras-hub (each backend), on the same configuration with random weights.

    python benchmarks/segformer.py

SegFormer-B0's shape (stages 32/64/160/256 wide, 2 blocks each, keys and values reduced 8/4/2/1 times, decoder
256 wide, ADE20k's 150 classes). Inference: 512x512 images in batches of 2 (keras_tfm's and keras-hub's compiled
`predict_on_batch`, transformers' forward under `no_grad`). Training: 256x256 images in batches of 4 with AdamW,
each with its own loss on its own logits: keras_tfm's `SegmentationCrossEntropy` (the logits at a quarter of the
image resized to the labels), transformers' loss (the same), keras-hub's sparse cross-entropy on its logits (which
keras-hub's segmenter upsamples to the image's size).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import _best_window, hugging_face_image_throughput, keras_train_throughput, main  # noqa: E402

INFERENCE_BATCH, INFERENCE_SIDE, TRAIN_BATCH, TRAIN_SIDE, CLASSES = 2, 512, 4, 256, 150
WARMUP, STEPS, WINDOWS = 2, 3, 3


def hugging_face_segformer():
    import torch
    import transformers

    torch.manual_seed(0)
    return transformers.SegformerForSemanticSegmentation(transformers.SegformerConfig(num_labels=CLASSES))


def keras_hub_segformer(side: int):
    import keras_hub

    encoder = keras_hub.models.MiTBackbone(
        layerwise_depths=[2, 2, 2, 2], num_layers=4, layerwise_num_heads=[1, 2, 5, 8], layerwise_sr_ratios=[8, 4, 2, 1],
        max_drop_path_rate=0.1, layerwise_patch_sizes=[7, 3, 3, 3], layerwise_strides=[4, 2, 2, 2],
        hidden_dims=[32, 64, 160, 256], image_shape=(side, side, 3),  # its MiT needs the size
    )  # fmt: skip
    backbone = keras_hub.models.SegFormerBackbone(image_encoder=encoder, projection_filters=256)
    return keras_hub.models.SegFormerImageSegmenter(backbone=backbone, num_classes=CLASSES)


def data(task: str):
    import numpy as np

    rng = np.random.default_rng(0)
    side, batch = (INFERENCE_SIDE, INFERENCE_BATCH) if task == "inference" else (TRAIN_SIDE, TRAIN_BATCH * STEPS)
    images = rng.random((batch, side, side, 3), dtype="float32")
    return images, rng.integers(0, CLASSES, (batch, side, side)).astype("int32")


def worker(contender: str, task: str) -> dict:
    images, labels = data(task)
    if contender == "hugging_face":
        return _hugging_face(task, images, labels)
    if contender == "keras_hub":
        model = keras_hub_segformer(images.shape[1])
        loss = None
    else:
        import keras_tfm
        from keras_tfm.convert import from_huggingface

        model = from_huggingface(hugging_face_segformer())
        loss = keras_tfm.SegmentationCrossEntropy(ignore_class=None)
    if task == "inference":
        return _best_window(lambda i: model.predict_on_batch(images), WARMUP, STEPS, WINDOWS, len(images), 1.0)
    # no metrics (keras-hub's default accuracy takes one-hot labels); keras-hub's logits at the image's size
    return keras_train_throughput(model, images, labels, TRAIN_BATCH, WARMUP, STEPS, loss=loss, metrics=[])


def _hugging_face(task: str, images, labels) -> dict:
    import torch

    return hugging_face_image_throughput(hugging_face_segformer(), images, torch.tensor(labels).long(), task,
                                         TRAIN_BATCH, WARMUP, STEPS, WINDOWS)  # fmt: skip


if __name__ == "__main__":
    main(
        __doc__,
        __file__,
        worker,
        {
            "inference": ("SegFormer-B0 segmentation, 512x512, batch 2", "images/s"),
            "training": ("SegFormer-B0 training, 256x256, batch 4, AdamW", "images/s"),
        },
    )
