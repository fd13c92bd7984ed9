"""Text corpora for language-model recipes: local files, a named TFDS dataset, or the offline default.

The offline default is Python's own documentation (`pydoc_data.topics`, about 460k characters of
English prose and code that every CPython ships), so a recipe trains on a fresh machine with no
network and no arguments.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import re
import zipfile
from collections.abc import Callable

import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.data.tfds import load_tfds

OFFLINE_TEXT_SOURCE = "the offline default: Python's bundled documentation text (pydoc_data.topics)"


@dataclasses.dataclass
class TextSplits:
    train: str
    validation: str
    source: str


def offline_text() -> str:
    from pydoc_data import topics

    return "\n\n".join(topics.topics[name].strip() for name in sorted(topics.topics))


_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f]")  # control characters but tab and line breaks


def read_text(path: str, argument: str = "path") -> str:
    """Reads a UTF-8 text file (`.gz` too), every `.txt`/`.txt.gz` file under a directory or in a `.zip`
    (in name order), or several of these separated by commas. `argument`: the caller's argument that
    gave `path`, named by errors."""
    if "," in path:
        return "\n".join(read_text(part, argument) for part in path.split(",") if part)
    if path.endswith(".zip") and os.path.isfile(path):
        return "\n".join(text for _, text in read_zip_texts(path, argument))
    if os.path.isdir(path):
        files = sorted(
            os.path.join(root, name)
            for root, _, names in os.walk(path)
            for name in names
            if name.endswith((".txt", ".txt.gz"))
        )
        if not files:
            raise DataError(f"the directory {path!r} holds no .txt or .txt.gz files.", argument)
        return "\n".join(read_text(file, argument) for file in files)
    if not os.path.isfile(path):
        raise DataError(f"expected a text file or a directory of .txt files, but nothing is at {path!r}.", argument)
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as file:
                raw = file.read()
        else:
            with open(path, "rb") as file:
                raw = file.read()
        text = raw.decode("utf-8")
    except (OSError, EOFError) as error:
        raise DataError(f"{path!r} is corrupt or unreadable ({error}).", argument) from None
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path!r} is not UTF-8 text (undecodable byte at offset {error.start}); is it the right file?", argument
        ) from None
    if not text.strip():
        raise DataError(f"{path!r} is empty; expected text to train on.", argument)
    sample = text[:100_000]
    controls = len(_CONTROL.findall(sample))
    if controls > 0.001 * len(sample):  # bytes 0-31 decode as UTF-8, so a gzip of labels "is" text
        raise DataError(
            f"{path!r} looks binary, not text: {controls:,} control characters in its first {len(sample):,}; "
            "is it the right file?",
            argument,
        )
    return text


def read_zip_texts(path: str, argument: str = "path") -> list[tuple[str, str]]:
    """(member name, text) of every `.txt` member of a zip archive, in name order."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = sorted(n for n in archive.namelist() if n.endswith(".txt") and not n.endswith("README.txt"))
            texts = [(n, archive.read(n).decode("utf-8", errors="replace")) for n in names]
    except (zipfile.BadZipFile, OSError) as error:
        raise DataError(f"{path!r} is not a readable zip archive ({error}).", argument) from None
    if not texts:
        raise DataError(f"the archive {path!r} holds no .txt files.", argument)
    return texts


def load_labelled_text(path: str, argument: str = "path") -> tuple[list[str], np.ndarray, list[str]]:
    """Texts labelled by their folder (`.../<label>/<name>.txt`) from a zip archive or a directory,
    e.g. the movie reviews (`movie_reviews/pos/...`, `movie_reviews/neg/...`)."""
    if path.endswith(".zip") and os.path.isfile(path):
        items = read_zip_texts(path, argument)
    elif os.path.isdir(path):
        items = [
            (os.path.join(root, n), read_text(os.path.join(root, n), argument))
            for root, _, names in sorted(os.walk(path))
            for n in sorted(names)
            if n.endswith(".txt")
        ]
    else:
        raise DataError(
            f"expected a zip archive or a directory of <label>/<file>.txt; nothing is at {path!r}.", argument
        )
    labels_by_name = [
        name.replace("\\", "/").split("/")[-2] if "/" in name.replace("\\", "/") else "" for name, _ in items
    ]
    class_names = sorted(set(labels_by_name))
    if len(class_names) < 2:
        raise DataError(
            f"{path!r} needs at least two label folders (<label>/<file>.txt); found {class_names}.", argument
        )
    labels = np.array([class_names.index(label) for label in labels_by_name], "int32")
    return [text for _, text in items], labels, class_names


def split_text(text: str, validation_fraction: float = 0.1) -> tuple[str, str]:
    cut = int(len(text) * (1 - validation_fraction))
    return text[:cut], text[cut:]


def load_text(
    data: str | None = None,
    dataset: str | None = None,
    data_dir: str | None = None,
    validation_fraction: float = 0.1,
    log: Callable[[str], None] = print,
) -> TextSplits:
    """Train and validation text from `data` files, `dataset` (TFDS) or the offline default.

    Local text and the offline default are split by position: the first 90% trains, the rest validates
    (as nanoGPT does). A TFDS dataset uses its own train and validation (or test) splits.
    """
    if data and dataset:
        raise DataError("pass either `data` (a path) or `dataset` (a name), not both.")
    if data:
        train, validation = split_text(read_text(data, "data"), validation_fraction)
        source = f"local text {data!r}"
    elif dataset:
        train = _tfds_text(dataset, "train", data_dir)
        validation = None
        for split in ("validation", "test"):
            try:
                validation = _tfds_text(dataset, split, data_dir)
                break
            except DataError:
                continue
        if validation is None:
            train, validation = split_text(train, validation_fraction)
        source = f"tensorflow-datasets {dataset!r}"
    else:
        train, validation = split_text(offline_text(), validation_fraction)
        source = OFFLINE_TEXT_SOURCE
    log(f"Data: {source}: {len(train):,} training and {len(validation):,} validation characters.")
    return TextSplits(train, validation, source)


def _tfds_text(name: str, split: str, data_dir: str | None) -> str:
    pieces = []
    for example in load_tfds(name, split, data_dir, instead="`data` (a text file or a directory of .txt files)"):
        value = example["text"] if isinstance(example, dict) else example
        pieces.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
    return "\n".join(pieces)
