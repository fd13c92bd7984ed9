"""What `MultiHeadAttention` refuses of its inputs' shapes, named in the error: keys and values of another batch
or length than they must have, and a cache position per row that writes more than one position."""

from __future__ import annotations

from keras_tfm.errors import InputError
from keras_tfm.layers.positions import is_per_row


def check_inputs(query, value, key) -> None:
    """Refuses keys and values of another batch than the query's, or of different lengths."""
    for name, tensor in (("value", value), ("key", key)):
        if len(tensor.shape) != 3 or static_dims_differ(tensor.shape[:1], query.shape[:1]):
            raise InputError(
                f"`{name}` must have shape (batch, length, features) with the query's "
                f"batch {shown(query.shape[:1])[0]}; received shape {tuple(tensor.shape)}.",
                caller="MultiHeadAttention",
            )
    if static_dims_differ(key.shape[:2], value.shape[:2]):  # PyTorch's einsum would broadcast a length of 1
        raise InputError(
            f"`key` and `value` must have the same batch and length; received shapes "
            f"{tuple(key.shape)} and {tuple(value.shape)}.",
            caller="MultiHeadAttention",
        )


def static_dims_differ(received, expected) -> bool:
    """Whether two shapes differ in a dimension both know (ints; None or a tensor is unknown)."""
    return any(isinstance(r, int) and isinstance(e, int) and r != e for r, e in zip(received, expected))


def shown(shape) -> tuple:
    """A shape for an error message: unknown dimensions (tensors while tracing) as None."""
    return tuple(d if isinstance(d, int) else None for d in shape)


def check_per_row(index, value) -> None:
    """Refuses a per-row `cache_update_index` (a `(batch,)` tensor) of another batch than `value`'s, or
    with more than one new position per row."""
    if is_per_row(index) and (value.shape[1] != 1 or static_dims_differ(index.shape, value.shape[:1])):
        raise InputError(
            f"a `cache_update_index` per row, of shape (batch,), writes one position per row; received "
            f"shape {tuple(index.shape)} for `value` of shape {tuple(value.shape)}.",
            caller="MultiHeadAttention",
        )
