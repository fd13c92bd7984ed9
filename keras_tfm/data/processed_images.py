"""Images and their labels as batches for `fit`, `evaluate` and `predict`, each batch prepared by an
`ImageProcessor` when it is drawn, on every backend.

A `keras.utils.PyDataset`, so Keras' own trainers read it on TensorFlow, JAX and PyTorch alike. The images stay
as they came (uint8 arrays, file paths, PIL images) until their batch is drawn: 10,000 small images prepared at a
checkpoint's 224 x 224 would take 6 GB held at once, and every image goes through the checkpoint's own processor,
not through a resize that differs from it.
"""

from __future__ import annotations

import hashlib
import os

import keras
import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.data.image_processing import ImageProcessor
from keras_tfm.errors import InputError


class ProcessedImages(keras.utils.PyDataset):
    """Batches `(pixels, labels)` (or `pixels` without labels) of `images` prepared by `processor`.

    Args:
        images: a uint8 array `(count, height, width[, channels])`, or a list of file paths, PIL images or
            arrays of any sizes.
        labels: one row per image (class ids, one-hot rows, ...), or None.
        processor: how images are prepared (`model.image_processor`, a checkpoint's).
        batch_size: images per batch (the last may hold fewer).
        shuffle: a new order each epoch, drawn from `seed` and the epoch (the same epochs on a rerun).
        **kwargs: `keras.utils.PyDataset`'s `workers`, `use_multiprocessing`, `max_queue_size`.

    Example:
    >>> processor = keras_tfm.data.ImageProcessor(size={"height": 32, "width": 32})  # or model.image_processor
    >>> digits = np.random.randint(0, 256, (10, 8, 8), "uint8")  # grayscale: made RGB as the processor says
    >>> batches = ProcessedImages(digits, np.arange(10), processor, batch_size=4)  # model.fit(batches)
    >>> pixels, labels = batches[2]
    >>> len(batches), pixels.shape, labels.tolist()
    (3, (2, 32, 32, 3), [8, 9])
    """

    argument = "images"  # what an error names

    def __init__(self, images, labels, processor: ImageProcessor, batch_size: int = 32, shuffle: bool = False,
                 seed: int = 0, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        caller = type(self).__name__
        if not isinstance(processor, ImageProcessor):
            raise InputError(f"expected a keras_tfm.data.ImageProcessor (a model's image_processor); received "
                             f"{type(processor).__name__}.", "processor", caller=caller)  # fmt: skip
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise InputError(f"expected an integer >= 1; received {batch_size!r}.", "batch_size", caller=caller)
        if not isinstance(images, (np.ndarray, list, tuple)) or len(images) == 0:
            raise InputError(f"expected an array of images or a non-empty list of them; received "
                             f"{_described(images)}.", "images", caller=caller)  # fmt: skip
        if labels is not None and len(labels) != len(images):
            raise InputError(f"expected one row per image ({len(images)}); received {len(labels)}.", "labels",
                             caller=caller)  # fmt: skip
        self.images, self.labels = images, None if labels is None else np.asarray(labels)
        self.processor, self.batch_size, self.shuffle, self.seed = processor, batch_size, shuffle, seed
        self._order = np.arange(len(images))
        self.on_epoch_end(epoch=-1)

    def __len__(self) -> int:
        return -(-len(self.images) // self.batch_size)

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        rows = self._order[index * self.batch_size : (index + 1) * self.batch_size]
        try:
            pixels = self.processor([self.images[row] for row in rows])
        except DataError as error:  # names the image, not only its place in the batch
            raise DataError(f"{error.message} (batch {index} of {len(self)})", argument=self.argument) from None
        return pixels if self.labels is None else (pixels, self.labels[rows])

    def on_epoch_end(self, epoch: int | None = None) -> None:
        self._epoch = (getattr(self, "_epoch", -1) + 1) if epoch is None else epoch + 1
        if self.shuffle:
            self._order = np.random.default_rng([self.seed, self._epoch]).permutation(len(self.images))

    def digest(self) -> str:
        """A short digest of the images (their bytes, or their paths), labels and processor: processes of one run
        compare it to refuse different data."""
        digest = hashlib.sha256(repr(self.processor.config()).encode())
        if isinstance(self.images, np.ndarray):
            digest.update(np.ascontiguousarray(self.images).tobytes() + str(self.images.shape).encode())
        else:
            for image in self.images:
                digest.update(_image_bytes(image))
        if self.labels is not None:
            digest.update(np.ascontiguousarray(self.labels).tobytes())
        return digest.hexdigest()[:16]


def _image_bytes(image) -> bytes:
    """A path's name, or an array's or PIL image's pixels."""
    if isinstance(image, (str, os.PathLike)):
        return os.fspath(image).encode() + b"\n"
    return np.asarray(image).tobytes()


def _described(value) -> str:
    return f"an empty {type(value).__name__}" if isinstance(value, (list, tuple)) else type(value).__name__
