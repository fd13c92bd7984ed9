"""Prompts and stop ids as the decoding loop takes them: token ids checked against the vocabulary, text
told from ids, ragged prompts right-padded into one buffer with room for the new tokens."""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.generation.config import check_setting


def as_token_ids(values, argument: str, vocabulary_size: int, mask=None) -> np.ndarray:
    """`values` as an int32 array, refusing what is not a token id of the vocabulary (at `mask`)."""
    try:
        array = np.asarray(values)
    except ValueError:  # ragged nesting
        array = np.asarray(values, dtype=object)
    if array.dtype == object or array.dtype.kind in "USb":
        raise InputError(f"must hold integer token ids; received {_short(values)}.", argument)
    if array.dtype.kind == "f" and np.array_equal(array, np.round(array)):
        array = array.astype("int64")
    if array.size and array.dtype.kind not in "iu":
        raise InputError(f"must hold integer token ids; received {array.dtype} values.", argument)
    real = array if mask is None else array[mask]
    if real.size and (real.min() < 0 or real.max() >= vocabulary_size):
        wrong = real.min() if real.min() < 0 else real.max()
        raise InputError(f"must hold ids in [0, vocabulary_size={vocabulary_size}); received {wrong}.", argument)
    return array.astype("int32")


def stop_ids(stop_token_ids, vocabulary_size: int) -> np.ndarray:
    """`stop_token_ids` (one id, or a flat list of ids) as a 1-D int32 array of ids of the vocabulary."""
    check_setting("stop_token_ids", stop_token_ids)
    return as_token_ids(np.asarray(stop_token_ids, "int64").reshape(-1), "stop_token_ids", vocabulary_size)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def texts(inputs) -> str | list[str] | None:
    """`inputs` if it is text (a string, or a non-empty list of strings), else None (token ids). A list
    that mixes text and ids is refused."""
    if isinstance(inputs, str):
        return inputs
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(text, str) for text in inputs):
        return list(inputs)
    if isinstance(inputs, (list, tuple)) and any(isinstance(item, str) for item in inputs):
        kinds = sorted({type(item).__name__ for item in inputs})
        raise InputError(
            f"expected text (a string or a list of strings) or token ids (lists of ints); received a list of "
            f"{' and '.join(kinds)}.",
            "token_ids",
        )
    return None


def right_padded(rows, argument: str, vocabulary_size: int, pad_token_id: int) -> np.ndarray:
    """A list of id lists as one `(batch, longest)` int32 array, padded on the right."""
    rows = [as_token_ids(row, argument, vocabulary_size) for row in rows]
    ids = np.full((len(rows), max(len(row) for row in rows)), pad_token_id, "int32")
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids


def prepare_prompts(token_ids, padding_mask, max_new_tokens: int, pad_token_id: int, vocabulary_size: int):
    """Right-padded `(batch, prompt_length + max_new_tokens)` buffer, its prompt mask, and lengths.

    `token_ids` is a list of id lists, or an array `(batch, length)` (with `padding_mask` when rows
    are padded; padding must be on the right)."""
    if isinstance(token_ids, (list, tuple)) and token_ids and isinstance(token_ids[0], (list, tuple, np.ndarray)):
        ids = right_padded(token_ids, "token_ids", vocabulary_size, pad_token_id)
        lengths = np.array([len(row) for row in token_ids])
        mask = np.arange(ids.shape[1])[None] < lengths[:, None]
    else:
        ids = np.asarray(ops.convert_to_numpy(token_ids))
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2:
            raise InputError(f"must be (batch, length) or a list of lists; received shape {ids.shape}.", "token_ids")
        mask = (
            np.ones(ids.shape, bool) if padding_mask is None else np.asarray(ops.convert_to_numpy(padding_mask), bool)
        )
        if mask.shape != ids.shape:
            raise InputError(f"must have the shape of `token_ids` {ids.shape}; received {mask.shape}.", "padding_mask")
        ids = as_token_ids(ids, "token_ids", vocabulary_size, mask)
        lengths = mask.sum(axis=1)
        if not np.array_equal(mask, np.arange(ids.shape[1])[None] < lengths[:, None]):
            raise InputError("must mark padding on the right of each prompt only.", "padding_mask")
    if ids.shape[0] == 0:
        raise InputError(f"must hold at least one prompt; received shape {ids.shape}.", "token_ids")
    if lengths.min() < 1:
        raise InputError("every prompt needs at least one token; received an empty prompt.", "token_ids")
    if max_new_tokens < 1:
        raise InputError(f"must be >= 1; received {max_new_tokens}.", "max_new_tokens")
    total = ids.shape[1] + max_new_tokens
    buffer = np.full((ids.shape[0], total), pad_token_id, "int32")
    buffer[:, : ids.shape[1]] = np.where(mask, ids, pad_token_id)
    prompt_mask = np.zeros((ids.shape[0], total), bool)
    prompt_mask[:, : ids.shape[1]] = mask
    return buffer, prompt_mask, lengths.astype("int32")
