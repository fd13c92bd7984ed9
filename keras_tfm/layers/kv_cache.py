"""The key/value cache of attention: its layout, `(batch, 2, heads, length, dim)` with the keys and
values of each head in order of position, and how new entries are written into it."""

from __future__ import annotations

import contextlib

import numpy as np
from keras import ops

from keras_tfm.layers.positions import is_per_row

_CACHE_WRITERS: list = []  # `write(cache, start, entries)` that `write` uses inside `cache_writer`


@contextlib.contextmanager
def cache_writer(write):
    """Inside this block `MultiHeadAttention.update_cache` writes new keys and values with
    `write(cache, start, entries)` instead of `ops.slice_update`, which returns a new cache: a decoding
    loop that never reads an old cache again may write it in place (`generation.compiled` does on
    PyTorch)."""
    _CACHE_WRITERS.append(write)
    try:
        yield
    finally:
        _CACHE_WRITERS.pop()


def write(cache, index, entries):
    """`cache` with `entries` `(batch, 2, heads, new, dim)` written at position `index` (an int or scalar,
    or one position per row `(batch,)`): one update of the joint cache, since a functional update
    copies its input (PyTorch)."""
    writer = _CACHE_WRITERS[-1] if _CACHE_WRITERS else (write_rows if is_per_row(index) else ops.slice_update)
    return writer(cache, (0, 0, 0, index, 0), entries)


def write_rows(cache, start: tuple, entries):
    """`cache` `(batch, 2, heads, length, dim)` with each row's one new position `entries[b, :, :, 0]`
    written at its own position `start[3][b]`: a scatter of the new entries only."""
    rows, _, heads, _, dim = ops.shape(entries)
    count = rows * 2 * heads
    positions = ops.reshape(ops.cast(start[3], "int32"), (rows, 1))
    position = ops.reshape(ops.broadcast_to(positions, (rows, 2 * heads)), (count, 1))
    if isinstance(rows, int):  # the (row, kind, head) of each entry as one constant: a few graph operations
        # in each layer rather than a hundred (TensorFlow traces and compiles every one)
        places = np.stack(np.unravel_index(np.arange(count), (rows, 2, heads)), axis=1).astype("int32")
    else:
        places = ops.stack([ops.arange(count) // (2 * heads), ops.arange(count) // heads % 2,
                            ops.arange(count) % heads], axis=1)  # fmt: skip
    indices = ops.concatenate([ops.convert_to_tensor(places, "int32"), position], axis=1)
    return ops.scatter_update(cache, indices, ops.reshape(entries, (count, dim)))


def to_cache_layout(heads):
    """`(batch, length, heads, dim)` -> the cache's `(batch, heads, length, dim)`: heads before
    positions, so that XLA's batched matmuls over (batch, heads) read the cache without
    transposing it at every decoding step."""
    return ops.transpose(heads, (0, 2, 1, 3))


def from_cache_layout(cached):
    return ops.transpose(cached, (0, 2, 1, 3))
