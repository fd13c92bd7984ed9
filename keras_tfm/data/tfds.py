"""Named datasets through tensorflow-datasets, with a clear message when they cannot be had.

TFDS retries an unreachable download for minutes; so before downloading we check that the network
answers at all and fail at once with what to pass instead.
"""

from __future__ import annotations

import socket

from keras_tfm.data.errors import DataError

_PROBE_HOST = ("storage.googleapis.com", 443)


def network_available(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection(_PROBE_HOST, timeout=timeout).close()
        return True
    except OSError:
        return False


def load_tfds(name: str, split: str, data_dir: str | None = None, instead: str = "`data` (local files)"):
    """Returns `tfds.as_numpy(tfds.load(name, split=split))`, or raises `DataError` saying what to do;
    `instead`: the argument that reads local files, as the message should suggest it."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError(
            f"{name!r} needs tensorflow-datasets, which is not installed "
            f"(pip install 'keras_tfm[data]'); or pass {instead} to use local files.",
            "dataset",
        ) from None
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as error:  # tfds raises its own DatasetNotFoundError and friends
        raise DataError(f"tensorflow-datasets does not know {name!r} ({_first_line(error)}).", "dataset") from None
    if not builder.is_prepared() and not network_available():
        raise DataError(
            f"{name!r} is not downloaded yet and this machine has no network; "
            f"pass {instead} to train on local files, or leave both out for the offline default.",
            "dataset",
        )
    try:
        return tfds.as_numpy(tfds.load(name, split=split, data_dir=data_dir))
    except Exception as error:
        raise DataError(
            f"{name!r} (split {split!r}) could not be loaded: {_first_line(error)}. Pass {instead} instead.",
            "dataset",
        ) from None


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]
