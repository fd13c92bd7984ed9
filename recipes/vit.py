"""Train a Vision Transformer image classifier, then draw what it attends to.

Data (one of):
  --data PATH       a directory of IDX files (MNIST/Fashion-MNIST layout, e.g. fashion-mnist holding the
                    four .gz files of https://github.com/zalandoresearch/fashion-mnist, data/fashion),
                    an .npz file with x_train, y_train, x_test, y_test, or an image folder PATH/<class>/*.png
                    (or PATH/train/<class>/... and PATH/test/<class>/...); photos of mixed sizes need
                    --image-size, to which they are resized as they are read
  --dataset NAME    tensorflow-datasets: cifar10, cifar100, fashion_mnist, mnist (needs network once)
  (neither)         the offline default: scikit-learn's bundled 8x8 digits

Images are augmented (random shifts; flips with --flip; random erasing, MixUp and CutMix when asked)
by Keras preprocessing layers as batches are drawn, with a seed per (epoch, step) so a resumed run
sees the same batches; the model itself scales pixels to [0, 1] and resizes to --image-size, so it
takes raw pixels. AdamW with warmup and cosine decay, label smoothing. Prints test accuracy (with
--flip also of each test image averaged with its mirror image); leaves checkpoints, log.csv,
metrics.json, learning_curves.png and attention_maps.png in --output-dir, and the trained model as a
transformers checkpoint with its image processor and class names (huggingface/: a model with class-token
pooling, as transformers' ViT). Rerunning resumes.

--from-huggingface DIR fine-tunes a Hugging Face ViT checkpoint (a local directory saved by
`save_pretrained`, or a Hub model id such as google/vit-base-patch16-224, read from the local Hugging
Face cache or downloaded into it) instead of training a new model: its weights, a new head for this
data's classes, and its own image processor (`keras_tfm.data.ImageProcessor`: Pillow's resampling
filter, center crop, scaling and normalisation, grayscale made RGB) preparing each batch as it is drawn,
validation included. --image-size resizes to that square instead, without the crop; the positions are
interpolated.

    python recipes/vit.py --data fashion-mnist --epochs 10
    python recipes/vit.py --data fashion-mnist --from-huggingface google/vit-base-patch16-224 \
        --image-size 64 --epochs 2 --learning-rate 1e-4
"""

from __future__ import annotations

import os
import types

import numpy as np


def main() -> None:
    import keras

    from keras_tfm import training
    from keras_tfm.data import (
        EpochBatches,
        ProcessedImages,
        augment,
        augmentation_layers,
        flip_averaged_probabilities,
        load_images,
    )

    sizes = model_sizes()
    args = flags(sizes).parse_args()
    checkpoint, fixed = checkpoint_settings(args) if args.from_huggingface else (None, None)
    config = training.training_config(args, checkpoint)
    training.setup(config)
    data = load_images(args.data, args.dataset, args.data_dir, log=training.log, image_size=args.image_size)
    images = image_pipeline(args, data, fixed)
    (train_x, train_y), (test_x, test_y), processor = images.train, images.test, images.processor
    num_classes = len(data.class_names)
    one_hot = np.eye(num_classes, dtype="float32")
    augmentations = augmentation_layers(args.shift, args.flip, args.erasing, args.mixup, args.cutmix)
    rows = EpochBatches(len(train_x), args.batch_size, args.seed)
    prepared = processor or (lambda pixels: pixels.astype("float32"))  # a checkpoint's processor, batch by batch
    validation = (
        ProcessedImages(test_x, one_hot[test_y], processor, args.batch_size)
        if processor
        else (test_x.astype("float32"), one_hot[test_y])
    )

    def train_batch(epoch: int, step: int):
        chosen = rows(epoch, step)
        return augment(prepared(train_x[chosen]), one_hot[train_y[chosen]], augmentations, [args.seed, epoch, step])

    def evaluate(model) -> dict:
        results = {"attention_maps": draw_attention(model, test_x[:1], images, args.output_dir)}
        if args.flip:  # a model trained on mirror images is also scored on each test image averaged with its mirror
            test_images = validation if processor else validation[0]
            probabilities = flip_averaged_probabilities(model, test_images, args.batch_size)
            results["validation_accuracy_flip_averaged"] = float(np.mean(probabilities.argmax(-1) == test_y))
        return {**results, "data": data.source}

    result = training.train(
        config,
        build_model=lambda: build_model(args, sizes, checkpoint, images, num_classes),
        train_batch=train_batch,
        steps_per_pass=len(train_x) // args.batch_size,
        validation_data=validation,
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=args.label_smoothing),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
        evaluate=evaluate,
        huggingface=checkpoint,
        labels=data.class_names,
        image_preprocessing=None if processor else (images.image_size, images.scaling),  # a checkpoint's: its own
        settings=training.recipe_settings(args),
    )
    flipped = result.metrics.get("validation_accuracy_flip_averaged")
    print(
        f"test accuracy {result.metrics['validation_accuracy']:.4f} on {len(test_x):,} images"
        + (f"; averaged with their mirror images {flipped:.4f}" if args.flip else "")
    )


def model_sizes() -> dict:
    from keras_tfm.models import vit

    names = ("vit_small_images", "vit_tiny", "vit_small", "vit_base", "vit_large", "vit_huge")
    return {name: getattr(vit, name) for name in names}


def flags(sizes: dict):
    """The shared runtime's flags and this recipe's."""
    from keras_tfm import training

    parser = training.recipe_parser(__doc__, sizes, "vit_small_images", "runs/vit")
    parser.set_defaults(batch_size=128, learning_rate=1e-3, weight_decay=0.05, epochs=10)
    recipe = parser.add_argument_group("image classifier")
    recipe.add_argument(
        "--from-huggingface",
        metavar="DIR",
        help="fine-tune this Hugging Face ViT checkpoint directory or Hub model id, or a peft LoRA adapter on one (see above)",
    )
    recipe.add_argument(
        "--image-size",
        type=training.POSITIVE,
        help="side the images are resized to (default: theirs, or the checkpoint's); needed for "
        "an image folder of mixed sizes, which are resized as they are read",
    )
    recipe.add_argument(
        "--patch-size", type=training.POSITIVE, help="patch side (default: 4, or 2 for images under 16 pixels)"
    )
    recipe.add_argument("--pooling", choices=["token", "mean"], default="token", help="(default: %(default)s)")
    recipe.add_argument("--label-smoothing", type=training.FRACTION, default=0.1, help="(default: %(default)s)")
    recipe.add_argument(
        "--shift",
        type=training.number(0.0, 1.0),
        default=0.1,
        help="random shift, as a fraction of the side (default: %(default)s)",
    )
    recipe.add_argument(
        "--flip",
        action="store_true",
        help="random horizontal flips (not for digits or text); test images are then also scored "
        "averaged with their mirror images",
    )
    recipe.add_argument(
        "--erasing",
        type=training.number(0.0, 1.0),
        default=0.0,
        help="random erasing: each image's chance is drawn from [0, this] (default: off)",
    )
    recipe.add_argument(
        "--mixup", type=training.number(0.0), default=0.0, help="MixUp with this Beta alpha (default: off)"
    )
    recipe.add_argument(
        "--cutmix", type=training.number(0.0), default=0.0, help="CutMix with this Beta factor (default: off)"
    )
    return parser


def image_pipeline(args, data, fixed: dict | None) -> types.SimpleNamespace:
    """The images as the model sees them, and the patch size that fits: a checkpoint's processor (`fixed`)
    prepares each batch as it is drawn; a new model takes raw pixels, resized to a square side and rescaled by
    Keras layers inside it."""
    import keras

    from keras_tfm import training
    from keras_tfm.data import DataError

    (train_x, train_y), (test_x, test_y) = data.train, data.test
    if fixed and train_x.shape[-1] == 1 and fixed["num_channels"] == 3:
        train_x, test_x = (np.repeat(x, 3, axis=-1) for x in (train_x, test_x))  # as its processor's RGB conversion
    height, width, channels = train_x.shape[1:]
    if fixed:
        processor, model_size, patch_size = fixed["processor"], fixed["model_size"], fixed["patch_size"]
        image_size, scaling, preprocess = model_size, None, []
        training.log(f"Images: {height}x{width}x{channels}, to the model at {model_size}x{model_size} through the "
                     f"checkpoint's image processor: {processor.describe()}")  # fmt: skip
    else:
        if height != width and not args.image_size:
            raise DataError(
                f"the images are {height}x{width}; give a square size to resize them to.", argument="image_size"
            )
        processor, image_size = None, args.image_size or height
        model_size, patch_size = image_size, args.patch_size or (4 if image_size >= 16 else 2)
        scaling = [keras.layers.Rescaling(1 / 255)]
        resizing = [keras.layers.Resizing(image_size, image_size)] if (height, width) != (image_size,) * 2 else []
        preprocess = [*resizing, *scaling]
        training.log(f"Images: {height}x{width}x{channels}, to the model at {model_size}x{model_size} through "
                     + ", ".join(layer.name for layer in preprocess))  # fmt: skip
    if model_size % patch_size:
        raise DataError(f"must divide `image_size` {model_size}; got {patch_size}.", argument="patch_size")
    return types.SimpleNamespace(
        train=(train_x, train_y),
        test=(test_x, test_y),
        shape=(height, width, channels),
        image_size=image_size,
        patch_size=patch_size,
        scaling=scaling,
        preprocess=preprocess,
        processor=processor,
    )


def build_model(args, sizes: dict, checkpoint, images, num_classes: int):
    """The classifier: the checkpoint's ViT with a new head and its processor, or a new ViT size after the
    preprocessing layers."""
    import keras

    from keras_tfm import convert, training
    from keras_tfm.data import DataError

    height, width, channels = images.shape
    if checkpoint:
        model = convert.from_huggingface(checkpoint.directory, num_classes=num_classes, adapter=checkpoint.adapter)
        if model.num_channels != channels:
            raise DataError(
                f"the checkpoint takes {model.num_channels}-channel images; the data has {channels} channels.",
                argument="from_huggingface",
            )
        model.image_processor = images.processor  # --image-size's, where given: written with the trained model
        return model
    backbone = training.build_model(
        sizes,
        args,
        image_size=images.image_size,
        patch_size=images.patch_size,
        num_classes=num_classes,
        num_channels=channels,
        pooling=args.pooling,
    )
    inputs = keras.Input((height, width, channels), name="pixels")
    x = inputs
    for layer in images.preprocess:
        x = layer(x)
    return keras.Model(inputs, backbone(x), name=f"{backbone.name}_classifier")


def draw_attention(model, image, images, output_dir: str) -> str:
    """attention_maps.png of one test image, drawn over what the model saw of it (resized, cropped)."""
    import dataclasses

    from keras_tfm import viz

    if images.processor:
        backbone, x = model, images.processor(image)
        seen = dataclasses.replace(images.processor, do_rescale=False, do_normalize=False)(image)[0]
    else:
        backbone, x = model.layers[-1], image.astype("float32")
        for layer in images.preprocess:
            x = layer(x)
        seen = image[0]
    _, weights = backbone(x, return_attention_weights=True)
    return viz.plot_attention_maps(seen, weights, os.path.join(output_dir, "attention_maps.png"))


def checkpoint_settings(args) -> tuple:
    """The --from-huggingface checkpoint and what it fixes: patch size, channels, and its image processor
    (`preprocessor_config.json`, else transformers' ViT defaults), resizing to --image-size without the crop
    where given."""
    import dataclasses

    from keras_tfm import training
    from keras_tfm.data import DataError, ImageProcessor

    checkpoint = training.checkpoint_config(
        args,
        "vit",
        {"model": "vit_small_images", "patch_size": None, "pooling": "token"},
        "takes the architecture from the checkpoint",
    )
    try:
        processor = ImageProcessor.from_huggingface(checkpoint.directory) or ImageProcessor()
    except DataError as failure:
        raise DataError(str(failure), argument="from_huggingface") from None
    if args.image_size:
        side = {"height": args.image_size, "width": args.image_size}
        processor = dataclasses.replace(processor, do_resize=True, size=side, do_center_crop=False)
    model_size = processor.output_size()
    if model_size is None or model_size[0] != model_size[1]:
        raise DataError(f"the checkpoint's processor ({processor.describe()}) does not give square images of one "
                        "size; give --image-size.", argument="from_huggingface")  # fmt: skip
    patch_size = checkpoint.config.get("patch_size", 16)
    return checkpoint, {
        "patch_size": patch_size if isinstance(patch_size, int) else patch_size[0],
        "num_channels": checkpoint.config.get("num_channels", 3),
        "model_size": model_size[0],
        "processor": processor,
    }


if __name__ == "__main__":
    from keras_tfm.training import run_main

    run_main(main)
