"""TokenPooling: each mode against NumPy's reading of sentence-transformers' Pooling, over real tokens only."""

import numpy as np
import pytest

from keras_tfm import layers
from keras_tfm.layers.token_pooling import MODES
from tests.checks import assert_close, to_numpy


def reference(mode: str, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    rows = []
    for vectors, real in zip(x, mask.astype(bool)):
        kept = vectors[real]
        weights = np.arange(1, len(vectors) + 1)[real][:, None]
        rows.append({
            "cls": vectors[0],
            "max": kept.max(0),
            "mean": kept.mean(0),
            "mean_sqrt_len_tokens": kept.sum(0) / np.sqrt(len(kept)),
            "weightedmean": (kept * weights).sum(0) / weights.sum(),
            "lasttoken": kept[-1],
        }[mode])  # fmt: skip
    return np.stack(rows)


def test_every_mode_pools_the_real_tokens_only(rng):
    x = rng.normal(size=(3, 6, 4)).astype("float32")
    mask = np.arange(6)[None] < np.array([[6], [3], [1]])
    changed = np.where(mask[..., None], x, 100.0).astype("float32")  # padding's vectors change nothing
    for mode in MODES:
        assert_close(layers.TokenPooling(mode)(changed, padding_mask=mask), reference(mode, x, mask), atol=1e-5)
    both = to_numpy(layers.TokenPooling(["lasttoken", "mean"])(x, padding_mask=mask))
    assert_close(both, np.concatenate([reference("lasttoken", x, mask), reference("mean", x, mask)], -1), atol=1e-5)
    assert_close(layers.TokenPooling("mean")(x), x.mean(1), atol=1e-5)  # no mask: every token is real


def test_unknown_modes_are_refused_by_name():
    for wrong in ("sum", (), ["mean", "median"]):
        with pytest.raises(ValueError, match=r"modes: TokenPooling: expected one or more of \('cls'"):
            layers.TokenPooling(wrong)
