"""Image features as a product: a frozen backbone's features scored by a linear probe and a k-NN classifier,
and drawn (each image's patch features as colours, their first three principal components).

Data: --data PATH, as recipes/vit.py reads it (an IDX directory such as ../shared/data/fashion-mnist, an
.npz file or an image folder); the offline default is scikit-learn's bundled 8x8 digits.
Backbone: --from-huggingface DIR (a checkpoint directory or Hub id: DINOv2, DeiT, ViT; its image processor
prepares the images), else a small ViT of random weights (what a real backbone must beat). The probe and the
k-NN classifier are scikit-learn's (logistic regression; cosine k-NN, as the DINOv2 paper scores features);
raw pixels are scored the same way beside them. Writes metrics.json and patch_features.png in --output-dir.

    python recipes/image_features.py --data ../shared/data/fashion-mnist
    python recipes/image_features.py --data ../shared/data/fashion-mnist --from-huggingface facebook/dinov2-small
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np


def main() -> None:
    from keras_tfm.data import load_images
    from keras_tfm.training.probes import probe_scores
    from keras_tfm.viz import plot_patch_features

    args = flags(model_sizes()).parse_args()
    data = load_images(args.data, log=print)
    (train_x, train_y), (test_x, test_y) = (_subset(*split, count) for split, count in
                                            ((data.train, args.train_examples), (data.test, args.test_examples)))  # fmt: skip
    model = backbone(args, train_x.shape[1])
    features = [
        model.embed_images(list(x), pooling=args.pooling, batch_size=args.batch_size) for x in (train_x, test_x)
    ]
    pixels = [x.reshape(len(x), -1).astype("float32") / 255.0 for x in (train_x, test_x)]
    metrics = {"data": data.source, "backbone": args.from_huggingface or "a random ViT", "pooling": args.pooling,
               "features": probe_scores(*features, train_y, test_y, args.k),
               "pixels": probe_scores(*pixels, train_y, test_y, args.k)}  # fmt: skip
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "metrics.json"), "w") as file:
        json.dump(metrics, file, indent=2)
    patches = model.embed_images(list(test_x[:6]), pooling="patches")
    plot_patch_features(test_x[:6], patches, os.path.join(args.output_dir, "patch_features.png"))
    for name in ("features", "pixels"):
        print(f"{name}: linear probe {metrics[name]['linear_probe']:.3f}, {args.k}-NN {metrics[name]['knn']:.3f}")


def backbone(args: argparse.Namespace, side: int):
    """The checkpoint's model (its processor attached), or a small random ViT for images of `side` pixels."""
    import keras

    import keras_tfm
    from keras_tfm.data import ImageProcessor

    if args.from_huggingface:
        return keras_tfm.from_huggingface(args.from_huggingface)
    keras.utils.set_random_seed(args.seed)
    patch = 4 if side % 4 == 0 else 1
    model = keras_tfm.ViT(image_size=side, patch_size=patch, num_layers=2, num_heads=4, hidden_dim=64,
                          include_top=False, layer_scale_init=1.0)  # fmt: skip
    model.image_processor = ImageProcessor(size={"height": side, "width": side})
    return model


def _subset(images: np.ndarray, labels: np.ndarray, count: int):
    return images[:count], labels[:count]


def model_sizes() -> dict:
    """No named sizes: the backbone is a checkpoint's, or the small random one."""
    return {}


def flags(sizes: dict | None = None) -> argparse.ArgumentParser:
    from keras_tfm.training import POSITIVE

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="an IDX directory, an .npz file or an image folder (default: 8x8 digits)")
    parser.add_argument("--from-huggingface", help="a checkpoint directory or Hub id whose features to score")
    parser.add_argument("--pooling", choices=("token", "mean"), default="token", help="the image's vector")
    parser.add_argument("--train-examples", type=POSITIVE, default=5000, help="images the probe is fitted on")
    parser.add_argument("--test-examples", type=POSITIVE, default=2000, help="images it is scored on")
    parser.add_argument("--k", type=POSITIVE, default=20, help="neighbours of the k-NN classifier")
    parser.add_argument("--batch-size", type=POSITIVE, default=64)
    parser.add_argument("--seed", type=int, default=0, help="of the random backbone")
    parser.add_argument("--output-dir", default="runs/image_features")
    return parser


if __name__ == "__main__":
    from keras_tfm.training import run_main

    run_main(main)
