"""Task heads: small layers that turn an encoder's token vectors `(batch, length, dim)` into a task's outputs.

A head knows nothing of the encoder that feeds it, so one head serves every encoder family:

SequenceClassificationHead: pool (first token, mean, ...) -> transform? -> dropout -> Dense(num_classes)
TokenClassificationHead:    transform? -> dropout -> Dense(num_classes), at every token
SpanHead:                   a token classification of 2 classes, as (batch, 2, length): answer start and end
MaskedLMHead:               transform -> logits tied to the token embedding + a bias

A transform is `Dense(dim) + activation`, with a LayerNorm after it where `norm_epsilon` is set: BERT's pooler
(tanh, no norm), its masked-LM transform (GELU + LayerNorm), ModernBERT's prediction head (no biases, a LayerNorm
without a center). It is given as a dict of `HeadTransform`'s arguments, so a head's config nests as plain data.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.feed_forward import get_activation
from keras_tfm.layers.initializers import own_initializer
from keras_tfm.layers.quantization import QuantizationConfigMixin
from keras_tfm.layers.token_pooling import MODES, TokenPooling

_INIT = keras.initializers.TruncatedNormal(stddev=0.02)


def _dense(units: int, name: str, policy, use_bias: bool = True) -> keras.layers.Dense:
    return keras.layers.Dense(units, use_bias=use_bias, kernel_initializer=own_initializer(_INIT),
                              dtype=policy, name=name)  # fmt: skip


def _build(layer: keras.layers.Layer, shape) -> None:
    """Builds `layer` unless it is built (a built Dense would make its weights again)."""
    if not layer.built:
        layer.build(shape)


@keras.saving.register_keras_serializable(package="keras_tfm")
class HeadTransform(keras.layers.Layer):
    """`Dense(dim) + activation`, then a LayerNorm where `norm_epsilon` is given: the transform a head applies
    before its output layer.

    Args:
        activation: of the Dense layer ("tanh": BERT's pooler, "gelu": its masked-LM transform).
        use_bias: the Dense layer's bias (ModernBERT has none).
        norm_epsilon: the LayerNorm's epsilon; None: no LayerNorm.
        norm_center: the LayerNorm's learned offset (ModernBERT's has none).

    Example:
    >>> transform = HeadTransform("gelu", norm_epsilon=1e-12)
    >>> tuple(transform(np.ones((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def __init__(self, activation: str = "tanh", use_bias: bool = True, norm_epsilon: float | None = None,
                 norm_center: bool = True, **kwargs):  # fmt: skip
        check_arguments("HeadTransform", locals(), optional=("norm_epsilon",))
        super().__init__(**kwargs)
        self.activation, self.use_bias, self.norm_epsilon, self.norm_center = (
            activation,
            use_bias,
            norm_epsilon,
            norm_center,
        )
        self.units = None  # the input's width, known at build
        self.dense = None
        self.norm = None
        if norm_epsilon is not None:
            self.norm = keras.layers.LayerNormalization(epsilon=norm_epsilon, center=norm_center,
                                                        dtype=self.dtype_policy, name="norm")  # fmt: skip

    def build(self, input_shape):
        if self.dense is None:  # its width is the input's: made at the first build (a task's build may come again)
            self.dense = _dense(input_shape[-1], "dense", self.dtype_policy, use_bias=self.use_bias)
        _build(self.dense, input_shape)
        if self.norm is not None:
            _build(self.norm, input_shape)
        self.built = True

    def call(self, inputs):
        x = get_activation(self.activation)(self.dense(inputs))
        return x if self.norm is None else self.norm(x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "activation": self.activation, "use_bias": self.use_bias,
                "norm_epsilon": self.norm_epsilon, "norm_center": self.norm_center}  # fmt: skip


def _transform(transform, owner: str, policy) -> HeadTransform | None:
    """The `HeadTransform` of a head's `transform` argument: None, or a dict of its arguments."""
    if transform is None:
        return None
    if not isinstance(transform, dict) or not set(transform) <= {"activation", "use_bias", "norm_epsilon",
                                                                 "norm_center"}:  # fmt: skip
        raise InputError(f"expected None or a dict of HeadTransform's arguments (activation, use_bias, norm_epsilon, "
                         f"norm_center); received {transform!r}.", "transform", caller=owner)  # fmt: skip
    return HeadTransform(**transform, dtype=policy, name="transform")


class _Head(QuantizationConfigMixin, keras.layers.Layer):
    """What the heads share: an optional transform, kept in the config as the dict it was made from; a quantized
    head's config names its quantized layers (`QuantizationConfigMixin`)."""

    def __init__(self, transform: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.transform_arguments = None if transform is None else dict(transform)
        self.transform = _transform(transform, type(self).__name__, self.dtype_policy)

    def _build_transform(self, width: int) -> None:
        if self.transform is not None:
            _build(self.transform, (None, width))

    def get_config(self) -> dict:
        return {**super().get_config(), "transform": self.transform_arguments}


class _Classifier(_Head):
    """A head that scores classes: transform?, dropout, then `classifier`, a Dense layer of `units`."""

    def __init__(self, units: int, /, transform: dict | None, dropout: float, **kwargs):
        check_arguments(type(self).__name__, {"dropout": dropout})
        super().__init__(transform, **kwargs)
        self.dropout = dropout
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout")
        self.classifier = _dense(units, "classifier", self.dtype_policy)

    def build(self, token_vectors_shape):
        self._build_transform(token_vectors_shape[-1])
        _build(self.classifier, (None, token_vectors_shape[-1]))
        self.built = True

    def _classify(self, x, training=None):
        x = x if self.transform is None else self.transform(x)
        return self.classifier(self.dropout_layer(x, training=training))

    def get_config(self) -> dict:
        return {**super().get_config(), "dropout": self.dropout}


@keras.saving.register_keras_serializable(package="keras_tfm")
class SequenceClassificationHead(_Classifier):
    """One label per sequence: its token vectors pooled, transformed, then scored.

    Args:
        num_classes: how many classes the logits score.
        pooling: a `TokenPooling` mode: "cls" (the first token: BERT) or "mean" (of the real tokens), ...
        transform: a dict of `HeadTransform` arguments, or None (BERT's pooler: `{"activation": "tanh"}`).
        dropout: on the transformed vector, in training.

    Call arguments: `token_vectors` `(batch, length, dim)`, `padding_mask` `(batch, length)` (True at real tokens).
    Returns `(batch, num_classes)` logits.

    Example:
    >>> head = SequenceClassificationHead(3, transform={"activation": "tanh"})
    >>> tuple(head(np.ones((2, 5, 8))).shape)
    (2, 3)
    """

    def __init__(self, num_classes: int, pooling: str = "cls", transform: dict | None = None, dropout: float = 0.0,
                 **kwargs):  # fmt: skip
        check_arguments("SequenceClassificationHead", {"num_classes": num_classes})
        if pooling not in MODES:
            raise InputError(f"expected one of {MODES}; received {pooling!r}.", "pooling",
                             caller="SequenceClassificationHead")  # fmt: skip
        super().__init__(num_classes, transform, dropout, **kwargs)
        self.num_classes, self.pooling = num_classes, pooling
        self.token_pooling = TokenPooling(pooling, dtype=self.dtype_policy, name="token_pooling")

    def build(self, token_vectors_shape, padding_mask_shape=None):
        _build(self.token_pooling, token_vectors_shape)
        super().build(token_vectors_shape)

    @property
    def reads_first_token_only(self) -> bool:
        """Whether only the first token's vector counts: an encoder may then compute no other at its last block."""
        return self.pooling == "cls"

    def call(self, token_vectors, padding_mask=None, training=None):
        return self._classify(self.token_pooling(token_vectors, padding_mask=padding_mask), training)

    def compute_output_shape(self, token_vectors_shape, padding_mask_shape=None):
        return (token_vectors_shape[0], self.num_classes)

    def get_config(self) -> dict:
        return {**super().get_config(), "num_classes": self.num_classes, "pooling": self.pooling}


@keras.saving.register_keras_serializable(package="keras_tfm")
class TokenClassificationHead(_Classifier):
    """One label per token: `(batch, length, num_classes)` logits.

    Args: `num_classes`; `transform` (a dict of `HeadTransform` arguments, or None) and `dropout`, as
    `SequenceClassificationHead`'s.

    Example:
    >>> head = TokenClassificationHead(4)
    >>> tuple(head(np.ones((2, 5, 8))).shape)
    (2, 5, 4)
    """

    def __init__(self, num_classes: int, transform: dict | None = None, dropout: float = 0.0, **kwargs):
        check_arguments("TokenClassificationHead", {"num_classes": num_classes})
        super().__init__(num_classes, transform, dropout, **kwargs)
        self.num_classes = num_classes

    def call(self, token_vectors, training=None):
        return self._classify(token_vectors, training)

    def compute_output_shape(self, token_vectors_shape):
        return (*token_vectors_shape[:-1], self.num_classes)

    def get_config(self) -> dict:
        return {**super().get_config(), "num_classes": self.num_classes}


@keras.saving.register_keras_serializable(package="keras_tfm")
class SpanHead(_Classifier):
    """Where an answer starts and ends: `(batch, 2, length)` logits, `[:, 0]` the start's, `[:, 1]` the end's.

    Args: `transform` and `dropout`, as `TokenClassificationHead`'s.

    Example:
    >>> tuple(SpanHead()(np.ones((2, 5, 8))).shape)
    (2, 2, 5)
    """

    def __init__(self, transform: dict | None = None, dropout: float = 0.0, **kwargs):
        super().__init__(2, transform, dropout, **kwargs)

    def call(self, token_vectors, training=None):
        return ops.transpose(self._classify(token_vectors, training), (0, 2, 1))

    def compute_output_shape(self, token_vectors_shape):
        return (token_vectors_shape[0], 2, token_vectors_shape[1])


@keras.saving.register_keras_serializable(package="keras_tfm")
class MaskedLMHead(_Head):
    """A token's vocabulary logits: transformed, then projected by the encoder's own token embedding (tied),
    plus a bias of its own.

    Args:
        vocabulary_size: the bias's size (the embedding table's rows).
        transform: a dict of `HeadTransform` arguments (BERT's: `{"activation": "gelu", "norm_epsilon": 1e-12}`).

    Call arguments: `token_vectors` `(batch, length, dim)`; `embedding`: the encoder's `TokenEmbedding`.

    Example:
    >>> embedding = keras_tfm.layers.TokenEmbedding(100, 8)
    >>> head = MaskedLMHead(100, transform={"activation": "gelu", "norm_epsilon": 1e-12})
    >>> tuple(head(np.ones((2, 5, 8)), embedding=embedding).shape)
    (2, 5, 100)
    """

    def __init__(self, vocabulary_size: int, transform: dict | None = None, **kwargs):
        check_arguments("MaskedLMHead", {"vocabulary_size": vocabulary_size})
        super().__init__(transform, **kwargs)
        self.vocabulary_size = vocabulary_size

    def build(self, token_vectors_shape, embedding_shape=None):
        self._build_transform(token_vectors_shape[-1])
        self.output_bias = self.add_weight(name="output_bias", shape=(self.vocabulary_size,), initializer="zeros")
        self.built = True

    def call(self, token_vectors, embedding=None):
        x = token_vectors if self.transform is None else self.transform(token_vectors)
        return embedding(x, reverse=True) + ops.cast(self.output_bias, x.dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "vocabulary_size": self.vocabulary_size}
