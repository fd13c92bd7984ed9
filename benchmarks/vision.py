"""Vision inference on this machine: images/s for DINOv2 features and a distilled DeiT's classification, keras_tfm
(each Keras backend) vs keras-hub (each backend) vs Hugging Face transformers (PyTorch), on the same
configuration, random weights and images; and the image processor's images/s against transformers' (Pillow
backend), on a real photo.

    python benchmarks/vision.py

DINOv2: ViT-S/14 (12 layers, 6 heads, 384 wide, MLP 1536, layer scale), 224x224 images, batch 8, the last
layer's normalized tokens. DeiT: DeiT-Ti distilled (12 layers, 3 heads, 192 wide), 224x224, batch 8, the two
heads' averaged logits. Processor: DINOv2's (shortest edge 256, bicubic, center crop 224, ImageNet mean/std) on
matplotlib's 512x600 sample photo, 32 at a time.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKENDS, _best_window, main  # noqa: E402

BATCH, WARMUP, STEPS, WINDOWS = 8, 2, 3, 3
DINOV2 = dict(num_layers=12, num_heads=6, hidden_dim=384, intermediate_dim=1536, patch_size=14)
DEIT = dict(num_layers=12, num_heads=3, hidden_dim=192, intermediate_dim=768, patch_size=16)


def images(side: int = 224):
    import numpy as np

    return np.random.default_rng(0).random((BATCH, side, side, 3), dtype="float32")


def keras_model(contender: str, task: str):
    if contender == "keras_tfm":
        import keras_tfm

        if task == "dinov2":
            return keras_tfm.dinov2_small(image_size=224)
        return keras_tfm.deit_tiny_distilled()
    import keras_hub

    if task == "dinov2":
        return keras_hub.models.DINOV2Backbone(**DINOV2, image_shape=(224, 224, 3),
                                               position_embedding_shape=(224, 224, 3), apply_layernorm=True)  # fmt: skip
    backbone = keras_hub.models.DeiTBackbone(**DEIT, image_shape=(224, 224, 3))
    return keras_hub.models.DeiTImageClassifier(backbone=backbone, num_classes=1000, preprocessor=None)


def torch_model(task: str):
    import transformers

    if task == "dinov2":
        config = transformers.Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                                           image_size=224, patch_size=14)  # fmt: skip
        return transformers.Dinov2Model(config).eval()
    config = transformers.DeiTConfig(hidden_size=192, num_hidden_layers=12, num_attention_heads=3,
                                     intermediate_size=768, num_labels=1000)  # fmt: skip
    return transformers.DeiTForImageClassificationWithTeacher(config).eval()


def processor_throughput(contender: str) -> dict:
    import matplotlib
    from PIL import Image

    photo = Image.open(f"{matplotlib.get_data_path()}/sample_data/grace_hopper.jpg")
    photo.load()
    batch = [photo] * 32
    settings = dict(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, do_center_crop=True,
                    resample=3, image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))  # fmt: skip
    if contender == "keras_tfm":
        from keras_tfm.data import ImageProcessor

        processor = ImageProcessor(**settings)
        run = processor
    else:
        import transformers

        processor = transformers.BitImageProcessor(**settings)
        run = lambda images: processor(images, return_tensors="np")  # noqa: E731
    return _best_window(lambda i: run(batch), WARMUP, STEPS, WINDOWS, len(batch), 1.0)


def worker(contender: str, task: str) -> dict:
    if task == "processor":
        return processor_throughput(contender)
    x = images()
    if contender == "hugging_face":
        import torch

        model = torch_model(task)
        pixels = torch.tensor(x).permute(0, 3, 1, 2).contiguous()

        def step(i):
            with torch.no_grad():
                model(pixels)

        return _best_window(step, WARMUP, STEPS, WINDOWS, BATCH, 1.0)
    model = keras_model(contender, task)
    return _best_window(lambda i: model.predict_on_batch(x), WARMUP, STEPS, WINDOWS, BATCH, 1.0)


MODELS = [(f"{c} ({b})", c, b) for c in ("keras_tfm", "keras_hub") for b in BACKENDS]
MODELS.append(("hugging_face (torch)", "hugging_face", "torch"))
PROCESSORS = [("keras_tfm (Pillow)", "keras_tfm", "jax"), ("hugging_face (Pillow)", "hugging_face", "torch")]

if __name__ == "__main__":
    main(
        __doc__,
        __file__,
        worker,
        {
            "dinov2": ("DINOv2 ViT-S/14 features, 224x224, batch 8", "images/s"),
            "deit": ("DeiT-Ti distilled classification, 224x224, batch 8", "images/s"),
            "processor": ("DINOv2's image processor on a 512x600 photo, 32 at a time", "images/s"),
        },
        contenders=MODELS,
        task_contenders={"processor": (PROCESSORS, {"Hugging Face": "hugging_face (Pillow)"})},
    )
