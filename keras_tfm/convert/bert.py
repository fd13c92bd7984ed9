"""BERT (`BertModel`, `BertForMaskedLM`, `BertForPreTraining`, `BertForSequenceClassification`,
`BertForTokenClassification`, `BertForQuestionAnswering`) <-> `keras_tfm.Bert`, `BertMLM`, `BertClassifier`,
`BertTokenClassifier`, `BertQuestionAnswerer`. PyTorch `Linear` kernels are (out, in) and are transposed; the MLM
decoder is tied to the word embeddings, so only its bias is read."""

from __future__ import annotations

from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.weights import (
    ACTIVATIONS,
    WeightReader,
    WeightWriter,
    hugging_face_activation,
    require_options,
    set_layer_norm,
)
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.models.bert import Bert, BertClassifier, BertMLM
from keras_tfm.models.bert_token_heads import BertQuestionAnswerer, BertTokenClassifier


def _blocks(encoder: Bert, w: WeightReader | WeightWriter, prefix: str = "") -> None:
    """Reads (`WeightReader`) or writes (`WeightWriter`) the blocks under their checkpoint names."""
    for i, block in enumerate(encoder.blocks):
        p = f"{prefix}encoder.layer.{i}."
        attention = block.self_attention
        for dense, name in (
            (attention.query_dense, "attention.self.query"),
            (attention.key_dense, "attention.self.key"),
            (attention.value_dense, "attention.self.value"),
            (attention.output_dense, "attention.output.dense"),
            (block.feed_forward.intermediate_dense, "intermediate.dense"),
            (block.feed_forward.output_dense, "output.dense"),
        ):
            w.linear(p + name, dense)
        w.layer_norm(p + "attention.output.LayerNorm", block.self_attention_norm)
        w.layer_norm(p + "output.LayerNorm", block.feed_forward_norm)


@converter("bert", prefixes=("bert.",))
def convert_bert(config: dict, w: WeightReader, num_classes: int | None = None):
    # a BERT decoder (causal, with cross-attention) or relative positions is another model than `Bert`
    require_options("BERT", config, is_decoder=False, add_cross_attention=False, position_embedding_type="absolute")
    if config.get("hidden_act", "gelu") not in ACTIVATIONS:
        raise CheckpointError(f"BERT activation {config['hidden_act']!r} is not supported.", caller="from_huggingface")
    arguments = dict(
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
        activation=ACTIVATIONS[config.get("hidden_act", "gelu")],
    )
    model = _task_model(config, w, num_classes, arguments)
    model.build()
    encoder = model if isinstance(model, Bert) else model.encoder
    w.set(encoder.token_embedding, "embeddings.word_embeddings.weight")
    w.set(encoder.position_embedding, "embeddings.position_embeddings.weight")
    w.set(encoder.segment_embedding, "embeddings.token_type_embeddings.weight")
    set_layer_norm(encoder.embedding_norm, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))
    _blocks(encoder, w)
    # The MLM decoder is tied to the word embeddings (its bias is cls.predictions.bias); the
    # next-sentence head of BertForPreTraining checkpoints has no counterpart here.
    ignored = ("cls.predictions.decoder.", "cls.seq_relationship.")
    if isinstance(model, BertMLM):
        w.linear("cls.predictions.transform.dense", model.transform)
        set_layer_norm(
            model.transform_norm,
            w("cls.predictions.transform.LayerNorm.weight"),
            w("cls.predictions.transform.LayerNorm.bias"),
        )
        model.output_bias.assign(w("cls.predictions.bias"))
        ignored += ("pooler.", "bert.pooler.")  # a BertMLM has no pooler
    elif isinstance(model, (BertTokenClassifier, BertQuestionAnswerer)):
        head = model.classifier if isinstance(model, BertTokenClassifier) else model.span_head
        name = "classifier" if isinstance(model, BertTokenClassifier) else "qa_outputs"
        if num_classes is None:
            w.linear(name, head)
        ignored += ("pooler.", "bert.pooler.", "cls.", *((name + ".",) * (num_classes is not None)))
    elif isinstance(model, BertClassifier):
        if num_classes is None or "pooler.dense.weight" in w:  # a new head keeps the checkpoint's pooler
            w.linear("pooler.dense", model.pooler)
        if num_classes is None:
            w.linear("classifier", model.classifier)
        else:
            ignored += ("classifier.",)  # the checkpoint's own head, replaced by a fresh one
        ignored += ("cls.",)  # the masked-LM head of a pretraining checkpoint under a classifier
    else:
        ignored += ("pooler.", "bert.pooler.")  # keras_tfm.Bert returns token vectors, not a pooled vector
    w.check_all_used(
        "from_huggingface", "BERT", ignore=lambda name: name.startswith(ignored) or name.endswith("position_ids")
    )
    return model


def _task_model(config: dict, w: WeightReader, num_classes: int | None, arguments: dict):
    """The model of the checkpoint's task (its `architectures`, else its head's weights); `num_classes`: a
    classifier with a new head (a peft adapter's head on a BertForPreTraining checkpoint, bert-base-uncased)."""
    # classifier_dropout: None there means hidden_dropout_prob, as here
    dropout = {"classifier_dropout": config.get("classifier_dropout")}
    task = next(iter(config.get("architectures") or []), "")
    if task == "BertForTokenClassification":
        names = config.get("id2label") or {}
        count = num_classes or w.weights["classifier.weight"].shape[0]
        class_names = [names.get(str(i), names.get(i, f"LABEL_{i}")) for i in range(count)] if not num_classes else None
        return BertTokenClassifier(num_classes=count, class_names=class_names, **dropout, **arguments)
    if task == "BertForQuestionAnswering" or "qa_outputs.weight" in w:
        return BertQuestionAnswerer(**arguments)
    if num_classes is not None:
        return BertClassifier(num_classes=num_classes, **dropout, **arguments)
    if "classifier.weight" in w:
        return BertClassifier(num_classes=w.weights["classifier.weight"].shape[0], **dropout, **arguments)
    return BertMLM(**arguments) if "cls.predictions.transform.dense.weight" in w else Bert(**arguments)


@exporter(Bert)
@exporter(BertMLM)
@exporter(BertClassifier)
@exporter(BertTokenClassifier)
@exporter(BertQuestionAnswerer)
def export_bert(model, w: WeightWriter) -> dict:
    encoder = model if isinstance(model, Bert) else model.encoder
    p = "" if isinstance(model, Bert) else "bert."  # BertModel's names, and its task models'
    w[p + "embeddings.word_embeddings.weight"] = encoder.token_embedding.embeddings
    w[p + "embeddings.position_embeddings.weight"] = encoder.position_embedding.embeddings
    w[p + "embeddings.token_type_embeddings.weight"] = encoder.segment_embedding.embeddings
    w.layer_norm(p + "embeddings.LayerNorm", encoder.embedding_norm)
    _blocks(encoder, w, p)
    activation = hugging_face_activation("BERT", encoder.activation)
    config = dict(
        model_type="bert",
        vocab_size=encoder.vocabulary_size,
        max_position_embeddings=encoder.max_length,
        type_vocab_size=encoder.num_segments,
        num_hidden_layers=encoder.num_layers,
        num_attention_heads=encoder.num_heads,
        hidden_size=encoder.hidden_dim,
        intermediate_size=encoder.intermediate_dim,
        hidden_dropout_prob=encoder.dropout,
        attention_probs_dropout_prob=encoder.attention_dropout,
        layer_norm_eps=encoder.layer_norm_epsilon,
        hidden_act=activation,
    )
    if isinstance(model, BertMLM):
        # transformers' head uses the encoder's activation and epsilon
        for field, value, encoders in (
            ("head_activation", model.head_activation, encoder.activation),
            ("head_layer_norm_epsilon", model.head_layer_norm_epsilon, encoder.layer_norm_epsilon),
        ):
            if value not in (None, encoders):
                raise InputError(
                    f"BertForMaskedLM's head has the encoder's {field.removeprefix('head_')} "
                    f"({encoders!r}); received {field}={value!r}.",
                    caller="save_huggingface",
                )
        w.linear("cls.predictions.transform.dense", model.transform)
        w.layer_norm("cls.predictions.transform.LayerNorm", model.transform_norm)
        w["cls.predictions.bias"] = model.output_bias
        return dict(config, architectures=["BertForMaskedLM"])
    if isinstance(model, BertTokenClassifier):
        w.linear("classifier", model.classifier)
        return dict(config, architectures=["BertForTokenClassification"], classifier_dropout=model.classifier_dropout,
                    num_labels=model.num_classes)  # fmt: skip
    if isinstance(model, BertQuestionAnswerer):
        w.linear("qa_outputs", model.span_head)
        return dict(config, architectures=["BertForQuestionAnswering"])
    if isinstance(model, BertClassifier):
        w.linear(p + "pooler.dense", model.pooler)
        w.linear("classifier", model.classifier)
        return dict(
            config,
            architectures=["BertForSequenceClassification"],
            classifier_dropout=model.classifier_dropout,
            num_labels=model.num_classes,
        )
    return dict(config, architectures=["BertModel"])
