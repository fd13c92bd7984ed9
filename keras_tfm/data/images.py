"""Labelled images for classifier recipes: local files, a named TFDS dataset, or the offline default.

Local files (`data`) may be
  - a directory of IDX files (MNIST / Fashion-MNIST layout: `train-images-idx3-ubyte[.gz]`,
    `train-labels-idx1-ubyte[.gz]`, `t10k-...`),
  - an `.npz` file with `x_train, y_train, x_test, y_test`,
  - an image folder `PATH/<class>/*.png|jpg` (or `PATH/train/<class>/...` and `PATH/test/<class>/...`);
    images of different sizes are resized to `image_size` as they are read.
The offline default is scikit-learn's bundled handwritten digits (1,797 images, 8x8, 10 classes).
Images come back as `(count, height, width, channels)` bytes (uint8; float 0-255 where an .npz held
floats in [0, 1]) and int32 labels, at least two classes.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
from collections.abc import Callable

import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.data.tfds import load_tfds

OFFLINE_IMAGES_SOURCE = "the offline default: scikit-learn's bundled 8x8 handwritten digits"
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


@dataclasses.dataclass
class ImageSplits:
    train: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]
    class_names: list[str]
    source: str


def read_idx(path: str) -> np.ndarray:
    """Reads an IDX file (gzipped or not): magic, dimensions, then unsigned bytes."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as file:
            raw = file.read()
        if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
            raise ValueError("not an IDX file of unsigned bytes")
        rank = raw[3]
        shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(rank))
        data = np.frombuffer(raw, np.uint8, offset=4 + 4 * rank)
        if data.size != int(np.prod(shape)):
            raise ValueError(f"header says {shape}, but {data.size} values follow")
        return data.reshape(shape)
    except (OSError, EOFError, ValueError) as error:
        raise DataError(f"{path!r} is not a readable IDX file ({error}).", argument="data") from None


def _find(directory: str, stem: str) -> str:
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    raise DataError(f"the IDX directory {directory!r} has no {stem}[.gz].", argument="data")


def _load_idx_directory(path: str):
    splits = []
    for prefix in ("train", "t10k"):
        images = read_idx(_find(path, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_find(path, f"{prefix}-labels-idx1-ubyte")).astype("int32")
        if len(images) != len(labels):
            raise DataError(f"{prefix} has {len(images)} images but {len(labels)} labels in {path!r}.", argument="data")
        splits.append((images[..., None], labels))
    return splits


def _load_npz(path: str):
    try:
        with np.load(path) as arrays:
            missing = {"x_train", "y_train", "x_test", "y_test"} - set(arrays.files)
            if missing:
                raise DataError(
                    f"{path!r} lacks the arrays {sorted(missing)}; expected x_train, y_train, x_test, y_test.",
                    argument="data",
                )
            splits = [(arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])]
    except (OSError, ValueError) as error:
        raise DataError(f"{path!r} is not a readable .npz file ({error}).", argument="data") from None
    return [
        _checked_arrays(x, y, f"{path!r} {split}")
        for (x, y), split in zip(splits, ("x_train/y_train", "x_test/y_test"))
    ]


def _checked_arrays(images: np.ndarray, labels: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Images `(count, height, width[, channels])` of bytes (0-255) and integer labels >= 0, as given in
    an .npz file: float images in [0, 1] are scaled to 0-255, and what cannot be read right is refused
    (a label -1 would index the last class, 2.7 would become 2, a channels-first array would train)."""
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or len(images) != len(labels.reshape(-1)):
        raise DataError(
            f"{where}: expected images (count, height, width[, channels]) and one label each; received "
            f"shapes {images.shape} and {labels.shape}.",
            argument="data",
        )
    if images.shape[-1] not in (1, 3, 4) and images.shape[1] in (1, 3, 4):
        raise DataError(
            f"{where}: the images look channels-first {images.shape}; expected channels last "
            f"(count, height, width, channels): transpose them with x.transpose(0, 2, 3, 1).",
            argument="data",
        )
    labels = labels.reshape(-1)
    if labels.dtype.kind == "f" and not np.array_equal(labels, np.round(labels)):
        raise DataError(
            f"{where}: labels must be whole class numbers; received {labels[labels != np.round(labels)][0]}.",
            argument="data",
        )
    if labels.dtype.kind not in "iuf" or labels.size and labels.min() < 0:
        raise DataError(
            f"{where}: labels must be class numbers >= 0; received {labels.min() if labels.dtype.kind in 'iuf' else labels.dtype}.",
            argument="data",
        )
    if images.dtype.kind == "f":
        if not np.isfinite(images).all() or images.min() < 0 or images.max() > 255:
            raise DataError(f"{where}: float images must hold values in [0, 1] or [0, 255].", argument="data")
        if images.max() <= 1.0:  # already scaled: the model's preprocessing divides by 255
            images = images * 255.0
    elif images.dtype != np.uint8:
        if images.dtype.kind not in "iu" or images.min() < 0 or images.max() > 255:
            raise DataError(
                f"{where}: integer images must hold bytes (0-255); received {images.dtype}.", argument="data"
            )
        images = images.astype("uint8")
    return images, labels.astype("int32")


def _read_folder(path: str, class_names: list[str] | None = None):
    """The images of PATH/<class>/<image files> as a list of RGB arrays, their labels and the classes."""
    from PIL import Image

    class_names = class_names or sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    if not class_names:
        raise DataError(f"{path!r} has no class sub-folders; expected PATH/<class>/<image files>.", argument="data")
    images, labels = [], []
    for label, name in enumerate(class_names):
        folder = os.path.join(path, name)
        for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if file.lower().endswith(_IMAGE_SUFFIXES):
                try:
                    images.append(np.asarray(Image.open(os.path.join(folder, file)).convert("RGB")))
                except OSError as error:
                    raise DataError(
                        f"cannot read the image {os.path.join(folder, file)!r} ({error}).", argument="data"
                    ) from None
                labels.append(label)
    if not images:
        raise DataError(f"no images ({', '.join(_IMAGE_SUFFIXES)}) under {path!r}.", argument="data")
    return images, np.array(labels, "int32"), class_names


def _stacked(groups: list[list[np.ndarray]], path: str, image_size: int | None) -> list[np.ndarray]:
    """Each group of images as one array; images of different sizes are first resized (bilinear) to
    `image_size` x `image_size`, as folders of photos usually need."""
    from PIL import Image

    shapes = sorted({image.shape for group in groups for image in group})
    if len(shapes) > 1:
        if not image_size:
            raise DataError(
                f"images under {path!r} differ in size ({shapes[:3]}...); give `image_size` N to resize them to N x N.",
                argument="data",
            )
        side = (image_size, image_size)
        groups = [
            [np.asarray(Image.fromarray(image).resize(side, Image.BILINEAR)) for image in group] for group in groups
        ]
    return [np.stack(group) for group in groups]


def _split(x, y, test_fraction: float, seed: int = 0):
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(len(x) * (1 - test_fraction))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def load_images(
    data: str | None = None,
    dataset: str | None = None,
    data_dir: str | None = None,
    log: Callable[[str], None] = print,
    image_size: int | None = None,
) -> ImageSplits:
    if data and dataset:
        raise DataError("pass either `data` (a path) or `dataset` (a name), not both.")
    class_names = None
    if data:
        if not os.path.exists(data):
            raise DataError(
                f"expected an IDX directory, an .npz file or an image folder; nothing is at {data!r}.", argument="data"
            )
        if data.endswith(".npz"):
            train, test = _load_npz(data)
        elif not os.path.isdir(data):
            raise DataError(
                f"expected an IDX directory, an .npz file or an image folder; {data!r} is a file "
                f"without the .npz suffix.",
                argument="data",
            )
        elif any(name.startswith("train-images-idx3") for name in os.listdir(data)):
            train, test = _load_idx_directory(data)
        elif os.path.isdir(os.path.join(data, "train")):
            train_images, train_labels, class_names = _read_folder(os.path.join(data, "train"))
            test_images, test_labels, _ = _read_folder(os.path.join(data, "test"), class_names)
            train_x, test_x = _stacked([train_images, test_images], data, image_size)
            train, test = (train_x, train_labels), (test_x, test_labels)
        else:
            images, labels, class_names = _read_folder(data)
            (x,) = _stacked([images], data, image_size)
            train, test = _split(x, labels, 0.1)
        source = f"local images {data!r}"
    elif dataset:
        instead = "`data` (an IDX directory, an .npz file or an image folder)"
        train, test = [_tfds_arrays(dataset, split, data_dir, instead) for split in ("train", "test")]
        source = f"tensorflow-datasets {dataset!r}"
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = np.round(digits.images * (255 / 16)).astype("uint8")[..., None]
        train, test = _split(x, digits.target.astype("int32"), 0.2)
        source = OFFLINE_IMAGES_SOURCE
    for split, (images, _) in (("training", train), ("test", test)):
        if len(images) == 0:
            raise DataError(f"{source}: the {split} split has no images; give more images.", argument="data")
    class_names = class_names or [str(i) for i in range(int(max(train[1].max(), test[1].max())) + 1)]
    if len(class_names) < 2:  # every prediction would be right: a test accuracy of 1.0 that means nothing
        raise DataError(f"{source}: a classifier needs at least two classes; found {class_names}.", argument="data")
    log(
        f"Data: {source}: {len(train[0]):,} training and {len(test[0]):,} test images of shape "
        f"{train[0].shape[1:]}, {len(class_names)} classes."
    )
    return ImageSplits(train, test, class_names, source)


def _tfds_arrays(name: str, split: str, data_dir: str | None, instead: str):
    images, labels = [], []
    for example in load_tfds(name, split, data_dir, instead=instead):
        images.append(example["image"])
        labels.append(example["label"])
    return np.stack(images), np.array(labels, "int32")
