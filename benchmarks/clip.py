"""CLIP inference on this machine: images and texts embedded per second, keras_tfm (each Keras backend) vs Hugging
Face transformers (PyTorch), on the same configuration with random weights.

    python benchmarks/clip.py

CLIP ViT-B/32's shape (image tower: 12 layers, 12 heads, 768 wide, patch 32, 224x224; text tower: 12 layers,
8 heads, 512 wide, 77 positions; projections to 512): images in batches of 8 (`embed_images`'s compiled step,
transformers' `get_image_features`), texts of 16 tokens in batches of 32 (`get_text_features`). open_clip is not
measured: it needs torchvision, whose PyPI wheel is CUDA's and does not load with the CPU build of PyTorch here.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKENDS, _best_window, main  # noqa: E402

IMAGES, TEXTS, LENGTH, WARMUP, STEPS, WINDOWS = 8, 32, 16, 2, 3, 3
VISION = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=224,
              patch_size=32)  # fmt: skip
TEXT = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8)


def hugging_face_clip():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=512)
    return transformers.CLIPModel(config).eval()


def inputs(task: str):
    import numpy as np

    rng = np.random.default_rng(0)
    if task == "images":
        return rng.random((IMAGES, 224, 224, 3), dtype="float32")
    ids = rng.integers(1, 49000, (TEXTS, LENGTH)).astype("int32")
    ids[:, -1] = 49407  # each text's end token
    return ids


def worker(contender: str, task: str) -> dict:
    x = inputs(task)
    count = IMAGES if task == "images" else TEXTS
    hf = hugging_face_clip()
    if contender == "hugging_face":
        import torch

        tensor = torch.tensor(x).permute(0, 3, 1, 2).contiguous() if task == "images" else torch.tensor(x).long()
        run = hf.get_image_features if task == "images" else hf.get_text_features

        def step(i):
            with torch.no_grad():
                run(tensor)

        return _best_window(step, WARMUP, STEPS, WINDOWS, count, 1.0)
    import keras_tfm

    model = keras_tfm.from_huggingface(hf)
    del hf
    feed = {"images": x} if task == "images" else {"token_ids": x}
    return _best_window(lambda i: model.predict_on_batch(feed), WARMUP, STEPS, WINDOWS, count, 1.0)


CONTENDERS = [(f"keras_tfm ({b})", "keras_tfm", b) for b in BACKENDS] + [
    ("hugging_face (torch)", "hugging_face", "torch")
]

if __name__ == "__main__":
    main(
        __doc__,
        __file__,
        worker,
        {
            "images": ("CLIP ViT-B/32 image embeddings, 224x224, batch 8", "images/s"),
            "texts": ("CLIP ViT-B/32 text embeddings, 16 tokens, batch 32", "texts/s"),
        },
        contenders=CONTENDERS,
        baselines={"Hugging Face": "hugging_face (torch)"},
        same_backend={"images": "hugging_face", "texts": "hugging_face"},
    )
