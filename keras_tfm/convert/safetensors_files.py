"""Safetensors files read one tensor at a time, and written in the model's dtype: a checkpoint's weights
as a mapping whose values are read from disk when asked for, so that loading never holds the whole state
dict in memory.

The format is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and byte
range) and the raw bytes. `safetensors.safe_open` streams too, but its NumPy reader has no bfloat16 (the
dtype of most published checkpoints) and its PyTorch reader needs PyTorch; here a bfloat16 tensor is read
as `ml_dtypes.bfloat16` (NumPy's bfloat16, which Keras depends on), kept in its dtype until a variable
takes it; written, float32 rounded to its top half (to nearest, ties to even), as safetensors' own NumPy
writer cannot.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping

import ml_dtypes
import numpy as np

from keras_tfm.errors import CheckpointError

DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_header(path: str) -> tuple[dict, int]:
    """(the tensors' entries by name, the offset of the data) of a safetensors file, checked against the
    file's size: a truncated or damaged file is a `CheckpointError` naming it."""
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        start = file.read(8)
        length = struct.unpack("<Q", start)[0] if len(start) == 8 else -1
        if not 0 < length <= size - 8:
            raise CheckpointError(
                f"cannot read {path!r}: not a safetensors file (or truncated): no header.", caller="from_huggingface"
            )
        try:
            header = json.loads(file.read(length))
        except ValueError:
            raise CheckpointError(
                f"cannot read {path!r}: its safetensors header is damaged.", caller="from_huggingface"
            ) from None
    header.pop("__metadata__", None)
    for name, entry in header.items():
        if entry.get("dtype") not in DTYPES:
            raise CheckpointError(
                f"cannot read {path!r}: tensor {name!r} has dtype {entry.get('dtype')!r}, which is not read here.",
                caller="from_huggingface",
            )
        end = entry["data_offsets"][1]
        if 8 + length + end > size:
            raise CheckpointError(
                f"cannot read {path!r}: truncated: its tensor {name!r} ends at byte {8 + length + end:,}, and the file has "
                f"{size:,} bytes. Download or copy it again.",
                caller="from_huggingface",
            )
    return header, 8 + length


def checkpoint_dtype(paths: list[str]) -> str:
    """The floating dtype most of the checkpoint's values are stored in: "float32", "bfloat16" or "float16"."""
    counts: dict[str, int] = {}
    for path in paths:
        for entry in read_header(path)[0].values():
            counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + int(np.prod(entry["shape"], dtype=np.int64))
    floating = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float32"}
    stored = max((d for d in counts if d in floating), key=counts.get, default="F32")
    return floating[stored]


class SafetensorsWeights(Mapping):
    """The tensors of one or more safetensors files by name, each read from disk when it is looked up
    and not kept, in its stored dtype (bfloat16 as `ml_dtypes.bfloat16`)."""

    def __init__(self, paths: list[str]):
        self.paths = list(paths)
        self._where: dict[str, tuple[str, dict, int]] = {}
        for path in paths:
            header, data_start = read_header(path)
            for name, entry in header.items():
                self._where[name] = (path, entry, data_start)

    def __getitem__(self, name: str) -> np.ndarray:
        """The tensor `name` in its stored dtype (bfloat16 as `ml_dtypes.bfloat16`)."""
        path, entry, data_start = self._where[name]
        begin, end = entry["data_offsets"]
        dtype, shape = DTYPES[entry["dtype"]], tuple(entry["shape"])
        array = np.empty(shape, dtype)
        # read into the array itself: a memory map's pages would count against the process as much again
        target, done = memoryview(array.reshape(-1).view(np.uint8)), 0
        with open(path, "rb", buffering=0) as file:
            file.seek(data_start + begin)
            while done < end - begin:  # one read returns at most 2 GiB on Linux
                read = file.readinto(target[done:])
                if not read:
                    raise CheckpointError(
                        f"cannot read {path!r}: it ended inside tensor {name!r}.", caller="from_huggingface"
                    )
                done += read
        return array

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def shape(self, name: str) -> tuple:
        return tuple(self._where[name][1]["shape"])

    def values_count(self) -> int:
        """How many values the tensors hold together."""
        return sum(int(np.prod(entry["shape"], dtype=np.int64)) for _, entry, _ in self._where.values())


def available_memory() -> int | None:
    """Bytes of memory the system can give this process now (Linux's MemAvailable), or None elsewhere."""
    try:
        with open("/proc/meminfo") as file:
            return next(int(line.split()[1]) * 1024 for line in file if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def write(weights: dict[str, np.ndarray], path: str, dtype: str = "float32") -> None:
    """Writes float32 `weights` to a safetensors file at `path` as `dtype` ("float32", "bfloat16" or
    "float16"), with the metadata transformers reads; one tensor converted at a time."""
    code = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[dtype]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, array in weights.items():
        size = int(np.prod(np.shape(array), dtype=np.int64)) * np.dtype(DTYPES[code]).itemsize
        header[name] = {"dtype": code, "shape": list(np.shape(array)), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded)
        for array in weights.values():  # ml_dtypes rounds float32 to bfloat16 to nearest, ties to even
            file.write(np.ascontiguousarray(array).astype(DTYPES[code], copy=False).tobytes())
