"""BERT: a bidirectional encoder, pretrained as a masked language model, fine-tuned as a classifier.

tokens -> token + learned position + segment embeddings -> LayerNorm -> dropout
       -> num_layers x post-norm EncoderBlock (padding-masked self-attention, GELU MLP)
BertMLM:        masked positions only (from the last block on) -> Dense + GELU + LayerNorm
                -> logits tied to the token embedding + bias
BertClassifier: [CLS] -> pooler (Dense + tanh, or ReLU) -> dropout -> Dense(num_classes)
BertTokenClassifier: every token -> dropout -> Dense(num_classes)
BertQuestionAnswerer: every token -> Dense(2): the answer's start and end logits

The task models are `keras_tfm.models.text_tasks`' over `Bert`, with heads of `keras_tfm.layers.task_heads`.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers import EncoderBlock, LearnedPositionEmbedding, TokenEmbedding
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

_ENCODER_ARGUMENTS = (
    "vocabulary_size",
    "max_length",
    "num_segments",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "dropout",
    "attention_dropout",
    "layer_norm_epsilon",
    "activation",
    "position_offset",
    "remat",
)


@keras.saving.register_keras_serializable(package="keras_tfm")
class Bert(ZooModel):
    """The BERT encoder: `model(token_ids)` gives one vector per token.

    Args:
        vocabulary_size, max_length, num_segments: sizes of the token, position and segment tables (0
            segments: none, as DistilBERT).
        num_layers, num_heads, hidden_dim, intermediate_dim (default 4 x hidden_dim): the encoder.
        dropout: on embeddings and residual branches (training only).
        attention_dropout: on attention weights; defaults to `dropout`.
        layer_norm_epsilon, activation.
        position_offset: the position of the first token in the position table (RoBERTa's 2: its rows 0 and 1
            are unused, as its padding id is 1); texts may hold `max_length - position_offset` tokens. With
            an offset and a `padding_mask`, each row counts from its first real token and padding takes the
            row before the offset, as RoBERTa numbers them (left padding too).
        remat: the blocks recompute their activations in training's backward pass (less memory).

    Call arguments (as keyword arguments, or one dict with these keys, as `fit` and `predict` pass them):
        token_ids: int `(batch, length)`.
        segment_ids: int `(batch, length)`, sentence A = 0 / B = 1; default all 0.
        padding_mask: `(batch, length)`, True at real tokens; pad tokens are never attended to.
            Default: every token is real (as Hugging Face's default `attention_mask`).
        output_positions: int `(batch, num_positions)`: return the vectors at these positions only,
            `(batch, num_positions, hidden_dim)`; the last block then computes nothing else (see
            `EncoderBlock`). The masked LM passes its masked positions.

    Example:
    >>> encoder = keras_tfm.bert_tiny(head=None)
    >>> ids = np.random.randint(1, 30522, (2, 16))
    >>> vectors = encoder(ids, padding_mask=ids != 0)  # (2, 16, 128)
    """

    def __init__(
        self,
        vocabulary_size: int = 30522,
        max_length: int = 512,
        num_segments: int = 2,
        num_layers: int = 12,
        num_heads: int = 12,
        hidden_dim: int = 768,
        intermediate_dim: int | None = None,
        dropout: float = 0.1,
        attention_dropout: float | None = None,
        layer_norm_epsilon: float = 1e-12,
        activation: str = "gelu",
        position_offset: int = 0,
        remat: bool = False,
        **kwargs,
    ):
        check_arguments("Bert", locals(), optional=("intermediate_dim", "attention_dropout"))
        kwargs.setdefault("name", "bert")
        self._check_heads("Bert", hidden_dim, num_heads)
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.max_length = max_length
        self.num_segments = num_segments
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim or 4 * hidden_dim
        self.dropout = dropout
        self.attention_dropout = dropout if attention_dropout is None else attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.activation = activation
        if position_offset >= max_length:
            raise InputError(f"expected fewer than max_length={max_length} positions; received {position_offset}.",
                             "position_offset", caller="Bert")  # fmt: skip
        self.position_offset = position_offset

        init = keras.initializers.TruncatedNormal(stddev=0.02)
        policy = self.dtype_policy
        self.token_embedding = TokenEmbedding(
            vocabulary_size, hidden_dim, embeddings_initializer=init, dtype=policy, name="token_embedding"
        )
        self.position_embedding = LearnedPositionEmbedding(
            max_length, initializer=init, dtype=policy, name="position_embedding"
        )
        self.segment_embedding = num_segments and TokenEmbedding(
            num_segments, hidden_dim, embeddings_initializer=init, dtype=policy, name="segment_embedding"
        )
        self.embedding_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=policy, name="embedding_norm"
        )
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=policy, name="embedding_dropout")
        self.blocks = [
            EncoderBlock(
                num_heads,
                self.intermediate_dim,
                dropout=dropout,
                attention_dropout=self.attention_dropout,
                activation=activation,
                norm_first=False,
                layer_norm_epsilon=layer_norm_epsilon,
                kernel_initializer=init,
                remat=remat,
                dtype=policy,
                name=f"block_{i}",
            )
            for i in range(num_layers)
        ]

    @property
    def longest_input(self) -> int:
        """How many tokens a text may hold: the position table's rows from `position_offset` on."""
        return self.max_length - self.position_offset

    def build(self, token_ids_shape=None):
        self.call(keras.KerasTensor((1, 2), "int32"))  # builds sub-layers, computes nothing
        self.built = True

    def call(self, token_ids, segment_ids=None, padding_mask=None, output_positions=None, training=None):
        if isinstance(token_ids, dict):  # `fit` and `predict` pass one structure: keras-hub's input names
            return self.call(**token_ids, training=training)
        x = self.token_embedding(token_ids)
        if self.position_offset and padding_mask is not None:  # RoBERTa's: from each row's first real token
            real = ops.cast(padding_mask, "int32")
            x = x + self.position_embedding(x, positions=ops.cumsum(real, axis=1) * real + self.position_offset - 1)
        else:
            x = x + self.position_embedding(x, start_index=self.position_offset)
        if self.segment_embedding:
            x = x + self.segment_embedding(ops.zeros_like(token_ids) if segment_ids is None else segment_ids)
        x = self.embedding_dropout(self.embedding_norm(x), training=training)
        for block in self.blocks[:-1]:
            x = block(x, padding_mask=padding_mask, training=training)
        return self.blocks[-1](x, padding_mask=padding_mask, output_positions=output_positions, training=training)

    def _export_signature(self) -> list:
        """One dict, as `fit` takes it: token ids, segment ids (a pair's sentence B) and the padding
        mask (int32, 1 at real tokens: every runtime feeds it), of any batch and length."""
        names = ("token_ids", "segment_ids", "padding_mask")
        return [{name: keras.InputSpec(shape=(None, None), dtype="int32", name=name) for name in names}]

    def _export_shapes(self) -> dict:
        """On JAX, the three inputs share one batch and one length (Keras would name each apart)."""
        names = ("token_ids", "segment_ids", "padding_mask")
        return {"polymorphic_shapes": [{name: "(batch, length)" for name in names}]}

    def _id_inputs(self) -> dict:
        return {
            "token_ids": (self.vocabulary_size, "vocabulary_size"),
            "segment_ids": (self.num_segments, "num_segments"),
            "padding_mask": None,
            "output_positions": ("token_ids", "length"),
        }


class _BertTask(FlatArguments):
    """A task model over `Bert`, made from `Bert`'s arguments beside its own."""

    encoder_class = Bert
    encoder_arguments = _ENCODER_ARGUMENTS


@keras.saving.register_keras_serializable(package="keras_tfm")
class BertMLM(_BertTask, MaskedLM):
    """BERT with its masked-language-model head (pretraining): a `MaskedLM` over `Bert`.

    Args: those of `Bert`, plus
        head_activation, head_layer_norm_epsilon: of the head's transform (a Dense layer and a
            LayerNorm before the tied output projection); default: the encoder's `activation` and
            `layer_norm_epsilon`, as in BERT and Hugging Face. keras-hub's `BertMaskedLM` uses "gelu"
            and 1e-5 there, under a "gelu_approximate" encoder with 1e-12.

    Call arguments: those of `Bert`, plus
        mask_positions: int `(batch, num_masked)`: compute logits only at these positions (the
            masked tokens), as in the original recipe; default: every position.

    Returns: logits `(batch, num_masked or length, vocabulary_size)`.

    Example:
    >>> mlm = keras_tfm.bert_tiny()  # a BertMLM
    >>> ids, positions = np.random.randint(1, 30522, (2, 16)), np.array([[1, 5], [2, 9]])
    >>> logits = mlm(ids, padding_mask=ids != 0, mask_positions=positions)  # (2, 2, 30522)
    """

    def __init__(self, head_activation: str | None = None, head_layer_norm_epsilon: float | None = None, **kwargs):
        check_arguments("BertMLM", locals(), optional=("head_activation", "head_layer_norm_epsilon"))
        encoder = self._flat_encoder(kwargs)
        epsilon = encoder.layer_norm_epsilon if head_layer_norm_epsilon is None else head_layer_norm_epsilon
        transform = {"activation": head_activation or encoder.activation, "norm_epsilon": epsilon}
        head = MaskedLMHead(encoder.vocabulary_size, transform, dtype=kwargs.get("dtype"), name="head")
        super().__init__(encoder, head, **{"name": "bert_mlm", **kwargs})
        self.head_activation = head_activation
        self.head_layer_norm_epsilon = head_layer_norm_epsilon


@keras.saving.register_keras_serializable(package="keras_tfm")
class BertClassifier(_BertTask, SequenceClassifier):
    """BERT with a sentence-classification head on the [CLS] token (fine-tuning): a `SequenceClassifier` over
    `Bert`, its head's transform the pooler.

    Args: `num_classes`; `classifier_dropout`, on the pooled vector, defaults to `dropout`;
    `pooler_activation` ("tanh"; DistilBERT's "relu"); plus those of `Bert`.

    Example:
    >>> classifier = keras_tfm.bert_tiny(head="classifier", num_classes=2)
    >>> ids = np.random.randint(1, 30522, (2, 16))
    >>> logits = classifier(ids, padding_mask=ids != 0)  # (2, 2)
    """

    def __init__(self, num_classes: int = 2, classifier_dropout: float | None = None, pooler_activation: str = "tanh",
                 **kwargs):  # fmt: skip
        check_arguments("BertClassifier", locals(), optional=("classifier_dropout",))
        encoder = self._flat_encoder(kwargs)
        dropout = encoder.dropout if classifier_dropout is None else classifier_dropout
        head = SequenceClassificationHead(num_classes, "cls", {"activation": pooler_activation}, dropout,
                                          dtype=kwargs.get("dtype"), name="head")  # fmt: skip
        super().__init__(encoder, head, **{"name": "bert_classifier", **kwargs})
        self.classifier_dropout = dropout
        self.pooler_activation = pooler_activation


@keras.saving.register_keras_serializable(package="keras_tfm")
class BertTokenClassifier(_BertTask, TokenClassifier):
    """BERT with a label per token: `(batch, length, num_classes)` logits (a `TokenClassifier` over `Bert`).

    Args: `num_classes`; `class_names` (default LABEL_0, ...), which `label_words` answers with and a saved
    checkpoint's `id2label` holds; `classifier_dropout`, before the head, defaults to `dropout`; plus those of
    `Bert`. The default loss skips labels of -100 (transformers' mark for a word's later pieces).

    Example:
    >>> tagger = BertTokenClassifier(num_classes=3, vocabulary_size=100, num_layers=1, hidden_dim=16, num_heads=2)
    >>> tuple(tagger(np.array([[2, 7, 9, 3]])).shape)
    (1, 4, 3)
    """

    def __init__(self, num_classes: int = 2, class_names: list | None = None, classifier_dropout: float | None = None,
                 **kwargs):  # fmt: skip
        check_arguments("BertTokenClassifier", locals(), optional=("class_names", "classifier_dropout"))
        encoder = self._flat_encoder(kwargs)
        dropout = encoder.dropout if classifier_dropout is None else classifier_dropout
        head = TokenClassificationHead(num_classes, None, dropout, dtype=kwargs.get("dtype"), name="head")
        super().__init__(encoder, head, class_names, **{"name": "bert_token_classifier", **kwargs})
        self.classifier_dropout = dropout


@keras.saving.register_keras_serializable(package="keras_tfm")
class BertQuestionAnswerer(_BertTask, QuestionAnswerer):
    """BERT for extractive question answering: `(batch, 2, length)` logits (a `QuestionAnswerer` over `Bert`),
    where in the context (the second sentence, `segment_ids` 1) the answer starts (`[:, 0]`) and ends (`[:, 1]`).

    Example:
    >>> reader = BertQuestionAnswerer(vocabulary_size=100, num_layers=1, hidden_dim=16, num_heads=2)
    >>> tuple(reader(np.array([[2, 7, 3, 9, 11, 3]]), segment_ids=np.array([[0, 0, 0, 1, 1, 1]])).shape)
    (1, 2, 6)
    """

    def __init__(self, **kwargs):
        encoder = self._flat_encoder(kwargs)
        head = SpanHead(dtype=kwargs.get("dtype"), name="head")
        super().__init__(encoder, head, **{"name": "bert_question_answerer", **kwargs})
