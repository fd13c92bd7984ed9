"""A masked autoencoder's decoder (He et al. 2022, MAE): the encoder's tokens of the visible patches, filled up
with a learned mask token at the hidden patches and put back in raster order, then a few transformer blocks
predict every patch's pixels."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.blocks import EncoderBlock


def mae_position_table(grid_size: int, dim: int) -> np.ndarray:
    """MAE's fixed 2-D sin-cos positions `(1 + grid_size**2, dim)`, a zero row for the class token first: per
    patch `[sin(col w), cos(col w), sin(row w), cos(row w)]` at `dim / 4` frequencies `w = 10000**(-i / (dim /
    4))` (the published checkpoints' order, columns first)."""
    omega = 1.0 / 10000.0 ** (np.arange(dim // 4, dtype="float64") / (dim // 4))
    rows, cols = np.meshgrid(np.arange(grid_size, dtype="float64"), np.arange(grid_size, dtype="float64"),
                             indexing="ij")  # fmt: skip
    by_col, by_row = np.outer(cols.ravel(), omega), np.outer(rows.ravel(), omega)
    table = np.concatenate([np.sin(by_col), np.cos(by_col), np.sin(by_row), np.cos(by_row)], axis=1)
    return np.concatenate([np.zeros((1, dim)), table]).astype("float32")


@keras.saving.register_keras_serializable(package="keras_tfm")
class MaskedImageDecoder(keras.layers.Layer):
    """`(batch, 1 + kept, encoder_dim)` tokens (class token first) and `ids_restore` `(batch, patches)` ->
    `(batch, patches, patch_dim)` predicted pixels: `dense(tokens)`, the mask token appended for the hidden
    patches, all put back in raster order (`ids_restore[b, i]`: where patch `i` sits in the kept-then-hidden
    order), + fixed sin-cos positions, pre-norm blocks, LayerNorm, a Dense to the pixels of a patch.

    Args:
        grid_size: patches per side of the (square) image; the position table's grid.
        patch_dim: the values of a patch, `patch_size**2 * channels`.
        hidden_dim, num_layers, num_heads, intermediate_dim: the decoder's blocks.
        layer_norm_epsilon: of its LayerNorms.

    Example:
    >>> decoder = MaskedImageDecoder(grid_size=4, patch_dim=48, hidden_dim=16, num_layers=1, num_heads=2,
    ...                              intermediate_dim=32)
    >>> restore = np.stack([np.random.permutation(16) for _ in range(2)])
    >>> tuple(decoder(np.zeros((2, 1 + 4, 24), "float32"), restore).shape)  # 4 of 16 patches seen
    (2, 16, 48)
    """

    def __init__(self, grid_size: int, patch_dim: int, hidden_dim: int, num_layers: int, num_heads: int,
                 intermediate_dim: int, layer_norm_epsilon: float = 1e-12, **kwargs):  # fmt: skip
        check_arguments("MaskedImageDecoder", locals())
        super().__init__(**kwargs)
        self.grid_size, self.patch_dim, self.hidden_dim = grid_size, patch_dim, hidden_dim
        self.num_layers, self.num_heads, self.intermediate_dim = num_layers, num_heads, intermediate_dim
        self.layer_norm_epsilon = layer_norm_epsilon
        policy = self.dtype_policy
        self.embed = keras.layers.Dense(hidden_dim, dtype=policy, name="embed")
        self.blocks = [EncoderBlock(num_heads, intermediate_dim, norm_first=True, layer_norm_epsilon=layer_norm_epsilon,
                                    dtype=policy, name=f"block_{i}") for i in range(num_layers)]  # fmt: skip
        self.norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy, name="norm")
        self.prediction = keras.layers.Dense(patch_dim, dtype=policy, name="prediction")

    def build(self, tokens_shape, ids_restore_shape=None):
        self.mask_token = self.add_weight(name="mask_token", shape=(1, 1, self.hidden_dim),
                                          initializer=keras.initializers.RandomNormal(stddev=0.02))  # fmt: skip
        table = mae_position_table(self.grid_size, self.hidden_dim)
        self.positions = self.add_weight(name="positions", shape=table.shape, trainable=False,
                                         initializer=keras.initializers.Constant(table))  # fmt: skip
        self.embed.build(tokens_shape)
        for block in self.blocks:
            block.build((None, None, self.hidden_dim))
        self.norm.build((None, None, self.hidden_dim))
        self.prediction.build((None, None, self.hidden_dim))
        self.built = True

    def call(self, tokens, ids_restore, training=None):
        x = self.embed(tokens)
        batch, patches = ops.shape(ids_restore)[0], ops.shape(ids_restore)[1]
        hidden = ops.broadcast_to(ops.cast(self.mask_token, x.dtype), (batch, patches + 1 - ops.shape(x)[1],
                                  self.hidden_dim))  # fmt: skip
        shuffled = ops.concatenate([x[:, 1:], hidden], axis=1)
        restore = ops.expand_dims(ops.cast(ids_restore, "int32"), -1)
        x = ops.concatenate([x[:, :1], ops.take_along_axis(shuffled, restore, axis=1)], axis=1)
        x = x + ops.cast(self.positions, x.dtype)[None]
        for block in self.blocks:
            x = block(x, training=training)
        return self.prediction(self.norm(x))[:, 1:]

    def compute_output_shape(self, tokens_shape, ids_restore_shape=None):
        return (tokens_shape[0], None if ids_restore_shape is None else ids_restore_shape[1], self.patch_dim)

    def get_config(self) -> dict:
        return {**super().get_config(), "grid_size": self.grid_size, "patch_dim": self.patch_dim,
                "hidden_dim": self.hidden_dim, "num_layers": self.num_layers, "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim, "layer_norm_epsilon": self.layer_norm_epsilon}  # fmt: skip
