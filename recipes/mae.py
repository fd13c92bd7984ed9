"""Pretrain a masked autoencoder on unlabelled images, then show what its features are worth: a linear probe on
the pretrained encoder's features against the same probe on the same encoder randomly initialized.

Data: --data PATH, as recipes/vit.py reads it (an IDX directory such as ../shared/data/fashion-mnist, an .npz
file or an image folder); the offline default is scikit-learn's bundled 8x8 digits. Pretraining reads the
training images alone; the labels are for the probe only (scikit-learn's logistic regression on the mean patch
feature, as recipes/image_features.py scores features), fitted on --probe-examples training images and scored on
held-out test images.

The model is a ViTMAE: a small ViT encoder that sees a quarter of the patches (--mask-ratio) and a one-block
decoder that predicts the pixels of the rest, each hidden patch normalized by its own mean and variance
(--normalize-targets, on by default, as the paper's best). Leaves checkpoints, log.csv, metrics.json,
learning_curves.png and reconstructions.png (images, what the encoder saw, what the decoder made) in --output-dir;
rerunning resumes.

    python recipes/mae.py --data ../shared/data/fashion-mnist --epochs 10
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    from keras_tfm import training
    from keras_tfm.data import EpochBatches, load_images

    sizes = model_sizes()
    args = flags(sizes).parse_args()
    config = training.training_config(args)
    training.setup(config)
    data = load_images(args.data, args.dataset, args.data_dir, log=training.log)
    (train_x, train_y), (test_x, test_y) = data.train, data.test
    rows = EpochBatches(len(train_x), args.batch_size, args.seed)
    held_out = pixels(test_x[: args.validation_examples])
    result = training.train(
        config,
        build_model=lambda: sizes[args.model](args, train_x.shape[1], train_x.shape[-1]),
        train_batch=lambda epoch, step: (pixels(train_x[rows(epoch, step)]), np.zeros(args.batch_size, "float32")),
        steps_per_pass=len(train_x) // args.batch_size,
        validation_data=(held_out, np.zeros(len(held_out), "float32")),
        loss=None,  # the model's own: ViTMAE.compute_loss
        evaluate=lambda model: probe_scores(model, args, (train_x, train_y), (test_x, test_y)),
        settings=training.recipe_settings(args),
    )
    metrics = result.metrics
    print(f"linear probe on {min(args.test_examples, len(test_y)):,} held-out images: pretrained encoder "
          f"{metrics['probe_accuracy_pretrained']:.4f}, random encoder {metrics['probe_accuracy_random']:.4f}")  # fmt: skip
    if result.history:  # the writer's process
        draw_reconstructions(result.model, held_out[:6], f"{args.output_dir}/reconstructions.png")


def model_sizes() -> dict:
    """The recipe's MAE sizes: each `(args, image side, channels) -> ViTMAE`."""
    return {"mae_small_images": small_mae}


def flags(sizes: dict):
    from keras_tfm import training

    parser = training.recipe_parser(__doc__, sizes, "mae_small_images", "runs/mae")
    parser.set_defaults(batch_size=128, learning_rate=1.5e-3, weight_decay=0.05, epochs=10)
    recipe = parser.add_argument_group("masked autoencoder")
    recipe.add_argument("--mask-ratio", type=training.FRACTION, default=0.75,
                        help="the share of patches hidden (default: %(default)s)")  # fmt: skip
    recipe.add_argument("--normalize-targets", action=argparse.BooleanOptionalAction, default=True,
                        help="normalize each hidden patch's pixels before the loss (default: on)")  # fmt: skip
    recipe.add_argument("--validation-examples", type=training.POSITIVE, default=512,
                        help="test images the reconstruction loss is validated on (default: %(default)s)")  # fmt: skip
    recipe.add_argument("--probe-examples", type=training.POSITIVE, default=5000,
                        help="training images the linear probe is fitted on (default: %(default)s)")  # fmt: skip
    recipe.add_argument("--test-examples", type=training.POSITIVE, default=2000,
                        help="test images the probe is scored on (default: %(default)s)")  # fmt: skip
    return parser


def pixels(images: np.ndarray) -> np.ndarray:
    return images.astype("float32") / 255.0


def small_mae(args, side: int, channels: int):
    """An encoder of 4 layers, 4 heads, 96 wide (or --num-layers, --num-heads, --hidden-dim, --intermediate-dim),
    patches of 4 pixels (or 2), and a decoder of one block 64 wide."""
    import keras_tfm
    from keras_tfm.data import DataError, ImageProcessor

    for name in ("dropout", "max_length"):
        if getattr(args, name, None) is not None:
            raise DataError("the recipe's masked autoencoder has no such setting.", argument=name)
    encoder = dict(num_layers=4, num_heads=4, hidden_dim=96)
    encoder.update({name: getattr(args, name) for name in ("num_layers", "num_heads", "hidden_dim", "intermediate_dim")
                    if getattr(args, name, None) is not None})  # fmt: skip
    vit = keras_tfm.ViT(image_size=side, patch_size=4 if side % 4 == 0 else 2, num_channels=channels,
                        include_top=False, name="encoder", **encoder)  # fmt: skip
    model = keras_tfm.ViTMAE(vit, decoder_dim=64, decoder_layers=1, decoder_heads=4, decoder_intermediate_dim=256,
                             mask_ratio=args.mask_ratio, normalize_targets=args.normalize_targets, seed=args.seed)  # fmt: skip
    # what `pixels` does, for the checkpoint written after training
    model.image_processor = ImageProcessor(
        size={"height": side, "width": side}, do_normalize=False, do_convert_rgb=channels == 3
    )
    return model


def probe_scores(model, args, train: tuple, test: tuple) -> dict:
    """Test accuracy of a linear probe on the pretrained encoder's mean patch features, and on a fresh encoder's."""
    import keras

    from keras_tfm.models.vit import ViT
    from keras_tfm.training.probes import probe_scores

    (train_x, train_y), (test_x, test_y) = ((x[:count], y[:count]) for (x, y), count in
                                            ((train, args.probe_examples), (test, args.test_examples)))  # fmt: skip
    keras.utils.set_random_seed(args.seed + 1)
    fresh = ViT.from_config(model.encoder.get_config())
    results = {}
    for name, encoder in (("pretrained", model.encoder), ("random", fresh)):
        train_f, test_f = (mean_patch_features(encoder, pixels(x), args.batch_size) for x in (train_x, test_x))
        results[f"probe_accuracy_{name}"] = probe_scores(train_f, test_f, train_y, test_y)["linear_probe"]
    return results


def mean_patch_features(encoder, images: np.ndarray, batch_size: int) -> np.ndarray:
    from keras import ops

    parts = [ops.convert_to_numpy(encoder.features(ops.convert_to_tensor(images[i : i + batch_size])))[:, 1:].mean(1)
             for i in range(0, len(images), batch_size)]  # fmt: skip
    return np.concatenate(parts)


def draw_reconstructions(model, images: np.ndarray, path: str) -> None:
    """Rows: the images, what the encoder saw, what the decoder made of the hidden patches (pasted in)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pictures = model.reconstruct(images, noise=np.random.default_rng(0).random((len(images), model.num_patches)))
    seen = np.where(pictures["hidden"], 0.5, pictures["masked"])  # the hidden patches grey
    rows = [("images", images), ("seen", seen), ("reconstructed", pictures["pasted"])]
    figure, axes = plt.subplots(3, len(images), figsize=(1.6 * len(images), 5))
    for row, (title, batch) in enumerate(rows):
        for column, image in enumerate(batch):
            axes[row, column].imshow(np.clip(image.squeeze(-1) if image.shape[-1] == 1 else image, 0, 1), cmap="gray")
            axes[row, column].axis("off")
        axes[row, 0].set_title(title, loc="left", fontsize=9)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


if __name__ == "__main__":
    from keras_tfm.training import run_main

    run_main(main)
