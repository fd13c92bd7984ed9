"""BERT, RoBERTa (XLM-RoBERTa too) and DistilBERT: `*Model`, `*ForMaskedLM`, `BertForPreTraining`,
`*ForSequenceClassification`, `*ForTokenClassification`, `*ForQuestionAnswering` <-> `keras_tfm.Bert`, `BertMLM`,
`BertClassifier`,
`BertTokenClassifier`, `BertQuestionAnswerer`. RoBERTa is BERT with its positions from 2 on (`position_offset`;
its padding id is 1), one segment, and other names for its heads; DistilBERT is BERT without segments, other
names, and a ReLU pooler under its classifier. PyTorch `Linear` kernels are (out, in) and are
transposed; the MLM decoder is tied to the word embeddings, so only its bias is read."""

from __future__ import annotations

from typing import NamedTuple

from keras_tfm.convert.registry import check_head, converter, exporter
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    class_names_of,
    hugging_face_activation,
    keras_activation,
    require_options,
    set_layer_norm,
)
from keras_tfm.errors import InputError
from keras_tfm.models.bert import Bert, BertClassifier, BertMLM, BertQuestionAnswerer, BertTokenClassifier
from keras_tfm.models.text_tasks import MaskedLM, QuestionAnswerer, SequenceClassifier, TokenClassifier


def _blocks(family, encoder: Bert, w: WeightReader | WeightWriter, prefix: str = "") -> None:
    """Reads (`WeightReader`) or writes (`WeightWriter`) the blocks under their checkpoint names."""
    for i, block in enumerate(encoder.blocks):
        p = f"{prefix}{family.layers}.{i}."
        attention = block.self_attention
        query, key, value, output, ffn_in, ffn_out, attention_norm, ffn_norm = family.block
        for dense, name in (
            (attention.query_dense, query),
            (attention.key_dense, key),
            (attention.value_dense, value),
            (attention.output_dense, output),
            (block.feed_forward.intermediate_dense, ffn_in),
            (block.feed_forward.output_dense, ffn_out),
        ):
            w.linear(p + name, dense)
        w.layer_norm(p + attention_norm, block.self_attention_norm)
        w.layer_norm(p + ffn_norm, block.feed_forward_norm)


class Family(NamedTuple):
    """Where a family's checkpoints keep what `Bert`'s task models hold."""

    model_type: str
    prefix: str  # of the encoder's weights under a task model
    architecture: str  # the start of its classes' names
    transform: str  # the masked-LM head's Dense and LayerNorm, and its output bias
    transform_norm: str
    output_bias: str
    pooler: str  # the sequence classifier's Dense + tanh on the first token, and its output layer
    classifier: str
    ignored: tuple  # weights with no counterpart: a tied decoder, a pooler no task model reads
    pooler_activation: str = "tanh"
    layers: str = "encoder.layer"
    block: tuple = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                    "intermediate.dense", "output.dense", "attention.output.LayerNorm", "output.LayerNorm")  # fmt: skip


BERT = Family("bert", "bert.", "Bert", "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
              "cls.predictions.bias", "pooler.dense", "classifier",
              ("cls.predictions.decoder.", "cls.seq_relationship."))  # fmt: skip
ROBERTA = Family("roberta", "roberta.", "Roberta", "lm_head.dense", "lm_head.layer_norm", "lm_head.bias",
                 "classifier.dense", "classifier.out_proj", ("lm_head.decoder.",))  # fmt: skip
DISTILBERT = Family("distilbert", "distilbert.", "DistilBert", "vocab_transform", "vocab_layer_norm",
                    "vocab_projector.bias", "pre_classifier", "classifier", ("vocab_projector.weight",), "relu",
                    "transformer.layer", ("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin",
                                          "ffn.lin1", "ffn.lin2", "sa_layer_norm", "output_layer_norm"))  # fmt: skip


@converter("bert", prefixes=("bert.",))
def convert_bert(config: dict, w: WeightReader, num_classes: int | None = None):
    return _convert(BERT, config, w, num_classes)


@converter("roberta", "xlm-roberta", prefixes=("roberta.",))
def convert_roberta(config: dict, w: WeightReader, num_classes: int | None = None):
    return _convert(ROBERTA, config, w, num_classes)


@converter("distilbert", prefixes=("distilbert.",))
def convert_distilbert(config: dict, w: WeightReader, num_classes: int | None = None):
    return _convert(DISTILBERT, config, w, num_classes)


def _arguments(family: Family, config: dict) -> tuple[dict, float | None]:
    """`Bert`'s arguments from the family's config (DistilBERT names its fields apart), and the classifier's dropout."""
    if family is DISTILBERT:
        config = dict(
            config, hidden_size=config["dim"], num_hidden_layers=config["n_layers"],
            num_attention_heads=config["n_heads"], intermediate_size=config["hidden_dim"], type_vocab_size=0,
            hidden_dropout_prob=config.get("dropout", 0.1),
            attention_probs_dropout_prob=config.get("attention_dropout", 0.1),
            hidden_act=config.get("activation", "gelu"),
            classifier_dropout=config.get("seq_classif_dropout", 0.2),
        )  # fmt: skip
    return dict(
        vocabulary_size=config["vocab_size"],
        max_length=config["max_position_embeddings"],
        num_segments=config.get("type_vocab_size", 2),
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        hidden_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        dropout=config.get("hidden_dropout_prob", 0.1),
        attention_dropout=config.get("attention_probs_dropout_prob", 0.1),
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
        activation=keras_activation(family.architecture.upper(), config, "hidden_act", "gelu"),
        position_offset=config.get("pad_token_id", 1) + 1 if family is ROBERTA else 0,
    ), config.get("classifier_dropout")


def _convert(family: Family, config: dict, w: WeightReader, num_classes: int | None):
    name = family.architecture.upper()
    # a decoder (causal, with cross-attention) or relative positions is another model than `Bert`
    require_options(name, config, is_decoder=False, add_cross_attention=False, position_embedding_type="absolute")
    arguments, classifier_dropout = _arguments(family, config)
    model = _task_model(family, config, w, num_classes, arguments, classifier_dropout)
    model.build()
    encoder = model if isinstance(model, Bert) else model.encoder
    w.set(encoder.token_embedding, "embeddings.word_embeddings.weight")
    w.set(encoder.position_embedding, "embeddings.position_embeddings.weight")
    if encoder.segment_embedding:
        w.set(encoder.segment_embedding, "embeddings.token_type_embeddings.weight")
    set_layer_norm(encoder.embedding_norm, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))
    _blocks(family, encoder, w)
    ignored = family.ignored + _read_head(family, model, w, num_classes)
    w.check_all_used(
        "from_huggingface", name, ignore=lambda name: name.startswith(ignored) or name.endswith("position_ids")
    )
    return model


def _read_head(family: Family, model, w: WeightReader, num_classes: int | None) -> tuple:
    """Reads the task model's head; returns the prefixes of the weights it leaves unread."""
    poolers = ("pooler.", family.prefix + "pooler.")
    if isinstance(model, MaskedLM):
        w.linear(family.transform, model.head.transform.dense)
        w.layer_norm(family.transform_norm, model.head.transform.norm)
        model.head.output_bias.assign(w(family.output_bias))
        return poolers  # a BertMLM has no pooler
    if isinstance(model, (TokenClassifier, QuestionAnswerer)):
        name = "classifier" if isinstance(model, TokenClassifier) else "qa_outputs"
        if num_classes is None:
            w.linear(name, model.head.classifier)
        return (*poolers, "cls.", *((name + ".",) * (num_classes is not None)))
    if isinstance(model, SequenceClassifier):
        if num_classes is None or (family is BERT and "pooler.dense.weight" in w):  # a new head keeps BERT's pooler
            w.linear(family.pooler, model.head.transform.dense)
        if num_classes is None:
            w.linear(family.classifier, model.head.classifier)
        # a pretraining checkpoint's masked-LM head; with `num_classes`, its own head (a fresh one replaces it)
        return (
            "cls.",
            "lm_head.",
            *((*poolers, "classifier.", family.pooler + ".") if num_classes is not None else ()),
        )
    return poolers  # keras_tfm.Bert returns token vectors, not a pooled vector


def _task_model(family: Family, config: dict, w: WeightReader, num_classes: int | None, arguments: dict,
                classifier_dropout: float | None):  # fmt: skip
    """The model of the checkpoint's task (its `architectures`, else its head's weights); `num_classes`: a
    classifier with a new head (a peft adapter's head on a BertForPreTraining checkpoint, bert-base-uncased)."""
    dropout = {"classifier_dropout": classifier_dropout}  # None there means hidden_dropout_prob, as here
    task = next(iter(config.get("architectures") or []), "").split("For", 1)[-1]
    if task == "TokenClassification":
        count = num_classes or w.weights["classifier.weight"].shape[0]
        class_names = None if num_classes else class_names_of(config, count)
        return BertTokenClassifier(num_classes=count, class_names=class_names, **dropout, **arguments)
    if task == "QuestionAnswering" or "qa_outputs.weight" in w:
        return BertQuestionAnswerer(**arguments)
    pooler = {"pooler_activation": family.pooler_activation}
    if num_classes is not None:
        return BertClassifier(num_classes=num_classes, **dropout, **pooler, **arguments)
    if family.classifier + ".weight" in w:
        count = w.weights[family.classifier + ".weight"].shape[0]
        return BertClassifier(num_classes=count, **dropout, **pooler, **arguments)
    return BertMLM(**arguments) if family.transform + ".weight" in w else Bert(**arguments)


@exporter(Bert)
@exporter(BertMLM)
@exporter(BertClassifier)
@exporter(BertTokenClassifier)
@exporter(BertQuestionAnswerer)
@exporter((MaskedLM, Bert))
@exporter((SequenceClassifier, Bert))
@exporter((TokenClassifier, Bert))
@exporter((QuestionAnswerer, Bert))
def export_bert(model, w: WeightWriter) -> dict:
    encoder = model if isinstance(model, Bert) else model.encoder
    # RoBERTa's positions start after its padding id; DistilBERT has no segments
    family = ROBERTA if encoder.position_offset else DISTILBERT if not encoder.num_segments else BERT
    p = "" if isinstance(model, Bert) else family.prefix  # the *Model's names, and its task models'
    w[p + "embeddings.word_embeddings.weight"] = encoder.token_embedding.embeddings
    w[p + "embeddings.position_embeddings.weight"] = encoder.position_embedding.embeddings
    if encoder.segment_embedding:
        w[p + "embeddings.token_type_embeddings.weight"] = encoder.segment_embedding.embeddings
    w.layer_norm(p + "embeddings.LayerNorm", encoder.embedding_norm)
    _blocks(family, encoder, w, p)
    task, head = _write_head(family, model, w, p)
    return dict(
        _config(family, encoder, head.pop("classifier_dropout", None)),
        architectures=[family.architecture + task],
        **head,
    )


def _config(family: Family, encoder: Bert, classifier_dropout: float | None) -> dict:
    activation = hugging_face_activation(family.architecture.upper(), encoder.activation)
    sizes = dict(vocab_size=encoder.vocabulary_size, max_position_embeddings=encoder.max_length)
    if family is DISTILBERT:
        if encoder.layer_norm_epsilon != 1e-12:
            raise InputError("DistilBERT's layer norms use 1e-12; received layer_norm_epsilon="
                             f"{encoder.layer_norm_epsilon}.", caller="save_huggingface")  # fmt: skip
        return dict(
            sizes, model_type="distilbert", dim=encoder.hidden_dim, n_layers=encoder.num_layers,
            n_heads=encoder.num_heads,
            hidden_dim=encoder.intermediate_dim, dropout=encoder.dropout, attention_dropout=encoder.attention_dropout,
            activation=activation, pad_token_id=0, sinusoidal_pos_embds=False,
            **({"seq_classif_dropout": classifier_dropout} if classifier_dropout is not None else {}),
        )  # fmt: skip
    return dict(
        sizes,
        model_type=family.model_type,
        type_vocab_size=encoder.num_segments,
        num_hidden_layers=encoder.num_layers,
        num_attention_heads=encoder.num_heads,
        hidden_size=encoder.hidden_dim,
        intermediate_size=encoder.intermediate_dim,
        hidden_dropout_prob=encoder.dropout,
        attention_probs_dropout_prob=encoder.attention_dropout,
        layer_norm_eps=encoder.layer_norm_epsilon,
        hidden_act=activation,
        **({"classifier_dropout": classifier_dropout} if classifier_dropout is not None else {}),
        **(
            {"pad_token_id": encoder.position_offset - 1, "bos_token_id": 0, "eos_token_id": 2}
            if family is ROBERTA
            else {}
        ),
    )


def _write_head(family: Family, model, w: WeightWriter, p: str) -> tuple[str, dict]:
    """Writes the task model's head; returns its class's ending and what its config adds."""
    if isinstance(model, MaskedLM):
        transform = model.head.transform
        encoder = model.encoder
        check_head(model, "BertForMaskedLM", activation=encoder.activation, use_bias=True,
                   norm_epsilon=encoder.layer_norm_epsilon, norm_center=True)  # fmt: skip
        w.linear(family.transform, transform.dense)
        w.layer_norm(family.transform_norm, transform.norm)
        w[family.output_bias] = model.head.output_bias
        return "ForMaskedLM", {}
    if isinstance(model, TokenClassifier):
        check_head(model, "BertForTokenClassification", transform=None)
        w.linear("classifier", model.head.classifier)
        return "ForTokenClassification", {"classifier_dropout": model.head.dropout, "num_labels": model.num_classes}
    if isinstance(model, QuestionAnswerer):
        check_head(model, "BertForQuestionAnswering", transform=None, dropout=0.0)
        w.linear("qa_outputs", model.head.classifier)
        return "ForQuestionAnswering", {}
    if isinstance(model, SequenceClassifier):
        check_head(model, family.architecture + "ForSequenceClassification", pooling="cls",
                   activation=family.pooler_activation, use_bias=True, norm_epsilon=None)  # fmt: skip
        w.linear((p if family is BERT else "") + family.pooler, model.head.transform.dense)
        w.linear(family.classifier, model.head.classifier)
        return "ForSequenceClassification", {"classifier_dropout": model.head.dropout, "num_labels": model.num_classes}
    return "Model", {}
