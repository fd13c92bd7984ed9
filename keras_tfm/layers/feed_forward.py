"""The token-wise MLP that refines each token on its own: Dense -> activation -> Dense, or its gated
form (GLU): Dense_down(activation(Dense_gate(x)) * Dense_up(x))."""

from __future__ import annotations

import keras

from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.initializers import own_initializer
from keras_tfm.layers.quantization import QuantizationConfigMixin


def _approximate_gelu(x):
    return keras.activations.gelu(x, approximate=True)


def _quick_gelu(x):
    return x * keras.ops.sigmoid(1.702 * x)


OWN_ACTIVATIONS = {"gelu_approximate": _approximate_gelu, "quick_gelu": _quick_gelu}


def get_activation(name):
    """A Keras activation, plus "gelu_approximate" (the tanh form used by GPT-2 and BERT-TF) and "quick_gelu"
    (`x * sigmoid(1.702 x)`, OpenAI CLIP's), which Keras has not."""
    return OWN_ACTIVATIONS[name] if isinstance(name, str) and name in OWN_ACTIVATIONS else keras.activations.get(name)


def projection(owner: keras.layers.Layer, units: int, name: str, use_bias: bool | None = None) -> keras.layers.Dense:
    """A `Dense(units)` made with `owner`'s `use_bias` (unless given), initializers and dtype policy:
    the projections of the feed-forward networks and `MultiHeadAttention`."""
    return keras.layers.Dense(
        units,
        use_bias=owner.use_bias if use_bias is None else use_bias,
        kernel_initializer=own_initializer(owner.kernel_initializer),
        bias_initializer=own_initializer(owner.bias_initializer),
        dtype=owner.dtype_policy,
        name=name,
    )


@keras.saving.register_keras_serializable(package="keras_tfm")
class FeedForward(QuantizationConfigMixin, keras.layers.Layer):
    """`Dense(intermediate_dim) -> activation -> dropout -> Dense(output_dim)`, applied to each token.

    Args:
        intermediate_dim: width of the hidden layer (typically 4 x hidden_dim).
        activation: a Keras activation name, "gelu_approximate" (tanh GELU) or "quick_gelu" (CLIP's).
        dropout: dropout after the activation (training only).
        output_dim: output size; defaults to the input's last dimension.
        use_bias, kernel_initializer, bias_initializer: of both projections.

    Masks: passes the input's Keras mask through unchanged.

    Example:
    >>> y = FeedForward(intermediate_dim=256)(np.zeros((2, 10, 64), "float32"))  # (2, 10, 64)
    """

    def __init__(
        self,
        intermediate_dim: int,
        activation: str = "gelu",
        dropout: float = 0.0,
        output_dim: int | None = None,
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        check_arguments(type(self).__name__, locals(), optional=("output_dim",))
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.dropout = dropout
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True
        self.activation_fn = get_activation(activation)
        self.hidden_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, inputs_shape):
        self.intermediate_dense = projection(self, self.intermediate_dim, "intermediate")
        self.output_dense = projection(self, self.output_dim or inputs_shape[-1], "output")
        self.intermediate_dense.build(inputs_shape)
        self.output_dense.build(tuple(inputs_shape[:-1]) + (self.intermediate_dim,))
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.activation_fn(self.intermediate_dense(inputs))
        return self.output_dense(self.hidden_dropout(hidden, training=training))

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.output_dim or inputs_shape[-1],)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            dropout=self.dropout,
            output_dim=self.output_dim,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        return config


@keras.saving.register_keras_serializable(package="keras_tfm")
class GatedFeedForward(FeedForward):
    """The gated feed-forward network of Llama, Mistral and Qwen (SwiGLU with `activation="silu"`,
    GeGLU with "gelu" or "gelu_approximate"): `down(activation(gate(x)) * up(x))`, applied to each token.

    Args: as `FeedForward` (`intermediate_dim` is the width of the gate and up projections, about
        8/3 x hidden_dim in Llama), with the defaults of those models: `activation="silu"` and
        `use_bias=False`.

    Masks: passes the input's Keras mask through unchanged.

    Example:
    >>> y = GatedFeedForward(intermediate_dim=172)(np.zeros((2, 10, 64), "float32"))  # (2, 10, 64)
    """

    def __init__(
        self,
        intermediate_dim: int,
        activation: str = "silu",
        dropout: float = 0.0,
        output_dim: int | None = None,
        use_bias: bool = False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(
            intermediate_dim, activation, dropout, output_dim, use_bias, kernel_initializer, bias_initializer, **kwargs
        )

    def build(self, inputs_shape):
        self.gate_dense = projection(self, self.intermediate_dim, "gate")
        self.up_dense = projection(self, self.intermediate_dim, "up")
        self.output_dense = projection(self, self.output_dim or inputs_shape[-1], "output")
        self.gate_dense.build(inputs_shape)
        self.up_dense.build(inputs_shape)
        self.output_dense.build(tuple(inputs_shape[:-1]) + (self.intermediate_dim,))
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.activation_fn(self.gate_dense(inputs)) * self.up_dense(inputs)
        return self.output_dense(self.hidden_dropout(hidden, training=training))
