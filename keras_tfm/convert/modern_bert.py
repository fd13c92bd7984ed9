"""ModernBERT: `ModernBertModel`, `ModernBertFor{MaskedLM,SequenceClassification,TokenClassification,
QuestionAnswering}` <-> `keras_tfm.ModernBert` and its task models. The fused query/key/value projection
(`attn.Wqkv`) is split in three and the GeGLU's (`mlp.Wi`: the activated half first) in two; PyTorch `Linear` kernels
are (out, in) and are transposed; the masked-LM decoder is tied to the token embedding, so only its bias is read.
Both configs are read: transformers 5's (`layer_types`, `rope_parameters`) and the checkpoints' own
(`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`), which is what is written."""

from __future__ import annotations

from keras_tfm.convert.registry import check_head, converter, exporter
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    class_names_of,
    hugging_face_activation,
    keras_activation,
    require_options,
)
from keras_tfm.errors import CheckpointError
from keras_tfm.models.modern_bert import (
    ModernBert,
    ModernBertClassifier,
    ModernBertMLM,
    ModernBertQuestionAnswerer,
    ModernBertTokenClassifier,
)
from keras_tfm.models.text_tasks import MaskedLM, QuestionAnswerer, SequenceClassifier, TokenClassifier

_TASKS = {
    "MaskedLM": ModernBertMLM,
    "SequenceClassification": ModernBertClassifier,
    "TokenClassification": ModernBertTokenClassifier,
    "QuestionAnswering": ModernBertQuestionAnswerer,
}


def _global_every(config: dict) -> int:
    """The period of the global blocks, from `layer_types` where the config has them."""
    every = config.get("global_attn_every_n_layers", 3)
    types = config.get("layer_types")
    if types:
        globals_ = [i for i, kind in enumerate(types) if kind == "full_attention"]
        every = globals_[1] if len(globals_) > 1 else len(types)
        if types != ["sliding_attention" if i % every else "full_attention" for i in range(len(types))]:
            raise CheckpointError(f"ModernBERT layer_types {types} do not repeat one global block every n layers "
                                  "from the first.", caller="from_huggingface")  # fmt: skip
    return every


def _thetas(config: dict) -> tuple[float, float]:
    rope = config.get("rope_parameters") or {}
    thetas = []
    for kind, field, default in (("full_attention", "global_rope_theta", 160000.0),
                                 ("sliding_attention", "local_rope_theta", 10000.0)):  # fmt: skip
        parameters = rope.get(kind) or {}
        if parameters.get("rope_type", "default") != "default":
            raise CheckpointError(f"ModernBERT rope_type {parameters['rope_type']!r} is not supported; supported: "
                                  "'default'.", caller="from_huggingface")  # fmt: skip
        thetas.append(float(parameters.get("rope_theta", config.get(field, default))))
    return thetas[0], thetas[1]


def _arguments(config: dict) -> dict:
    require_options("ModernBERT", config, attention_bias=False, mlp_bias=False, norm_bias=False,
                    classifier_bias=False, decoder_bias=True)  # fmt: skip
    global_theta, local_theta = _thetas(config)
    return dict(
        vocabulary_size=config["vocab_size"],
        max_length=config.get("max_position_embeddings", 8192),
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        hidden_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        local_attention=config.get("local_attention", 128),
        global_attention_every=_global_every(config),
        global_rope_theta=global_theta,
        local_rope_theta=local_theta,
        dropout=max(config.get("embedding_dropout", 0.0), config.get("mlp_dropout", 0.0)),
        attention_dropout=config.get("attention_dropout", 0.0),
        layer_norm_epsilon=config.get("norm_eps", 1e-5),
        activation=keras_activation("ModernBERT", config, "hidden_activation", "gelu"),
    )


def _task(config: dict, w: WeightReader, num_classes: int | None) -> str | None:
    task = next(iter(config.get("architectures") or []), "").split("For", 1)[-1]
    if num_classes is not None:
        return task if task in ("SequenceClassification", "TokenClassification") else "SequenceClassification"
    if task in _TASKS:
        return task
    return "SequenceClassification" if "classifier.weight" in w else "MaskedLM" if "decoder.bias" in w else None


@converter("modernbert", prefixes=("model.",))
def convert_modern_bert(config: dict, w: WeightReader, num_classes: int | None = None):
    arguments = _arguments(config)
    task = _task(config, w, num_classes)
    model = _task_model(task, config, w, num_classes, arguments)
    model.build()
    encoder = model if task is None else model.encoder
    w.set(encoder.token_embedding, "embeddings.tok_embeddings.weight")
    w.set(encoder.embedding_norm, "embeddings.norm.weight")
    for i, block in enumerate(encoder.blocks):
        _block(block, w, f"layers.{i}.", i)
    w.set(encoder.final_norm, "final_norm.weight")
    fresh = ("head.", "classifier.") if num_classes is not None else ()  # a new head replaces the checkpoint's
    if task is not None and num_classes is None:
        w.linear("head.dense", model.head.transform.dense)
        w.set(model.head.transform.norm, "head.norm.weight")
        if task == "MaskedLM":
            model.head.output_bias.assign(w("decoder.bias"))
        else:
            w.linear("classifier", model.head.classifier)
    w.check_all_used("from_huggingface", "ModernBERT", ignore=lambda name: name.startswith(("decoder.weight", *fresh)))
    return model


def _task_model(task: str | None, config: dict, w: WeightReader, num_classes: int | None, arguments: dict):
    if task is None:
        return ModernBert(**arguments)
    head = dict(arguments, head_activation=keras_activation("ModernBERT", config, "classifier_activation", "gelu"))
    if task == "MaskedLM":
        return ModernBertMLM(**head)
    dropout = config.get("classifier_dropout", 0.0)
    if task == "QuestionAnswering":
        return ModernBertQuestionAnswerer(classifier_dropout=dropout, **head)
    count = num_classes or w.weights["classifier.weight"].shape[0]
    if task == "TokenClassification":
        class_names = None if num_classes else class_names_of(config, count)
        return ModernBertTokenClassifier(num_classes=count, class_names=class_names, classifier_dropout=dropout, **head)
    pooling = config.get("classifier_pooling", "cls")
    return ModernBertClassifier(num_classes=count, pooling=pooling, classifier_dropout=dropout, **head)


def _block(block, w: WeightReader | WeightWriter, p: str, index: int) -> None:
    """Reads (`WeightReader`) or writes (`WeightWriter`) a block under its checkpoint names."""
    attention = block.self_attention
    w.linear(p + "attn.Wqkv", attention.query_dense, attention.key_dense, attention.value_dense)
    w.linear(p + "attn.Wo", attention.output_dense)
    w.linear(p + "mlp.Wi", block.feed_forward.gate_dense, block.feed_forward.up_dense)
    w.linear(p + "mlp.Wo", block.feed_forward.output_dense)
    norms = (("attn_norm", block.self_attention_norm),) * (index > 0) + (("mlp_norm", block.feed_forward_norm),)
    for name, norm in norms:
        if isinstance(w, WeightWriter):
            w[p + name + ".weight"] = norm.gamma
        else:
            w.set(norm, p + name + ".weight")


@exporter(ModernBert)
@exporter(ModernBertMLM)
@exporter(ModernBertClassifier)
@exporter(ModernBertTokenClassifier)
@exporter(ModernBertQuestionAnswerer)
@exporter((MaskedLM, ModernBert))
@exporter((SequenceClassifier, ModernBert))
@exporter((TokenClassifier, ModernBert))
@exporter((QuestionAnswerer, ModernBert))
def export_modern_bert(model, w: WeightWriter) -> dict:
    encoder = model if isinstance(model, ModernBert) else model.encoder
    p = "" if isinstance(model, ModernBert) else "model."
    w[p + "embeddings.tok_embeddings.weight"] = encoder.token_embedding.embeddings
    w[p + "embeddings.norm.weight"] = encoder.embedding_norm.gamma
    for i, block in enumerate(encoder.blocks):
        _block(block, w, f"{p}layers.{i}.", i)
    w[p + "final_norm.weight"] = encoder.final_norm.gamma
    task, head = _write_head(model, w)
    return dict(_config(encoder), architectures=["ModernBert" + task], **head)


def _config(encoder: ModernBert) -> dict:
    return dict(
        model_type="modernbert",
        vocab_size=encoder.vocabulary_size,
        max_position_embeddings=encoder.max_length,
        num_hidden_layers=encoder.num_layers,
        num_attention_heads=encoder.num_heads,
        hidden_size=encoder.hidden_dim,
        intermediate_size=encoder.intermediate_dim,
        local_attention=encoder.local_attention,
        global_attn_every_n_layers=encoder.global_attention_every,
        global_rope_theta=encoder.global_rope_theta,
        local_rope_theta=encoder.local_rope_theta,
        embedding_dropout=encoder.dropout,
        mlp_dropout=encoder.dropout,
        attention_dropout=encoder.attention_dropout,
        norm_eps=encoder.layer_norm_epsilon,
        hidden_activation=hugging_face_activation("ModernBERT", encoder.activation),
        attention_bias=False,
        mlp_bias=False,
        norm_bias=False,
        classifier_bias=False,
        decoder_bias=True,
        # transformers' default special ids sit in the published 50,368-token vocabulary; a smaller one has none
        **({} if encoder.vocabulary_size > 50283 else dict.fromkeys(_SPECIAL_IDS)),
    )


_SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")


def _write_head(model, w: WeightWriter) -> tuple[str, dict]:
    """Writes the task model's head; returns its class's ending and what its config adds."""
    if isinstance(model, ModernBert):
        return "Model", {}
    transform = model.head.transform
    check_head(model, "ModernBERT", use_bias=False, norm_epsilon=model.encoder.layer_norm_epsilon, norm_center=False)
    w.linear("head.dense", transform.dense)
    w["head.norm.weight"] = transform.norm.gamma
    head = {"classifier_activation": hugging_face_activation("ModernBERT", transform.activation)}
    if isinstance(model, MaskedLM):
        w["decoder.bias"] = model.head.output_bias
        return "ForMaskedLM", head
    w.linear("classifier", model.head.classifier)
    head["classifier_dropout"] = model.head.dropout
    if isinstance(model, QuestionAnswerer):
        return "ForQuestionAnswering", dict(head, num_labels=2)
    if isinstance(model, TokenClassifier):
        return "ForTokenClassification", dict(head, num_labels=model.num_classes)
    if model.head.pooling not in ("cls", "mean"):
        check_head(model, "ModernBertForSequenceClassification", pooling="cls or mean")
    return "ForSequenceClassification", dict(head, num_labels=model.num_classes, classifier_pooling=model.head.pooling)
