"""Train a SegFormer to label every pixel: background, circle, square or triangle.

Data: generated pictures of shapes on textured backgrounds (`keras_tfm.data.make_shapes`): --train-images and
--test-images of --image-size pixels with 1 to --max-shapes shapes each, from --seed, with their label maps. Made
in seconds, offline; training pictures are mirrored at random with their maps.

The model is a small SegFormer (two stages 32 and 64 wide; the usual --hidden-dim, ... do not apply), or
--from-huggingface DIR: a SegFormer checkpoint (`nvidia/mit-b0`, `nvidia/segformer-b0-finetuned-ade-512-512`, or
a local directory) fine-tuned with a new decoder for the four classes, its images prepared by its own processor's
rescaling and normalization at --image-size. Loss: the per-pixel cross-entropy at the labels' size
(`SegmentationCrossEntropy`); metric: the mean IoU over the classes. Leaves checkpoints, log.csv, metrics.json,
learning_curves.png and segmentation.png (pictures, true maps, predicted maps) in --output-dir. Rerunning resumes.

    python recipes/segmentation.py --epochs 10
"""

from __future__ import annotations

import numpy as np

CLASSES = ["background", "circle", "square", "triangle"]


def main() -> None:
    from keras_tfm import SegmentationCrossEntropy, training
    from keras_tfm.data import EpochBatches, shape_splits
    from keras_tfm.metrics import MeanIoU

    sizes = model_sizes()
    args = flags(sizes).parse_args()
    checkpoint = training.checkpoint_config(args, "segformer", {}, "takes the architecture from the checkpoint") if (
        args.from_huggingface) else None  # fmt: skip
    config = training.training_config(args, checkpoint)
    training.setup(config)
    train, test = shape_splits(args, log=training.log)
    rows = EpochBatches(args.train_images, args.batch_size, args.seed)
    prepare = image_preparation(checkpoint)

    def train_batch(epoch: int, step: int):
        chosen = rows(epoch, step)
        flips = np.random.default_rng([args.seed, epoch, step]).random(len(chosen)) < 0.5
        images, masks = train.images[chosen].copy(), train.masks[chosen].copy()
        images[flips], masks[flips] = images[flips][:, :, ::-1], masks[flips][:, :, ::-1]
        return prepare(images), masks.astype("int32")

    result = training.train(
        config,
        build_model=lambda: build_model(args, checkpoint),
        train_batch=train_batch,
        steps_per_pass=args.train_images // args.batch_size,
        validation_data=(prepare(test.images), test.masks.astype("int32")),
        loss=SegmentationCrossEntropy(),
        metrics=[MeanIoU(len(CLASSES))],
        evaluate=lambda model: draw(model, test, prepare, args.output_dir),
        huggingface=checkpoint,
        settings=training.recipe_settings(args),
    )
    print(f"mean IoU on {args.test_images:,} test pictures: {result.metrics['validation_mean_iou']:.4f}")


def model_sizes() -> dict:
    return {"segformer_small_images": segformer_small_images}


def segformer_small_images(**overrides):
    """A SegFormer of two stages, 32 and 64 wide with 1 and 2 heads, 2 blocks each, a decoder 64 wide: logits at a
    quarter of the picture."""
    import keras_tfm

    settings = dict(num_classes=len(CLASSES), class_names=CLASSES, stage_widths=(32, 64), stage_depths=(2, 2),
                    stage_heads=(1, 2), stage_reduction_ratios=(4, 2), stage_patch_sizes=(7, 3), stage_strides=(4, 2),
                    stage_mlp_ratios=(4, 4), decoder_dim=64, drop_path_rate=0.0)  # fmt: skip
    return keras_tfm.SegFormer(**{**settings, **overrides})


def flags(sizes: dict):
    from keras_tfm import training

    parser = training.recipe_parser(__doc__, sizes, "segformer_small_images", "runs/segmentation")
    parser.set_defaults(batch_size=32, learning_rate=2e-3, weight_decay=1e-2, epochs=10)
    recipe = parser.add_argument_group("segmentation")
    recipe.add_argument("--from-huggingface", metavar="DIR", help="fine-tune this SegFormer checkpoint (see above)")
    training.shapes_flags(parser, image_size=64, max_shapes=3, train_images=2048, test_images=256)
    return parser


def image_preparation(checkpoint):
    """uint8 pictures -> the model's input: 0-1 pixels, or a checkpoint's rescaling and normalization."""
    if checkpoint is None:
        return lambda images: images.astype("float32") / 255
    from keras_tfm.data import ImageProcessor

    processor = ImageProcessor.from_huggingface(checkpoint.directory) or ImageProcessor()
    mean, std = np.asarray(processor.image_mean, "float32"), np.asarray(processor.image_std, "float32")
    return lambda images: (images.astype("float32") * processor.rescale_factor - mean) / std


def build_model(args, checkpoint):
    from keras_tfm import convert, training
    from keras_tfm.data import ImageProcessor

    if checkpoint is None:
        for name in ("num_layers", "num_heads", "hidden_dim", "intermediate_dim", "max_length"):
            if getattr(args, name, None) is not None:
                raise training.InputError("the recipe's SegFormer has stages, not this setting.", argument=name)
        model = segformer_small_images(dropout=args.dropout or 0.0)
        side = args.image_size  # what `image_preparation` does, for the checkpoint written after training
        model.image_processor = ImageProcessor(size={"height": side, "width": side}, do_normalize=False,
                                               processor_type="SegformerImageProcessor")  # fmt: skip
        return model
    model = convert.from_huggingface(checkpoint.directory, num_classes=len(CLASSES), adapter=checkpoint.adapter)
    model.class_names = CLASSES
    return model


def draw(model, test, prepare, output_dir: str) -> dict:
    """segmentation.png: six test pictures, their true maps and the model's (upsampled to the picture)."""
    from keras import ops

    from keras_tfm import viz

    logits = ops.convert_to_tensor(model.predict(prepare(test.images[:6]), verbose=0))
    resized = ops.image.resize(logits, test.images.shape[1:3], interpolation="bilinear")
    predicted = np.argmax(ops.convert_to_numpy(resized), axis=-1)
    path = viz.plot_segmentation(test.images[:6], test.masks[:6], predicted, CLASSES, f"{output_dir}/segmentation.png")
    return {"segmentation": path, "data": "generated shapes (keras_tfm.data.make_shapes)"}


if __name__ == "__main__":
    from keras_tfm.training import run_main

    run_main(main)
