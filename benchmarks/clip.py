"""CLIP and SigLIP inference on this machine: images and texts embedded per second, keras_tfm (each Keras backend)
vs Hugging Face transformers (PyTorch), on the same configuration with random weights.

    python benchmarks/clip.py

CLIP ViT-B/32's shape (image tower: 12 layers, 12 heads, 768 wide, patch 32, 224x224; text tower: 12 layers,
8 heads, 512 wide, 77 positions; projections to 512): images in batches of 8 (`embed_images`'s compiled step,
transformers' `get_image_features`), texts of 16 tokens in batches of 32 (`get_text_features`). SigLIP B/16's
shape (both towers 12 layers, 12 heads, 768 wide; 16-pixel patches of 224x224 images, 196 tokens pooled by
attention; texts filled to 64 places, as its pipeline pads them): the same batches. open_clip is not
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
SIGLIP = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12)


def hugging_face_clip():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=512)
    return transformers.CLIPModel(config).eval()


def hugging_face_siglip():
    import torch
    import transformers

    torch.manual_seed(0)
    vision = dict(SIGLIP, image_size=224, patch_size=16)
    config = transformers.SiglipConfig(text_config=dict(SIGLIP, vocab_size=32000), vision_config=vision)
    return transformers.SiglipModel(config).eval()


def inputs(task: str):
    import numpy as np

    rng = np.random.default_rng(0)
    if task.endswith("images"):
        return rng.random((IMAGES, 224, 224, 3), dtype="float32")
    if task == "siglip_texts":  # words, then the end id filling the 64 places
        ids = np.ones((TEXTS, 64), "int32")
        ids[:, : LENGTH - 1] = rng.integers(2, 32000, (TEXTS, LENGTH - 1))
        return ids
    ids = rng.integers(1, 49000, (TEXTS, LENGTH)).astype("int32")
    ids[:, -1] = 49407  # each text's end token
    return ids


def worker(contender: str, task: str) -> dict:
    x = inputs(task)
    images = task.endswith("images")
    count = IMAGES if images else TEXTS
    hf = hugging_face_siglip() if task.startswith("siglip") else hugging_face_clip()
    if contender == "hugging_face":
        import torch

        tensor = torch.tensor(x).permute(0, 3, 1, 2).contiguous() if images else torch.tensor(x).long()
        run = hf.get_image_features if images else hf.get_text_features

        def step(i):
            with torch.no_grad():
                run(tensor)

        return _best_window(step, WARMUP, STEPS, WINDOWS, count, 1.0)
    import keras_tfm

    model = keras_tfm.from_huggingface(hf)
    del hf
    feed = {"images": x} if images else {"token_ids": x}
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
            "siglip_images": ("SigLIP B/16 image embeddings, 224x224, batch 8", "images/s"),
            "siglip_texts": ("SigLIP B/16 text embeddings, 64 places, batch 32", "texts/s"),
        },
        contenders=CONTENDERS,
        baselines={"Hugging Face": "hugging_face (torch)"},
        same_backend={task: "hugging_face" for task in ("images", "texts", "siglip_images", "siglip_texts")},
    )
