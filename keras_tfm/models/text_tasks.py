"""Task models over any text encoder: an encoder (`Bert`, `ModernBert`, or any `ZooModel` that maps token ids to
`(batch, length, hidden_dim)` vectors) and a head layer of `keras_tfm.layers.task_heads`.

MaskedLM:           encoder -> MaskedLMHead (tied to the encoder's token embedding)
SequenceClassifier: encoder -> SequenceClassificationHead
TokenClassifier:    encoder -> TokenClassificationHead, and `label_words`
QuestionAnswerer:   encoder -> SpanHead, and `answer`

The config nests: `{"encoder": <the encoder's serialized config>, "head": <the head's>}`, so a new encoder family
costs a backbone, not a class per task. A family's named classes (`BertClassifier`, ...) are these tasks made from
flat arguments.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.task_heads import MaskedLMHead, SequenceClassificationHead, SpanHead, TokenClassificationHead
from keras_tfm.models.base import ZooModel
from keras_tfm.models.inputs import checked_class_names
from keras_tfm.models.text_reading import IGNORED_LABEL, AnswersQuestions, LabelsWords


class EncoderTask(ZooModel):
    """An encoder and a head over its token vectors (the tasks below).

    Args:
        encoder: the token encoder, a `ZooModel` with `hidden_dim` whose call takes `token_ids` and keyword inputs
            (`padding_mask`, `segment_ids`, `output_positions`).
        head: the task's head layer (its kind: `head_class`).

    Call arguments: `token_ids`, and the encoder's other inputs by keyword (or one dict of them, as `fit` passes).
    """

    head_class: type = keras.layers.Layer
    default_name = "encoder_task"

    def __init__(self, encoder: keras.Model, head: keras.layers.Layer, **kwargs):
        kwargs.setdefault("name", self.default_name)
        super().__init__(**kwargs)
        caller = type(self).__name__
        if not isinstance(encoder, ZooModel) or not isinstance(getattr(encoder, "hidden_dim", None), int):
            raise InputError(f"expected a token encoder (a keras_tfm model with hidden_dim, e.g. Bert); received a "
                             f"{type(encoder).__name__}.", "encoder", caller=caller)  # fmt: skip
        if not isinstance(head, self.head_class):
            raise InputError(f"expected a {self.head_class.__name__}; received a {type(head).__name__}.", "head",
                             caller=caller)  # fmt: skip
        self.encoder, self.head = encoder, head

    def build(self, token_ids_shape=None):
        self.encoder.build()
        if not self.head.built:
            self.head.build((None, None, self.encoder.hidden_dim))
        self.built = True

    def _encode(self, token_ids, inputs: dict, training):
        inputs = {name: value for name, value in inputs.items() if value is not None}  # an encoder takes what it has
        return self.encoder(token_ids, training=training, **inputs)

    @staticmethod
    def _inputs(token_ids, inputs: dict):
        """`fit` and `predict` pass one dict: its `token_ids`, and the rest."""
        if isinstance(token_ids, dict):
            inputs = {**token_ids, **inputs}
            token_ids = inputs.pop("token_ids")
        return token_ids, inputs

    def _id_inputs(self) -> dict:
        return {name: rule for name, rule in self.encoder._id_inputs().items() if name != "output_positions"}

    def _export_signature(self) -> list:
        return self.encoder._export_signature()

    def _export_shapes(self) -> dict:
        return self.encoder._export_shapes()


class _ScoresClasses:
    """A task whose head scores `num_classes` classes: labels are ids below it."""

    @property
    def num_classes(self) -> int:
        return self.head.num_classes

    def _label_range(self) -> tuple[int, str]:
        return self.num_classes, "num_classes"


@keras.saving.register_keras_serializable(package="keras_tfm")
class MaskedLM(EncoderTask):
    """An encoder with a masked-language-model head. Call arguments: the encoder's, plus `mask_positions`, int
    `(batch, num_masked)`: logits at these positions only (the masked tokens); default: every position.
    Returns `(batch, num_masked or length, vocabulary_size)` logits.

    Example:
    >>> encoder = keras_tfm.Bert(vocabulary_size=100, num_layers=1, hidden_dim=16, num_heads=2)
    >>> mlm = MaskedLM(encoder, MaskedLMHead(100, transform={"activation": "gelu", "norm_epsilon": 1e-12}))
    >>> tuple(mlm(np.array([[2, 7, 9, 3]]), mask_positions=np.array([[1]])).shape)
    (1, 1, 100)
    """

    head_class = MaskedLMHead
    default_name = "masked_lm"

    def __init__(self, encoder: keras.Model, head: MaskedLMHead, **kwargs):
        super().__init__(encoder, head, **kwargs)
        self._compile_defaults()

    def call(self, token_ids, training=None, mask_positions=None, **inputs):
        token_ids, inputs = self._inputs(token_ids, inputs)
        inputs["output_positions"] = inputs.pop("mask_positions", mask_positions)
        return self.head(self._encode(token_ids, inputs, training), embedding=self.encoder.token_embedding)

    def _id_inputs(self) -> dict:
        ids = dict(self.encoder._id_inputs())
        ids["mask_positions"] = ids.pop("output_positions")
        return ids

    def _label_range(self) -> tuple[int, str]:
        return self.encoder.vocabulary_size, "vocabulary_size"

    def default_loss(self) -> keras.losses.Loss:
        from keras_tfm.losses import TokenCrossEntropy

        return TokenCrossEntropy()


@keras.saving.register_keras_serializable(package="keras_tfm")
class SequenceClassifier(_ScoresClasses, EncoderTask):
    """An encoder with a sequence-classification head: `(batch, num_classes)` logits. Where the head pools the
    first token only, the encoder's last block computes nothing else.

    Example:
    >>> encoder = keras_tfm.ModernBert(vocabulary_size=100, num_layers=1, hidden_dim=16, num_heads=2)
    >>> classifier = SequenceClassifier(encoder, SequenceClassificationHead(3, pooling="mean"))
    >>> tuple(classifier(np.array([[2, 7, 9, 3]])).shape)
    (1, 3)
    """

    head_class = SequenceClassificationHead
    default_name = "sequence_classifier"
    lora_trainable_layer_names = ("classifier",)

    def __init__(self, encoder: keras.Model, head: SequenceClassificationHead, **kwargs):
        super().__init__(encoder, head, **kwargs)
        self._compile_defaults()

    def call(self, token_ids, training=None, **inputs):
        token_ids, inputs = self._inputs(token_ids, inputs)
        padding_mask = inputs.get("padding_mask")
        if self.head.reads_first_token_only:
            inputs["output_positions"] = ops.zeros((ops.shape(token_ids)[0], 1), "int32")
            padding_mask = None
        return self.head(self._encode(token_ids, inputs, training), padding_mask=padding_mask, training=training)

    def default_loss(self) -> keras.losses.Loss:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@keras.saving.register_keras_serializable(package="keras_tfm")
class TokenClassifier(LabelsWords, _ScoresClasses, EncoderTask):
    """An encoder with a label per token: `(batch, length, num_classes)` logits; `label_words(texts)` with the
    checkpoint's tokenizer. `class_names` (default LABEL_0, ...): what `label_words` answers with and a saved
    checkpoint's `id2label` holds. The default loss skips labels of -100 (transformers' mark for a word's later
    pieces).

    Example:
    >>> encoder = keras_tfm.Bert(vocabulary_size=100, num_layers=1, hidden_dim=16, num_heads=2)
    >>> tagger = TokenClassifier(encoder, TokenClassificationHead(3), class_names=["O", "PER", "LOC"])
    >>> tuple(tagger(np.array([[2, 7, 9, 3]])).shape)
    (1, 4, 3)
    """

    head_class = TokenClassificationHead
    default_name = "token_classifier"
    lora_trainable_layer_names = ("classifier",)

    def __init__(self, encoder: keras.Model, head: TokenClassificationHead, class_names: list | None = None,
                 **kwargs):  # fmt: skip
        super().__init__(encoder, head, **kwargs)
        self.class_names = checked_class_names(class_names, head.num_classes, type(self).__name__)
        self._compile_defaults()

    def call(self, token_ids, training=None, **inputs):
        token_ids, inputs = self._inputs(token_ids, inputs)
        return self.head(self._encode(token_ids, inputs, training), training=training)

    def default_loss(self) -> keras.losses.Loss:
        from keras_tfm.losses import TokenCrossEntropy

        return TokenCrossEntropy(ignore_class=IGNORED_LABEL)


@keras.saving.register_keras_serializable(package="keras_tfm")
class QuestionAnswerer(AnswersQuestions, EncoderTask):
    """An encoder for extractive question answering: `(batch, 2, length)` logits, where in the context (the second
    sentence) the answer starts (`[:, 0]`) and ends (`[:, 1]`); `answer(question, context)`. The default loss takes
    labels `(batch, 2)`, the start and end token positions (transformers' `start_positions` and `end_positions`),
    and averages the two cross-entropies as transformers does.

    Example:
    >>> encoder = keras_tfm.Bert(vocabulary_size=100, num_layers=1, hidden_dim=16, num_heads=2)
    >>> reader = QuestionAnswerer(encoder, SpanHead())
    >>> tuple(reader(np.array([[2, 7, 3, 9, 11, 3]]), segment_ids=np.array([[0, 0, 0, 1, 1, 1]])).shape)
    (1, 2, 6)
    """

    head_class = SpanHead
    default_name = "question_answerer"
    lora_trainable_layer_names = ("classifier",)

    def __init__(self, encoder: keras.Model, head: SpanHead, **kwargs):
        super().__init__(encoder, head, **kwargs)
        self._compile_defaults()

    def call(self, token_ids, training=None, **inputs):
        token_ids, inputs = self._inputs(token_ids, inputs)
        return self.head(self._encode(token_ids, inputs, training), training=training)

    def _label_range(self) -> tuple[int, str]:
        return self.encoder.longest_input, "max_length"

    def default_loss(self) -> keras.losses.Loss:
        from keras_tfm.losses import TokenCrossEntropy

        return TokenCrossEntropy()


class FlatArguments:
    """A family's task model made from flat arguments: the encoder's (`encoder_arguments`, as `encoder_class` takes
    them) beside the task's own; its config is those flat arguments, as its constructor takes them."""

    encoder_class: type
    encoder_arguments: tuple

    @classmethod
    def _flat_encoder(cls, kwargs: dict) -> keras.Model:
        """The encoder made from (and taken out of) `kwargs`, in the task's dtype."""
        arguments = {name: kwargs.pop(name) for name in cls.encoder_arguments if name in kwargs}
        return cls.encoder_class(**arguments, dtype=kwargs.get("dtype"), name="encoder")

    @classmethod
    def _constructor_arguments(cls) -> list[str]:
        own = [name for name in super()._constructor_arguments() if name not in ("encoder", "head")]
        return [*own, *cls.encoder_arguments]

    def _config_value(self, name: str):
        return getattr(self.encoder if name in self.encoder_arguments else self, name)
