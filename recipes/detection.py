"""Train a YOLOS detector: a ViT whose detection tokens each find one object, with DETR's set-prediction loss.

Data: generated pictures of circles, squares and triangles on textured backgrounds (`keras_tfm.data.make_shapes`):
--train-images and --test-images of --image-size pixels with 1 to --max-shapes shapes each, from --seed. Made in
seconds, offline; training images are mirrored at random (boxes mirrored with them).

The model is a small YOLOS (2 layers, 4 heads, 64 wide, 3 detection tokens, patches of 4 pixels; the usual
--num-layers, ... override it), or --from-huggingface DIR: a YOLOS checkpoint (`hustvl/yolos-tiny`, or a local
directory) fine-tuned with a new head for the three shapes, its images prepared by its own processor at
--image-size. The objects are matched to the tokens by SciPy's assignment solver (the `detection` extra).
Scores the test pictures with COCO's mAP (pycocotools); leaves checkpoints, log.csv, metrics.json,
learning_curves.png and detections.png (boxes found and true) in --output-dir. Rerunning resumes.

    python recipes/detection.py --epochs 20
"""

from __future__ import annotations

import numpy as np


def main() -> None:
    from keras_tfm import training
    from keras_tfm.data import EpochBatches, shape_splits

    sizes = model_sizes()
    args = flags(sizes).parse_args()
    checkpoint = training.checkpoint_config(args, "yolos", {}, "takes the architecture from the checkpoint") if (
        args.from_huggingface) else None  # fmt: skip
    config = training.training_config(args, checkpoint)
    training.setup(config)
    train, test = shape_splits(args, log=training.log)
    rows = EpochBatches(args.train_images, args.batch_size, args.seed)
    prepare = image_preparation(args, checkpoint)

    def train_batch(epoch: int, step: int):
        chosen = rows(epoch, step)
        flips = np.random.default_rng([args.seed, epoch, step]).random(len(chosen)) < 0.5
        images, boxes = train.images[chosen].copy(), train.boxes[chosen].copy()
        images[flips] = images[flips][:, :, ::-1]
        boxes[flips, :, 0] = np.where(train.labels[chosen][flips] >= 0, 1 - boxes[flips, :, 0], 0)
        return prepare(images), {"labels": train.labels[chosen], "boxes": boxes}

    result = training.train(
        config,
        build_model=lambda: build_model(args, sizes, checkpoint),
        train_batch=train_batch,
        steps_per_pass=args.train_images // args.batch_size,
        validation_data=(prepare(test.images), {"labels": test.labels, "boxes": test.boxes}),
        loss=None,  # the model's own: YOLOS.compute_loss
        evaluate=lambda model: evaluate(model, test, prepare, args),
        huggingface=checkpoint,
        settings=training.recipe_settings(args),
    )
    print(f"COCO mAP on {args.test_images:,} test pictures: {result.metrics['map']:.4f} (at IoU 0.5: "
          f"{result.metrics['map_50']:.4f})")  # fmt: skip


def model_sizes() -> dict:
    return {"yolos_small_images": yolos_small_images}


def yolos_small_images(**overrides):
    """A YOLOS for small pictures: 2 layers, 4 heads, 64 wide, 3 detection tokens, patches of 4 pixels."""
    import keras_tfm

    settings = dict(patch_size=4, num_detection_tokens=3, num_layers=2, num_heads=4, hidden_dim=64, intermediate_dim=128,
                    mid_position_embeddings=False, name="yolos")  # fmt: skip
    return keras_tfm.YOLOS(**{**settings, **overrides})


def flags(sizes: dict):
    from keras_tfm import training

    parser = training.recipe_parser(__doc__, sizes, "yolos_small_images", "runs/detection")
    parser.set_defaults(batch_size=16, learning_rate=1e-3, weight_decay=0.0, epochs=20)
    recipe = parser.add_argument_group("detection")
    recipe.add_argument("--from-huggingface", metavar="DIR", help="fine-tune this YOLOS checkpoint (see above)")
    recipe.add_argument("--detection-tokens", type=training.POSITIVE, default=3,
                        help="the model's detection tokens: at most this many objects found (default: %(default)s)")  # fmt: skip
    training.shapes_flags(parser, image_size=32, max_shapes=2, train_images=16384, test_images=256)
    return parser


def image_preparation(args, checkpoint):
    """uint8 pictures -> the model's input: 0-1 pixels, or a checkpoint's processor at --image-size."""
    import dataclasses

    if checkpoint is None:
        return lambda images: images.astype("float32") / 255
    from keras_tfm.data import ImageProcessor

    processor = ImageProcessor.from_huggingface(checkpoint.directory) or ImageProcessor()
    side = {"height": args.image_size, "width": args.image_size}
    return dataclasses.replace(processor, size=side, do_center_crop=False)


def build_model(args, sizes: dict, checkpoint):
    from keras_tfm import convert, training

    if checkpoint is None:
        from keras_tfm.data import ImageProcessor

        side = args.image_size
        model = training.build_model(sizes, args, image_shape=(side, side), num_classes=3,
                                     num_detection_tokens=args.detection_tokens,
                                     class_names=["circle", "square", "triangle"])  # fmt: skip
        # what `image_preparation` does, for the checkpoint written after training
        model.image_processor = ImageProcessor(size={"height": side, "width": side}, do_normalize=False)
        return model
    model = convert.from_huggingface(checkpoint.directory, num_classes=3, adapter=checkpoint.adapter)
    model.class_names = ["circle", "square", "triangle"]
    return model


def evaluate(model, test, prepare, args) -> dict:
    """COCO's mAP of the test pictures' detections (every query, as COCO ranks them), and detections.png."""
    from keras import ops

    from keras_tfm import viz
    from keras_tfm.detection import center_to_corners, coco_average_precision, detections

    outputs = model.predict(prepare(test.images), batch_size=args.batch_size, verbose=0)
    side = args.image_size
    found = detections(outputs["logits"], outputs["pred_boxes"], [(side, side)] * len(test.images), threshold=0.0)
    truth = [{"labels": labels[labels >= 0], "boxes": ops.convert_to_numpy(center_to_corners(boxes[labels >= 0])) * side}
             for labels, boxes in zip(test.labels, test.boxes)]  # fmt: skip
    scores = coco_average_precision(found, truth)
    confident = [{key: value[result["scores"] > 0.5] for key, value in result.items()} for result in found[:6]]
    picture = viz.plot_detections(test.images[:6], confident, truth[:6], test.class_names,
                                  f"{args.output_dir}/detections.png")  # fmt: skip
    return {**scores, "detections": picture, "data": "generated shapes (keras_tfm.data.make_shapes)"}


if __name__ == "__main__":
    from keras_tfm.training import run_main

    run_main(main)
