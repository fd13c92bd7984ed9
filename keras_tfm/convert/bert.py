"""BERT (`BertModel`, `BertForMaskedLM`, `BertForPreTraining`, `BertForSequenceClassification`) <-> `keras_tfm.Bert`,
`BertMLM`, `BertClassifier`. PyTorch `Linear` kernels are (out, in) and are transposed; the MLM
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
    # BertForSequenceClassification's classifier_dropout: None there means hidden_dropout_prob, as here
    classifier_dropout = config.get("classifier_dropout")
    # a classifier head first: a peft adapter's head on a BertForPreTraining checkpoint (bert-base-uncased)
    if num_classes is not None:
        model = BertClassifier(num_classes=num_classes, classifier_dropout=classifier_dropout, **arguments)
    elif "classifier.weight" in w:
        model = BertClassifier(
            num_classes=w.weights["classifier.weight"].shape[0], classifier_dropout=classifier_dropout, **arguments
        )
    elif "cls.predictions.transform.dense.weight" in w:
        model = BertMLM(**arguments)
    else:
        model = Bert(**arguments)
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


@exporter(Bert)
@exporter(BertMLM)
@exporter(BertClassifier)
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
