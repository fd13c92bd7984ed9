"""Layer scale (Touvron et al. 2021, CaiT): a learned per-channel factor on a residual branch's output, started
small so that a deep network begins close to the identity. DINOv2 and DeiT III use it."""

from __future__ import annotations

import keras

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import is_number


@keras.saving.register_keras_serializable(package="keras_tfm")
class LayerScale(keras.layers.Layer):
    """`x * gamma`, with `gamma` `(hidden_dim,)` learned, started at `init_value`.

    Args:
        init_value: the factor each channel starts at (DINOv2: 1.0 in its checkpoints, 1e-5 to train).

    Example:
    >>> scale = LayerScale(0.5)
    >>> keras.ops.convert_to_numpy(scale(np.ones((1, 2, 4), "float32")))[0, 0].tolist()
    [0.5, 0.5, 0.5, 0.5]
    """

    def __init__(self, init_value: float = 1e-5, **kwargs):
        if not is_number(init_value):
            raise InputError(f"expected a finite number; received {init_value!r}.", "init_value", "LayerScale")
        super().__init__(**kwargs)
        self.init_value = float(init_value)

    def build(self, inputs_shape):
        self.gamma = self.add_weight(
            name="gamma", shape=(inputs_shape[-1],), initializer=keras.initializers.Constant(self.init_value)
        )

    def call(self, inputs):
        return inputs * keras.ops.cast(self.gamma, inputs.dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "init_value": self.init_value}
