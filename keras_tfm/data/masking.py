"""Masked-language-model inputs: pack a token stream into [CLS] ... [SEP] sequences, and mask them
dynamically with keras-hub's `MaskedLMMaskGenerator` (BERT's 15% / 80-10-10 recipe), seeded per batch."""

from __future__ import annotations

import numpy as np

from keras_tfm.data.errors import DataError


def pack_sequences(ids: np.ndarray, length: int, cls_id: int, sep_id: int, name: str = "training") -> np.ndarray:
    """Cuts `ids` into `(count, length)` rows of `[CLS] + length - 2 tokens + [SEP]` (the tail is dropped)."""
    count = len(ids) // (length - 2)
    if count < 1:
        raise DataError(f"--data: the {name} text has {len(ids)} tokens, fewer than one sequence of {length - 2}.")
    body = np.asarray(ids[: count * (length - 2)]).reshape(count, length - 2)
    return np.concatenate([np.full((count, 1), cls_id), body, np.full((count, 1), sep_id)], axis=1).astype("int32")


class DynamicMasker:
    """New masks on every call, reproducible from `seed_parts` (e.g. `[seed, epoch, step]`).

    Returns `(inputs, mask_ids, mask_weights)`: `inputs` holds keras-hub's names, "token_ids",
    "padding_mask" and "mask_positions"; `mask_ids` are the original tokens at the masked positions
    (the labels) and `mask_weights` is 0 where fewer than `mask_positions` tokens were selected.
    """

    def __init__(self, vocabulary_size: int, mask_id: int, special_ids: list[int], pad_id: int = 0,
                 mask_rate: float = 0.15, mask_positions: int = 20):
        import keras_hub

        self.pad_id = pad_id
        self.generator = keras_hub.layers.MaskedLMMaskGenerator(
            vocabulary_size=vocabulary_size, mask_selection_rate=mask_rate, mask_token_id=mask_id,
            mask_selection_length=mask_positions, unselectable_token_ids=list(special_ids))

    def __call__(self, rows: np.ndarray, seed_parts: list[int]):
        import tensorflow as tf  # the generator runs tf.text ops; its randomness follows TF's global seed

        tf.random.set_seed(int(np.random.default_rng(list(seed_parts)).integers(1 << 30)))
        out = {k: np.asarray(v) for k, v in self.generator(rows).items()}
        inputs = {"token_ids": out["token_ids"], "padding_mask": rows != self.pad_id,
                  "mask_positions": out["mask_positions"]}
        return inputs, out["mask_ids"], out["mask_weights"]
