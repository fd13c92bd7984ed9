"""What a person does with a segmentation model, images in as files, PIL images or arrays: a label map per image
at the image's own size (`segment`), as transformers' `post_process_semantic_segmentation` makes it."""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.models.image_tasks import ImageTasks, _batches, one_image


class SegmentationTasks:
    """For a model with `image_processor`, `include_top`, `class_names` and logits `(batch, h, w, classes)` from
    `predict_on_batch`."""

    preprocess_images = ImageTasks.preprocess_images

    def segment(self, images, batch_size: int = 8):
        """Each image's label map `(height, width)` int32 at the image's own size: the logits resized
        bilinearly to it, the likeliest class per pixel (`class_names[label]` names it). One image: its map
        alone.

        Example: `keras_tfm.from_huggingface("nvidia/segformer-b0-finetuned-ade-512-512").segment("room.jpg")`."""
        if not getattr(self, "include_top", False):
            raise InputError("a model without its head (include_top=False) has no classes; load it with its "
                             "decoder.", caller="segment")  # fmt: skip
        single = one_image(images)
        maps = []
        for row, size in predictions_per_image(self, [images] if single else images, batch_size):
            resized = ops.image.resize(row[None], size, interpolation="bilinear", antialias=False)
            maps.append(np.argmax(ops.convert_to_numpy(resized)[0], axis=-1).astype("int32"))
        return maps[0] if single else maps


def predictions_per_image(model, images: list, batch_size: int):
    """`(prediction, (height, width))` of each image in turn: the model's output on the prepared batch, and the
    image's own size to resize it to."""
    pixels = model.preprocess_images(images)
    sizes = [image_height_width(image) for image in images]
    for start, part in zip(range(0, len(pixels), batch_size), _batches(pixels, batch_size)):
        yield from zip(ops.convert_to_tensor(model.predict_on_batch(part)), sizes[start:])


def image_height_width(image) -> tuple[int, int]:
    """`(height, width)` of a file path, a PIL image or an array `(height, width[, channels])`."""
    if isinstance(image, np.ndarray):
        return tuple(image.shape[:2])
    if hasattr(image, "size") and hasattr(image, "mode"):  # a PIL image
        return image.size[1], image.size[0]
    from PIL import Image

    with Image.open(image) as opened:
        width, height = opened.size
        turned = opened.getexif().get(0x0112, 1) in (5, 6, 7, 8)  # EXIF orientations a quarter turn away
    return (width, height) if turned else (height, width)
