"""Masked-language-model inputs: pack a token stream into [CLS] ... [SEP] sequences, and mask them
dynamically (BERT's 15% / 80-10-10 recipe, keras-hub's `MaskedLMMaskGenerator` interface), seeded per batch."""

from __future__ import annotations

import numpy as np

from keras_tfm.data.errors import DataError


def pack_sequences(ids: np.ndarray, length: int, cls_id: int, sep_id: int, name: str = "training") -> np.ndarray:
    """Cuts `ids` into `(count, length)` rows of `[CLS] + length - 2 tokens + [SEP]` (the tail is dropped)."""
    count = len(ids) // (length - 2)
    if count < 1:
        raise DataError(
            f"the {name} text has {len(ids)} tokens, fewer than one sequence of {length - 2}.", argument="data"
        )
    body = np.asarray(ids[: count * (length - 2)]).reshape(count, length - 2)
    return np.concatenate([np.full((count, 1), cls_id), body, np.full((count, 1), sep_id)], axis=1).astype("int32")


def pack_rows(rows: list, length: int, cls_id: int, sep_id: int, pad_id: int) -> np.ndarray:
    """Each row as `[CLS] + its first length - 2 tokens + [SEP]`, padded to `length` (one text per row)."""
    packed = np.full((len(rows), length), pad_id, "int32")
    for out, row in zip(packed, rows):
        kept = [cls_id, *np.asarray(row)[: length - 2].tolist(), sep_id]
        out[: len(kept)] = kept
    return packed


class DynamicMasker:
    """BERT's dynamic masking, reproducible from `seed_parts` (e.g. `[seed, epoch, step]`): each
    token that is not special is selected with probability `mask_rate` (at most `mask_positions` per
    row, chosen at random); a selected token becomes [MASK] with probability 0.8, a random token with
    0.1, and stays itself with 0.1.

    This follows keras-hub's `MaskedLMMaskGenerator` (same arguments, same outputs), but in NumPy with
    an explicit generator: keras-hub's layer draws from TensorFlow's stateful random ops, which give
    different masks for the same seed, so a resumed run would not see the batches of the run it resumes.

    Returns `(inputs, mask_ids, mask_weights)`: `inputs` holds keras-hub's names, "token_ids",
    "padding_mask" and "mask_positions"; `mask_ids` are the original tokens at the masked positions
    (the labels) and `mask_weights` is 0 where fewer than `mask_positions` tokens were selected.
    """

    def __init__(
        self,
        vocabulary_size: int,
        mask_id: int,
        special_ids: list[int],
        pad_id: int = 0,
        mask_rate: float = 0.15,
        mask_positions: int = 20,
        mask_token_rate: float = 0.8,
        random_token_rate: float = 0.1,
    ):
        self.vocabulary_size = vocabulary_size
        self.mask_id = mask_id
        self.special_ids = np.asarray(list(special_ids))
        self.pad_id = pad_id
        self.mask_rate = mask_rate
        self.mask_positions = mask_positions
        self.mask_token_rate = mask_token_rate
        self.random_token_rate = random_token_rate

    def __call__(self, rows: np.ndarray, seed_parts: list[int]):
        rng = np.random.default_rng(list(seed_parts))
        rows = np.asarray(rows)
        batch, length = rows.shape
        chosen = (rng.random(rows.shape) < self.mask_rate) & ~np.isin(rows, self.special_ids)
        # keep at most `mask_positions` per row, picked at random, then list them in position order
        priority = np.where(chosen, rng.random(rows.shape), np.inf)
        picked = np.argsort(priority, axis=1)[:, : self.mask_positions]
        valid = np.take_along_axis(chosen, picked, axis=1)
        picked = np.sort(np.where(valid, picked, length), axis=1)
        valid = picked < length
        positions = np.where(valid, picked, 0).astype("int32")
        labels = np.where(valid, np.take_along_axis(rows, positions, axis=1), 0).astype("int32")
        action = rng.random(positions.shape)
        replacement = np.where(
            action < self.mask_token_rate,
            self.mask_id,
            np.where(
                action < self.mask_token_rate + self.random_token_rate,
                rng.integers(0, self.vocabulary_size, positions.shape),
                labels,
            ),
        )
        token_ids = rows.copy()
        row_index = np.nonzero(valid)[0]
        token_ids[row_index, positions[valid]] = replacement[valid]
        inputs = {
            "token_ids": token_ids.astype("int32"),
            "padding_mask": rows != self.pad_id,
            "mask_positions": positions,
        }
        return inputs, labels, valid.astype("float32")
