"""Multi-head attention pooling (MAP): a learned query attends over every token and stands for them all, as
SigLIP's image tower pools (transformers' `SiglipMultiheadAttentionPoolingHead`, timm's `global_pool="map"`)."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.attention import MultiHeadAttention
from keras_tfm.layers.feed_forward import FeedForward


@keras.saving.register_keras_serializable(package="keras_tfm")
class AttentionPooling(keras.layers.Layer):
    """`(batch, tokens, dim)` -> `(batch, dim)`: a learned probe attends over the tokens, then a residual
    LayerNorm -> MLP: `y = a + mlp(norm(a))`, `a = attention(probe, tokens)`.

    Args:
        num_heads: the attention's heads (they divide the tokens' width).
        intermediate_dim: the MLP's width.
        activation: the MLP's ("gelu_approximate": SigLIP's).
        layer_norm_epsilon: of the LayerNorm before the MLP.

    Call arguments:
        tokens: `(batch, tokens, dim)`.
        padding_mask: `(batch, tokens)`, True at tokens the probe may read; default all.

    Example:
    >>> pooling = AttentionPooling(num_heads=2, intermediate_dim=32)
    >>> tuple(pooling(np.zeros((3, 5, 8), "float32")).shape)
    (3, 8)
    """

    def __init__(self, num_heads: int, intermediate_dim: int, activation: str = "gelu_approximate",
                 layer_norm_epsilon: float = 1e-6, **kwargs):  # fmt: skip
        check_arguments("AttentionPooling", locals())
        super().__init__(**kwargs)
        self.num_heads, self.intermediate_dim = num_heads, intermediate_dim
        self.activation, self.layer_norm_epsilon = activation, layer_norm_epsilon

    def build(self, tokens_shape):
        dim = tokens_shape[-1]
        policy = self.dtype_policy
        self.probe = self.add_weight(name="probe", shape=(1, 1, dim), initializer="glorot_uniform")
        self.attention = MultiHeadAttention(self.num_heads, dim // self.num_heads, dtype=policy, name="attention")
        self.attention.build((None, 1, dim), tokens_shape)
        self.norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=policy, name="norm")
        self.norm.build((None, 1, dim))
        self.mlp = FeedForward(self.intermediate_dim, self.activation, dtype=policy, name="mlp")
        self.mlp.build((None, 1, dim))
        self.built = True

    def call(self, tokens, padding_mask=None):
        batch = ops.shape(tokens)[0]
        probe = ops.broadcast_to(ops.cast(self.probe, tokens.dtype), (batch, 1, ops.shape(tokens)[-1]))
        x = self.attention(probe, tokens, value_mask=padding_mask)
        return (x + self.mlp(self.norm(x)))[:, 0]

    def compute_output_shape(self, tokens_shape):
        return (tokens_shape[0], tokens_shape[-1])

    def get_config(self) -> dict:
        return {**super().get_config(), "num_heads": self.num_heads, "intermediate_dim": self.intermediate_dim,
                "activation": self.activation, "layer_norm_epsilon": self.layer_norm_epsilon}  # fmt: skip
