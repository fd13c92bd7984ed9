"""A folder of labelled images (`root/<class>/<image files>`) as batches for `fit`, `evaluate` and `predict`: each
batch's files read and prepared by an `ImageProcessor` when it is drawn, on every backend.

`ProcessedImages` over the folder's files: its workers (`workers=`, `use_multiprocessing=`) prepare batches ahead
of the step, and files are read when their batch is drawn, so a folder of photos larger than memory trains.
"""

from __future__ import annotations

import os

import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.data.image_processing import ImageProcessor
from keras_tfm.data.processed_images import ProcessedImages

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class ImageFolder(ProcessedImages):
    """Batches `(pixels, labels)` of the images under `directory/<class>/`, classes in sorted order.

    Args:
        directory: the folder; each sub-folder is a class, its image files (`SUFFIXES`) its examples.
        processor: how images are prepared (`model.image_processor`, a checkpoint's).
        batch_size: images per batch (the last may hold fewer).
        shuffle: a new order each epoch, drawn from `seed` and the epoch (the same epochs on a rerun).
        class_names: the classes in label order (a test folder takes its training folder's); default: the
            sorted sub-folders.
        **kwargs: `keras.utils.PyDataset`'s `workers`, `use_multiprocessing`, `max_queue_size`.

    Attributes: `class_names`, `files` and `labels` (int32), in the order read.

    Example:
    >>> import os
    >>> from PIL import Image
    >>> for name, color in (("cat", "red"), ("dog", "blue")):
    ...     os.makedirs(f"pets/{name}", exist_ok=True)
    ...     Image.new("RGB", (40, 30), color).save(f"pets/{name}/1.png")
    >>> processor = keras_tfm.data.ImageProcessor(size={"height": 16, "width": 16})  # or model.image_processor
    >>> folder = ImageFolder("pets", processor, batch_size=2)  # model.fit(folder, epochs=3)
    >>> pixels, labels = folder[0]
    >>> pixels.shape, folder.class_names
    ((2, 16, 16, 3), ['cat', 'dog'])
    """

    argument = "directory"

    def __init__(self, directory: str, processor: ImageProcessor, batch_size: int = 32, shuffle: bool = True,
                 seed: int = 0, class_names: list[str] | None = None, **kwargs):  # fmt: skip
        self.class_names, self.files, labels = _listed(directory, class_names)
        super().__init__(self.files, labels, processor, batch_size, shuffle, seed, **kwargs)


def _listed(directory: str, class_names: list[str] | None) -> tuple[list[str], list[str], np.ndarray]:
    """The classes, every image file under them and its label."""
    if not isinstance(directory, (str, os.PathLike)) or not os.path.isdir(directory):
        raise DataError(f"expected a folder of class sub-folders; {directory!r} is not a folder.", argument="directory")
    found = sorted(name for name in os.listdir(directory) if os.path.isdir(os.path.join(directory, name)))
    class_names = list(class_names) if class_names is not None else found
    if not class_names:
        raise DataError(f"{os.fspath(directory)!r} has no class sub-folders; expected <folder>/<class>/<image files>.",
                        argument="directory")  # fmt: skip
    files, labels = [], []
    for label, name in enumerate(class_names):
        folder = os.path.join(directory, name)
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        chosen = [os.path.join(folder, file) for file in names if file.lower().endswith(SUFFIXES)]
        files += chosen
        labels += [label] * len(chosen)
    if not files:
        raise DataError(f"no image files ({', '.join(SUFFIXES)}) under {os.fspath(directory)!r}.", argument="directory")
    return class_names, files, np.asarray(labels, "int32")
