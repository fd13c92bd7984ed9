"""A GGUF file's header read in one pass: its metadata as Python values and its tensors as NumPy views of
the mapped file.

The `gguf` package's `GGUFReader` makes a NumPy view of the map for every element of every metadata array:
1.7 s for SmolLM2's 49,152-token vocabulary and its merges, before the first weight (2-core Intel Xeon).
This reads the same header with `struct` in tens of milliseconds; the `gguf` package still names the
tensor types, gives their block sizes and dequantizes them.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

VERSIONS = (2, 3)  # GGUF versions with 64-bit counts (llama.cpp has written version 3 since 2023)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_ALIGNMENT = 32  # where `general.alignment` is not stated


class GGUFTensor(NamedTuple):
    """A tensor of the file: `shape` in GGUF's order (the fastest-varying dimension first); `data` a view of
    the mapped file, of the values (`shape` reversed) or, for a block-quantized type, of its bytes (rows of
    blocks), as `gguf.GGUFReader` gives it."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


class GGUFFile(NamedTuple):
    metadata: dict
    tensors: list[GGUFTensor]


def read(path) -> GGUFFile:
    """The metadata and tensors of the GGUF file at `path` (the file stays mapped while a tensor's `data`
    lives). A file that is cut short, states impossible sizes or is not GGUF raises ValueError."""
    mapped = np.memmap(path, mode="r").view(np.ndarray)  # a plain view: a memmap's slices cost microseconds each
    header = _Cursor(mapped)
    if bytes(header.view[:4]) != b"GGUF":
        raise ValueError("the GGUF magic is missing")
    header.offset = 4
    version = header.scalar("I")
    if version & 0xFFFF == 0:  # written for the other byte order
        header.order = ">" if header.order == "<" else "<"
        version = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version} cannot be read; versions {VERSIONS} can")
    tensor_count, kv_count = header.counted(header.scalar("Q"), 24), header.counted(header.scalar("Q"), 12)
    metadata = {"GGUF.version": version, "GGUF.tensor_count": tensor_count, "GGUF.kv_count": kv_count}
    for _ in range(kv_count):
        key = header.string()
        if key in metadata:
            raise ValueError(f"the metadata key {key!r} appears twice")
        metadata[key] = header.value(header.scalar("I"))
    infos = [header.tensor_info() for _ in range(tensor_count)]
    alignment = metadata.get("general.alignment", _ALIGNMENT)
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment is {alignment!r}; expected a power of two")
    start = -(-header.offset // alignment) * alignment
    return GGUFFile(metadata, _tensors(mapped, start, infos, header.order))


class _Cursor:
    """Reads the header's values one after another from `offset`."""

    def __init__(self, mapped: np.ndarray):
        self.view, self.offset, self.order = memoryview(mapped), 0, "<"

    def scalar(self, code: str):
        (value,) = struct.unpack_from(self.order + code, self.view, self.offset)
        self.offset += struct.calcsize(code)
        return value

    def counted(self, count: int, least_bytes: int) -> int:
        """`count` items that take at least `least_bytes` each: refused where the file cannot hold them (a
        damaged count would otherwise loop for hours)."""
        if count * least_bytes > len(self.view) - self.offset:
            raise ValueError(f"a count of {count} items runs past the file's end")
        return count

    def string(self) -> str:
        size = self.counted(self.scalar("Q"), 1)
        text = bytes(self.view[self.offset : self.offset + size]).decode("utf-8")
        self.offset += size
        return text

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        kind = self.scalar("I")
        if kind not in _SCALARS:  # strings and arrays: one at a time
            count = self.counted(self.scalar("Q"), 8)
            return [self.value(kind) for _ in range(count)]
        dtype = np.dtype(_SCALARS[kind]).newbyteorder(self.order)
        count = self.counted(self.scalar("Q"), dtype.itemsize)
        values = np.frombuffer(self.view, dtype, count, self.offset)
        self.offset += values.nbytes
        return values.tolist()

    def tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        """`(name, shape, type, offset)` of the next tensor."""
        name = self.string()
        dimensions = self.scalar("I")
        if dimensions > 8:  # GGML_MAX_DIMS is 4
            raise ValueError(f"tensor {name!r} states {dimensions} dimensions")
        shape = tuple(self.scalar("Q") for _ in range(dimensions))
        return name, shape, self.scalar("I"), self.scalar("Q")


def _tensors(mapped: np.ndarray, start: int, infos: list, order: str) -> list[GGUFTensor]:
    """The tensors of `infos`, their data at `start` plus each one's offset."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    plain = {"F32": "f4", "F16": "f2", "F64": "f8", "I8": "i1", "I16": "i2", "I32": "i4", "I64": "i8"}
    tensors, names = [], set()
    for name, shape, kind, offset in infos:
        if name in names:
            raise ValueError(f"tensor {name!r} appears twice")
        names.add(name)
        try:
            kind = GGMLQuantizationType(kind)
        except ValueError:
            raise ValueError(f"tensor {name!r} has the unknown type {kind}") from None
        values, dims = int(np.prod(shape, dtype=np.int64)), tuple(reversed(shape))
        block, size = GGML_QUANT_SIZES[kind]
        if kind.name in plain:
            dtype = np.dtype(plain[kind.name]).newbyteorder(order)
        else:
            if not dims or dims[-1] % block:
                raise ValueError(f"tensor {name!r}'s rows of {dims[-1:]} values are not whole {kind.name} blocks")
            dtype, dims = np.dtype("u1"), (*dims[:-1], dims[-1] // block * size)
        nbytes = values // block * size
        if start + offset + nbytes > mapped.size:
            raise ValueError(f"tensor {name!r} runs past the file's end")
        data = mapped[start + offset : start + offset + nbytes].view(dtype).reshape(dims)
        tensors.append(GGUFTensor(name, kind, shape, data))
    return tensors
