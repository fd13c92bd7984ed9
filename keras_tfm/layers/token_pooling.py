"""One vector per sequence from its tokens' vectors: the poolings of sentence-transformers."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError

MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


@keras.saving.register_keras_serializable(package="keras_tfm")
class TokenPooling(keras.layers.Layer):
    """Pools `(batch, length, dim)` token vectors into `(batch, dim * len(modes))`, over the real tokens
    only (right padding), each mode as sentence-transformers' `Pooling` computes it, concatenated in
    the order given.

    Args:
        modes: one of, or a tuple of, "cls" (the first token), "max", "mean", "mean_sqrt_len_tokens"
            (the sum over the square root of the count), "weightedmean" (token i weighs i + 1) and
            "lasttoken" (the last real token).

    Call arguments:
        token_vectors: `(batch, length, dim)`.
        padding_mask: `(batch, length)`, True (or 1) at real tokens; default: every token is real.

    Example:
    >>> pooling = TokenPooling("mean")
    >>> vectors = np.arange(12, dtype="float32").reshape(1, 3, 4)
    >>> keras.ops.convert_to_numpy(pooling(vectors, padding_mask=np.array([[1, 1, 0]]))).tolist()
    [[2.0, 3.0, 4.0, 5.0]]
    """

    def __init__(self, modes: str | tuple | list = "mean", **kwargs):
        super().__init__(**kwargs)
        names = (modes,) if isinstance(modes, str) else tuple(modes)
        if not names or any(name not in MODES for name in names):
            raise InputError(f"expected one or more of {MODES}; received {modes!r}.", "modes", caller="TokenPooling")
        self.modes = names

    def call(self, token_vectors, padding_mask=None):
        if padding_mask is None:
            padding_mask = ops.ones(ops.shape(token_vectors)[:2], "bool")
        mask = ops.expand_dims(ops.cast(padding_mask, token_vectors.dtype), -1)
        count = ops.maximum(ops.sum(mask, axis=1), 1e-9)
        return ops.concatenate([self._pool(mode, token_vectors, mask, count) for mode in self.modes], axis=-1)

    @staticmethod
    def _pool(mode: str, x, mask, count):
        if mode == "cls":
            return x[:, 0]
        if mode == "max":
            return ops.max(ops.where(mask > 0, x, ops.full_like(x, float("-inf"))), axis=1)
        if mode in ("mean", "mean_sqrt_len_tokens"):
            return ops.sum(x * mask, axis=1) / (count if mode == "mean" else ops.sqrt(count))
        if mode == "weightedmean":
            weights = mask * ops.cast(ops.reshape(ops.arange(1, ops.shape(x)[1] + 1), (1, -1, 1)), x.dtype)
            return ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1e-9)
        last = ops.maximum(ops.cast(ops.sum(mask[..., 0], axis=1), "int32") - 1, 0)  # lasttoken
        return ops.take_along_axis(x, ops.reshape(last, (-1, 1, 1)), axis=1)[:, 0]

    def compute_output_shape(self, token_vectors_shape, padding_mask_shape=None):
        return (token_vectors_shape[0], token_vectors_shape[-1] * len(self.modes))

    def get_config(self) -> dict:
        return {**super().get_config(), "modes": list(self.modes)}
