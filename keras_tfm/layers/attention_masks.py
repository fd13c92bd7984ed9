"""Which keys each query of attention may see by position: causal (and within a sliding window), or the
filled part of a key/value cache; for queries that start at one position, or at each row's own."""

from __future__ import annotations

from keras import ops

from keras_tfm.layers.positions import is_per_row


def position_mask(query_length, key_length, offset, causal: bool, sliding_window: int | None = None):
    """A boolean mask broadcastable to `(batch, heads, query_length, key_length)`: with `causal`, each
    query (at position `offset + i`) sees the keys at or before it (and after it less `sliding_window`);
    otherwise it sees the keys before `offset + query_length` (a cache filled up to the current step).
    `offset`: an int or scalar, or `(batch,)` positions, one per row."""
    if is_per_row(offset):
        query_positions = ops.expand_dims(ops.expand_dims(offset, 1) + ops.arange(query_length)[None, :], 2)
        key_positions = ops.arange(key_length)[None, None, :]  # against (batch, query_length, 1)
        if not causal:
            last = ops.expand_dims(ops.expand_dims(offset + query_length, 1), 2)
            visible = ops.broadcast_to(key_positions < last, (ops.shape(offset)[0], query_length, key_length))
            return ops.expand_dims(visible, 1)
        visible = key_positions <= query_positions
        if sliding_window is not None:
            visible = ops.logical_and(visible, key_positions > query_positions - sliding_window)
        return ops.expand_dims(visible, 1)
    query_positions = ops.arange(query_length) + offset
    key_positions = ops.arange(key_length)
    if causal:
        visible = key_positions[None, :] <= query_positions[:, None]
        if sliding_window is not None:
            visible = ops.logical_and(visible, key_positions[None, :] > query_positions[:, None] - sliding_window)
    else:
        visible = ops.broadcast_to(key_positions[None, :] < offset + query_length, (query_length, key_length))
    return ops.expand_dims(visible, (0, 1))
