"""Stochastic depth (Huang et al. 2016): in training, a residual branch is dropped for a whole example at a
time (its output zeroed, the kept ones scaled by 1 / keep), so that a deep network trains as an ensemble of
shallower ones. Identity at inference."""

from __future__ import annotations

import keras

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import is_number


@keras.saving.register_keras_serializable(package="keras_tfm")
class DropPath(keras.layers.Layer):
    """Zeroes each example's `inputs` with probability `rate` in training (the rest scaled by 1 / (1 - rate)).

    Args:
        rate: the probability of dropping an example's branch, in [0, 1).
        seed: of the draws.

    Example:
    >>> drop = DropPath(0.5, seed=0)
    >>> kept = keras.ops.convert_to_numpy(drop(np.ones((8, 3, 4), "float32"), training=True))[:, 0, 0]
    >>> sorted(set(kept.tolist())) in ([0.0, 2.0], [0.0], [2.0])
    True
    """

    def __init__(self, rate: float = 0.0, seed: int | None = None, **kwargs):
        if not is_number(rate) or not 0 <= rate < 1:
            raise InputError(f"expected a number in [0, 1); received {rate!r}.", "rate", "DropPath")
        super().__init__(**kwargs)
        self.rate, self.seed = float(rate), seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, inputs, training=None):
        if not training or self.rate == 0:
            return inputs
        shape = (keras.ops.shape(inputs)[0],) + (1,) * (len(inputs.shape) - 1)
        keep = keras.random.uniform(shape, seed=self.seed_generator) >= self.rate
        return inputs * keras.ops.cast(keep, inputs.dtype) / (1.0 - self.rate)

    def get_config(self) -> dict:
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}
