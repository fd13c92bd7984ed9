"""SegFormer's Mix Transformer block (Xie et al. 2021) over a channels-last feature map: self-attention whose
keys and values come from the map shrunk by a strided convolution (spatial reduction, from PVT), and a
Mix-FFN whose 3x3 depthwise convolution between its two linear layers stands in for position embeddings."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.compat import on_xla_cpu
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.attention import MultiHeadAttention
from keras_tfm.layers.drop_path import DropPath
from keras_tfm.layers.feed_forward import get_activation


@keras.saving.register_keras_serializable(package="keras_tfm")
class MixTransformerBlock(keras.layers.Layer):
    """`(batch, height, width, dim)` -> the same shape, pre-norm:
    `y = x + attention(norm(x), reduce(norm(x)))`, `out = y + mix_ffn(norm(y))`, each branch with stochastic depth;
    `mix_ffn(z) = dense(act(depthwise_conv3x3(dense(z))))`.

    Args:
        num_heads: attention heads (they divide `dim`).
        intermediate_dim: the Mix-FFN's width.
        reduction_ratio: keys and values from a `reduction_ratio` x `reduction_ratio` convolution of the
            map with that stride, then a LayerNorm; 1 reads the map itself.
        activation: the Mix-FFN's.
        dropout: after the attention and inside the Mix-FFN (training only).
        attention_dropout: on the attention weights.
        drop_path_rate: stochastic depth of both branches.
        layer_norm_epsilon: of the three LayerNorms.

    Example:
    >>> block = MixTransformerBlock(num_heads=2, intermediate_dim=32, reduction_ratio=2)
    >>> tuple(block(np.zeros((2, 6, 8, 16), "float32")).shape)
    (2, 6, 8, 16)
    """

    def __init__(self, num_heads: int, intermediate_dim: int, reduction_ratio: int = 1, activation: str = "gelu",
                 dropout: float = 0.0, attention_dropout: float = 0.0, drop_path_rate: float = 0.0,
                 layer_norm_epsilon: float = 1e-5, **kwargs):  # fmt: skip
        check_arguments("MixTransformerBlock", locals())
        super().__init__(**kwargs)
        self.num_heads, self.intermediate_dim, self.reduction_ratio = num_heads, intermediate_dim, reduction_ratio
        self.activation, self.dropout, self.attention_dropout = activation, dropout, attention_dropout
        self.drop_path_rate, self.layer_norm_epsilon = drop_path_rate, layer_norm_epsilon

    def build(self, map_shape):
        dim, policy, ratio = map_shape[-1], self.dtype_policy, self.reduction_ratio
        norm = lambda name: keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=policy, name=name)  # noqa: E731
        self.attention_norm, self.feed_forward_norm = norm("attention_norm"), norm("feed_forward_norm")
        self.reduction = (
            keras.layers.Conv2D(dim, ratio, strides=ratio, dtype=policy, name="reduction") if ratio > 1 else None
        )
        self.reduction_norm = norm("reduction_norm") if ratio > 1 else None
        self.attention = MultiHeadAttention(self.num_heads, dim // self.num_heads, dropout=self.attention_dropout,
                                            dtype=policy, name="attention")  # fmt: skip
        self.intermediate_dense = keras.layers.Dense(self.intermediate_dim, dtype=policy, name="intermediate_dense")
        self.depthwise = keras.layers.DepthwiseConv2D(3, padding="same", dtype=policy, name="depthwise")
        self.output_dense = keras.layers.Dense(dim, dtype=policy, name="output_dense")
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=policy, name="dropout")
        self.drop_path = DropPath(self.drop_path_rate, dtype=policy, name="drop_path")
        self.attention_norm.build(map_shape)
        self.feed_forward_norm.build(map_shape)
        if ratio > 1:
            self.reduction.build((None, None, None, dim))
            self.reduction_norm.build((None, None, None, dim))
        self.attention.build((None, None, dim), (None, None, dim))
        self.intermediate_dense.build((None, None, None, dim))
        self.depthwise.build((None, None, None, self.intermediate_dim))
        self.output_dense.build((None, None, None, self.intermediate_dim))
        self.built = True

    def call(self, feature_map, training=None):
        batch, height, width, dim = ops.shape(feature_map)
        normed = self.attention_norm(feature_map)
        keys = normed if self.reduction is None else self.reduction_norm(self.reduction(normed))
        attended = self.attention(ops.reshape(normed, (batch, -1, dim)), ops.reshape(keys, (batch, -1, dim)),
                                  training=training)  # fmt: skip
        attended = ops.reshape(self.dropout_layer(attended, training=training), (batch, height, width, dim))
        x = feature_map + self.drop_path(attended, training=training)
        mixed = get_activation(self.activation)(self._depthwise(self.intermediate_dense(self.feed_forward_norm(x))))
        mixed = self.dropout_layer(self.output_dense(self.dropout_layer(mixed, training=training)), training=training)
        return x + self.drop_path(mixed, training=training)

    def _depthwise(self, x):
        """The Mix-FFN's 3x3 depthwise convolution; on XLA's CPU backend as nine shifted multiply-adds, which
        ran about 8x faster there than its grouped convolution (15 against 121 ms on a 2 x 128 x 128 x 128
        map, 2-core AMD EPYC), and slower elsewhere (PyTorch 1.2x, TensorFlow 6x)."""
        if keras.backend.backend() != "jax" or not on_xla_cpu():  # TensorFlow's XLA: not measured
            return self.depthwise(x)
        kernel = ops.cast(self.depthwise.kernel, x.dtype)
        padded = ops.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        out = ops.cast(self.depthwise.bias, x.dtype)
        for row in range(3):
            for column in range(3):  # each window ends `2 - offset` before the padded end
                window = padded[:, row : row - 2 or None, column : column - 2 or None]
                out = out + window * kernel[row, column, :, 0]
        return out

    def compute_output_shape(self, map_shape):
        return map_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "num_heads": self.num_heads, "intermediate_dim": self.intermediate_dim,
                "reduction_ratio": self.reduction_ratio, "activation": self.activation, "dropout": self.dropout,
                "attention_dropout": self.attention_dropout, "drop_path_rate": self.drop_path_rate,
                "layer_norm_epsilon": self.layer_norm_epsilon}  # fmt: skip
