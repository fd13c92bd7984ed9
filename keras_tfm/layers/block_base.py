"""What the encoder and decoder blocks share: their arguments and config, and the factories of their
sub-layers (attention, norms, feed-forward, and what a residual branch's output goes through: dropout,
layer scale, stochastic depth)."""

from __future__ import annotations

import keras

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.attention import MultiHeadAttention
from keras_tfm.layers.drop_path import DropPath
from keras_tfm.layers.feed_forward import FeedForward, GatedFeedForward
from keras_tfm.layers.layer_scale import LayerScale
from keras_tfm.layers.quantization import QuantizationConfigMixin

NORMALIZATIONS = ("layer_norm", "rms_norm")


class _Block(QuantizationConfigMixin, keras.layers.Layer):
    """What encoder and decoder blocks share: arguments, config, and the sub-layer factories."""

    def __init__(
        self,
        num_heads: int,
        intermediate_dim: int,
        key_dim: int | None = None,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        activation: str = "gelu",
        norm_first: bool = True,
        layer_norm_epsilon: float = 1e-5,
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        remat: bool = False,
        num_key_value_heads: int | None = None,
        normalization: str = "layer_norm",
        gated_feed_forward: bool = False,
        attention_use_bias: bool | None = None,
        attention_output_use_bias: bool | None = None,
        feed_forward_use_bias: bool | None = None,
        rotary_embedding: dict | None = None,
        sliding_window: int | None = None,
        query_key_norm_epsilon: float | None = None,
        norm_use_bias: bool = True,
        normalize_attention_input: bool = True,
        layer_scale_init: float | None = None,
        drop_path_rate: float = 0.0,
        **kwargs,
    ):
        check_arguments(
            type(self).__name__,
            locals(),
            optional=(
                "key_dim",
                "num_key_value_heads",
                "attention_use_bias",
                "attention_output_use_bias",
                "feed_forward_use_bias",
                "rotary_embedding",
                "sliding_window",
                "query_key_norm_epsilon",
                "layer_scale_init",
            ),
        )
        if normalization not in NORMALIZATIONS:
            raise InputError(
                f"normalization must be one of {list(NORMALIZATIONS)}; received {normalization!r}.",
                "normalization",
                caller=type(self).__name__,
            )
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.key_dim = key_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation = activation
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.remat = remat
        self.num_key_value_heads = num_key_value_heads
        self.normalization = normalization
        self.gated_feed_forward = gated_feed_forward
        self.attention_use_bias = attention_use_bias
        self.attention_output_use_bias = attention_output_use_bias
        self.feed_forward_use_bias = feed_forward_use_bias
        self.rotary_embedding = None if rotary_embedding is None else dict(rotary_embedding)
        self.sliding_window = sliding_window
        self.query_key_norm_epsilon = query_key_norm_epsilon
        self.norm_use_bias = norm_use_bias
        self.normalize_attention_input = normalize_attention_input
        self.layer_scale_init = layer_scale_init
        self.drop_path_rate = drop_path_rate
        self.supports_masking = True
        self.residual_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.drop_path = DropPath(drop_path_rate, dtype=self.dtype_policy, name="drop_path") if drop_path_rate else None

    def _branch_output(self, name: str, hidden_dim: int | None = None):
        """What a residual branch's output goes through before the addition: dropout, then (where the block
        has them) its layer scale and stochastic depth. Built with `hidden_dim` in `build`."""
        if hidden_dim is not None and self.layer_scale_init is not None:
            scale = LayerScale(self.layer_scale_init, dtype=self.dtype_policy, name=f"{name}_scale")
            scale.build((hidden_dim,))
            setattr(self, f"{name}_scale", scale)

        def after(out, training=None):
            out = self.residual_dropout(out, training=training)
            scale = getattr(self, f"{name}_scale", None)
            out = out if scale is None else scale(out)
            return out if self.drop_path is None else self.drop_path(out, training=training)

        return after

    def _head_dim(self, hidden_dim: int) -> int:
        if self.key_dim is not None:
            return self.key_dim
        if hidden_dim % self.num_heads:
            raise InputError(
                f"hidden_dim must be divisible by num_heads when key_dim is "
                f"not given; received hidden_dim={hidden_dim}, num_heads={self.num_heads}.",
                caller=type(self).__name__,
            )
        return hidden_dim // self.num_heads

    def _attention(self, hidden_dim: int, name: str, positional: bool = True) -> MultiHeadAttention:
        """Self-attention (`positional`: with the block's rotation, window and key/value heads) or
        cross-attention (over an encoder output, without them)."""
        use_bias = self.use_bias if self.attention_use_bias is None else self.attention_use_bias
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self._head_dim(hidden_dim),
            dropout=self.attention_dropout,
            use_bias=use_bias,
            output_dim=hidden_dim,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            num_key_value_heads=self.num_key_value_heads if positional else None,
            output_use_bias=self.attention_output_use_bias,
            rotary_embedding=self.rotary_embedding if positional else None,
            sliding_window=self.sliding_window if positional else None,
            query_key_norm_epsilon=self.query_key_norm_epsilon,
            dtype=self.dtype_policy,
            name=name,
        )

    def _norm(self, name: str) -> keras.layers.Layer:
        if name == "self_attention_norm" and not self.normalize_attention_input:
            return keras.layers.Identity(dtype=self.dtype_policy, name=name)
        if self.normalization == "rms_norm":
            return keras.layers.RMSNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)
        return keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, center=self.norm_use_bias, dtype=self.dtype_policy, name=name
        )

    def _feed_forward(self) -> FeedForward | GatedFeedForward:
        return (GatedFeedForward if self.gated_feed_forward else FeedForward)(
            self.intermediate_dim,
            activation=self.activation,
            use_bias=self.use_bias if self.feed_forward_use_bias is None else self.feed_forward_use_bias,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
            name="feed_forward",
        )

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            key_dim=self.key_dim,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation=self.activation,
            norm_first=self.norm_first,
            layer_norm_epsilon=self.layer_norm_epsilon,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            remat=self.remat,
            num_key_value_heads=self.num_key_value_heads,
            normalization=self.normalization,
            gated_feed_forward=self.gated_feed_forward,
            attention_use_bias=self.attention_use_bias,
            attention_output_use_bias=self.attention_output_use_bias,
            feed_forward_use_bias=self.feed_forward_use_bias,
            rotary_embedding=self.rotary_embedding,
            sliding_window=self.sliding_window,
            query_key_norm_epsilon=self.query_key_norm_epsilon,
            norm_use_bias=self.norm_use_bias,
            normalize_attention_input=self.normalize_attention_input,
            layer_scale_init=self.layer_scale_init,
            drop_path_rate=self.drop_path_rate,
        )
        return config
