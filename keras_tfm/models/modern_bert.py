"""ModernBERT: BERT rebuilt with a decoder's parts, for long inputs.

tokens -> token embedding -> LayerNorm (no positions: rotary in every attention)
       -> num_layers x pre-norm EncoderBlock (GeGLU, no biases; every `global_attention_every`-th block, from
          the first, attends to every token, the others to the tokens within `local_attention // 2` on each side,
          each kind with its own rotary base; the first block reads the normalized embeddings as they are)
       -> LayerNorm
"""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers import EncoderBlock, TokenEmbedding
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.task_heads import MaskedLMHead, SequenceClassificationHead, SpanHead, TokenClassificationHead
from keras_tfm.models.base import ZooModel
from keras_tfm.models.text_tasks import (
    FlatArguments,
    MaskedLM,
    QuestionAnswerer,
    SequenceClassifier,
    TokenClassifier,
)

ENCODER_ARGUMENTS = (
    "vocabulary_size",
    "max_length",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "local_attention",
    "global_attention_every",
    "global_rope_theta",
    "local_rope_theta",
    "dropout",
    "attention_dropout",
    "layer_norm_epsilon",
    "activation",
    "remat",
)


@keras.saving.register_keras_serializable(package="keras_tfm")
class ModernBert(ZooModel):
    """The ModernBERT encoder: `model(token_ids)` gives one vector per token.

    Args:
        vocabulary_size; max_length: the longest text (rotary positions have no table; the checkpoints were
            trained up to it).
        num_layers, num_heads, hidden_dim, intermediate_dim: the encoder (the feed-forward network is a GeGLU of
            `intermediate_dim`).
        local_attention: the window of the local blocks, `local_attention // 2` tokens on each side.
        global_attention_every: blocks 0, n, 2n, ... attend globally.
        global_rope_theta, local_rope_theta: the rotary bases of the global and the local blocks.
        dropout: on the embeddings and the residual branches; attention_dropout: on attention weights.
        layer_norm_epsilon, activation (of the GeGLU's gate), remat (as `Bert`'s).

    Call arguments: token_ids, padding_mask, output_positions, as `Bert`'s (no segments).

    Example:
    >>> encoder = ModernBert(vocabulary_size=100, num_layers=3, num_heads=2, hidden_dim=16, intermediate_dim=24)
    >>> tuple(encoder(np.array([[5, 7, 9, 2]])).shape)
    (1, 4, 16)
    """

    def __init__(
        self,
        vocabulary_size: int = 50368,
        max_length: int = 8192,
        num_layers: int = 22,
        num_heads: int = 12,
        hidden_dim: int = 768,
        intermediate_dim: int = 1152,
        local_attention: int = 128,
        global_attention_every: int = 3,
        global_rope_theta: float = 160000.0,
        local_rope_theta: float = 10000.0,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        layer_norm_epsilon: float = 1e-5,
        activation: str = "gelu",
        remat: bool = False,
        **kwargs,
    ):
        check_arguments("ModernBert", locals())
        kwargs.setdefault("name", "modern_bert")
        self._check_heads("ModernBert", hidden_dim, num_heads)
        super().__init__(**kwargs)
        arguments = locals()
        for name in ENCODER_ARGUMENTS[:-1]:  # `remat` is the blocks' (a property)
            setattr(self, name, arguments[name])
        policy = self.dtype_policy
        init = keras.initializers.TruncatedNormal(stddev=0.02)
        self.token_embedding = TokenEmbedding(
            vocabulary_size, hidden_dim, embeddings_initializer=init, dtype=policy, name="token_embedding"
        )
        self.embedding_norm = _norm(layer_norm_epsilon, policy, "embedding_norm")
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=policy, name="embedding_dropout")
        self.blocks = [self._block(i, init, remat) for i in range(num_layers)]
        self.final_norm = _norm(layer_norm_epsilon, policy, "final_norm")

    def _block(self, index: int, init, remat: bool) -> EncoderBlock:
        theta = self.local_rope_theta if self._is_local(index) else self.global_rope_theta
        return EncoderBlock(
            self.num_heads,
            self.intermediate_dim,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation=self.activation,
            layer_norm_epsilon=self.layer_norm_epsilon,
            use_bias=False,
            norm_use_bias=False,
            normalize_attention_input=index > 0,
            gated_feed_forward=True,
            rotary_embedding={"max_wavelength": theta},
            kernel_initializer=init,
            remat=remat,
            dtype=self.dtype_policy,
            name=f"block_{index}",
        )

    def _is_local(self, index: int) -> bool:
        return index % self.global_attention_every != 0

    @property
    def longest_input(self) -> int:
        """How many tokens a text may hold."""
        return self.max_length

    def build(self, token_ids_shape=None):
        self.call(keras.KerasTensor((1, 2), "int32"))  # builds sub-layers, computes nothing
        self.built = True

    def call(self, token_ids, padding_mask=None, output_positions=None, training=None):
        if isinstance(token_ids, dict):  # `fit` and `predict` pass one structure
            return self.call(**token_ids, training=training)
        x = self.embedding_dropout(self.embedding_norm(self.token_embedding(token_ids)), training=training)
        window = self._window(token_ids) if self.num_layers > 1 else None
        for index, block in enumerate(self.blocks):
            local = window if self._is_local(index) else None
            x = block(x, padding_mask=padding_mask, attention_mask=local, training=training)
        if output_positions is not None:  # after the blocks: a block's queries at other positions would rotate
            x = ops.take_along_axis(x, EncoderBlock._checked_positions(output_positions, x)[..., None], axis=1)
        return self.final_norm(x)

    def _window(self, token_ids):
        """(batch, length, length): the keys each query of a local block sees, `local_attention // 2` on each side."""
        positions = ops.arange(ops.shape(token_ids)[1])
        near = ops.abs(positions[:, None] - positions[None, :]) <= self.local_attention // 2
        return ops.broadcast_to(near[None], (ops.shape(token_ids)[0], *ops.shape(near)))

    def _export_signature(self) -> list:
        names = ("token_ids", "padding_mask")
        return [{name: keras.InputSpec(shape=(None, None), dtype="int32", name=name) for name in names}]

    def _export_shapes(self) -> dict:
        return {"polymorphic_shapes": [{name: "(batch, length)" for name in ("token_ids", "padding_mask")}]}

    def _id_inputs(self) -> dict:
        return {
            "token_ids": (self.vocabulary_size, "vocabulary_size"),
            "padding_mask": None,
            "output_positions": ("token_ids", "length"),
        }


def _norm(epsilon: float, policy, name: str) -> keras.layers.LayerNormalization:
    return keras.layers.LayerNormalization(epsilon=epsilon, center=False, dtype=policy, name=name)


class _ModernBertTask(FlatArguments):
    """A task model over `ModernBert`, made from its arguments beside the task's own; every task reads the encoder
    through the prediction head (Dense without bias + `head_activation` + LayerNorm without center, as transformers'
    `ModernBertPredictionHead`): the head layer's transform."""

    encoder_class = ModernBert
    encoder_arguments = ENCODER_ARGUMENTS

    def _made(self, kwargs: dict, head_activation: str, make_head, default_name: str, **task) -> None:
        """Makes the encoder from `kwargs`, the head by `make_head(encoder, transform, dtype)`, then the task."""
        check_arguments(type(self).__name__, {"head_activation": head_activation})
        encoder = self._flat_encoder(kwargs)
        transform = {"activation": head_activation, "use_bias": False, "norm_epsilon": encoder.layer_norm_epsilon,
                     "norm_center": False}  # fmt: skip
        head = make_head(encoder, transform, {"dtype": kwargs.get("dtype"), "name": "head"})
        super().__init__(encoder, head, **task, **{"name": default_name, **kwargs})
        self.head_activation = head_activation


@keras.saving.register_keras_serializable(package="keras_tfm")
class ModernBertMLM(_ModernBertTask, MaskedLM):
    """ModernBERT with its masked-language-model head: the prediction head, then logits tied to the token embedding
    plus a bias. Args: those of `ModernBert`, plus `head_activation`. Call arguments: those of `ModernBert`, with
    `mask_positions` (as `BertMLM`'s) for `output_positions`.

    Example:
    >>> mlm = modernbert_base(num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=24, vocabulary_size=100)
    >>> tuple(mlm(np.array([[5, 7, 9, 2]]), mask_positions=np.array([[1]])).shape)
    (1, 1, 100)
    """

    def __init__(self, head_activation: str = "gelu", **kwargs):
        self._made(kwargs, head_activation, lambda encoder, transform, layer: MaskedLMHead(
            encoder.vocabulary_size, transform, **layer), "modern_bert_mlm")  # fmt: skip


@keras.saving.register_keras_serializable(package="keras_tfm")
class ModernBertClassifier(_ModernBertTask, SequenceClassifier):
    """ModernBERT with a sentence-classification head: the first token's vector (`pooling="cls"`) or the mean of
    the real tokens' ("mean"), the prediction head, dropout, Dense(num_classes).

    Example:
    >>> classifier = modernbert_base(head="classifier", num_classes=3, num_layers=1, hidden_dim=16, num_heads=2,
    ...                              intermediate_dim=24, vocabulary_size=100)
    >>> tuple(classifier(np.array([[5, 7, 9, 2]])).shape)
    (1, 3)
    """

    def __init__(self, num_classes: int = 2, pooling: str = "cls", classifier_dropout: float = 0.0,
                 head_activation: str = "gelu", **kwargs):  # fmt: skip
        check_arguments("ModernBertClassifier", {"num_classes": num_classes, "classifier_dropout": classifier_dropout})
        if pooling not in ("cls", "mean"):
            raise InputError(
                f"expected 'cls' or 'mean'; received {pooling!r}.", "pooling", caller="ModernBertClassifier"
            )
        self._made(kwargs, head_activation, lambda encoder, transform, layer: SequenceClassificationHead(
            num_classes, pooling, transform, classifier_dropout, **layer), "modern_bert_classifier")  # fmt: skip
        self.pooling, self.classifier_dropout = pooling, classifier_dropout


@keras.saving.register_keras_serializable(package="keras_tfm")
class ModernBertTokenClassifier(_ModernBertTask, TokenClassifier):
    """ModernBERT with a label per token, `(batch, length, num_classes)` logits; `class_names` and `label_words` as
    `BertTokenClassifier`'s.

    Example:
    >>> tagger = modernbert_base(head="token_classifier", num_classes=3, num_layers=1, hidden_dim=16, num_heads=2,
    ...                          intermediate_dim=24, vocabulary_size=100)
    >>> tuple(tagger(np.array([[5, 7, 9, 2]])).shape)
    (1, 4, 3)
    """

    def __init__(self, num_classes: int = 2, class_names: list | None = None, classifier_dropout: float = 0.0,
                 head_activation: str = "gelu", **kwargs):  # fmt: skip
        check_arguments("ModernBertTokenClassifier", {"num_classes": num_classes,
                                                      "classifier_dropout": classifier_dropout})  # fmt: skip
        self._made(kwargs, head_activation, lambda encoder, transform, layer: TokenClassificationHead(
            num_classes, transform, classifier_dropout, **layer), "modern_bert_token_classifier",
            class_names=class_names)  # fmt: skip
        self.classifier_dropout = classifier_dropout


@keras.saving.register_keras_serializable(package="keras_tfm")
class ModernBertQuestionAnswerer(_ModernBertTask, QuestionAnswerer):
    """ModernBERT for extractive question answering: `(batch, 2, length)` start and end logits; its loss and
    `answer` as `BertQuestionAnswerer`'s.

    Example:
    >>> reader = modernbert_base(head="question_answerer", num_layers=1, hidden_dim=16, num_heads=2,
    ...                          intermediate_dim=24, vocabulary_size=100)
    >>> tuple(reader(np.array([[5, 7, 2, 9, 11, 2]])).shape)
    (1, 2, 6)
    """

    def __init__(self, classifier_dropout: float = 0.0, head_activation: str = "gelu", **kwargs):
        check_arguments("ModernBertQuestionAnswerer", {"classifier_dropout": classifier_dropout})
        self._made(kwargs, head_activation, lambda encoder, transform, layer: SpanHead(
            transform, classifier_dropout, **layer), "modern_bert_question_answerer")  # fmt: skip
        self.classifier_dropout = classifier_dropout


HEADS = {
    None: ModernBert,
    "mlm": ModernBertMLM,
    "classifier": ModernBertClassifier,
    "token_classifier": ModernBertTokenClassifier,
    "question_answerer": ModernBertQuestionAnswerer,
}


def _modern_bert(defaults: dict, head: str | None, overrides: dict) -> keras.Model:
    if head not in HEADS:
        raise InputError(f"head must be one of {list(HEADS)}; received {head!r}.", "head", caller="ModernBERT")
    return HEADS[head](**{**defaults, **overrides})


def modernbert_base(head: str | None = "mlm", **overrides) -> keras.Model:
    """ModernBERT-base: 22 layers, 12 heads, 768 wide, GeGLU of 1,152 (150M as `ModernBertForMaskedLM`). `head`:
    "mlm", "classifier", "token_classifier", "question_answerer", or None (encoder)."""
    return _modern_bert(dict(num_layers=22, num_heads=12, hidden_dim=768, intermediate_dim=1152), head, overrides)


def modernbert_large(head: str | None = "mlm", **overrides) -> keras.Model:
    """ModernBERT-large: 28 layers, 16 heads, 1024 wide, GeGLU of 2,624 (396M)."""
    return _modern_bert(dict(num_layers=28, num_heads=16, hidden_dim=1024, intermediate_dim=2624), head, overrides)
