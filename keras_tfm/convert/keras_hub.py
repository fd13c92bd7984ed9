"""`from_keras_hub`: the keras_tfm model with the weights of a keras-hub GPT-2, BERT or ViT.

Takes a keras-hub model (a backbone such as `GPT2Backbone`, or a task such as `GPT2CausalLM`) or a
local preset directory written by its `save_to_preset`. keras-hub keeps each attention projection
as an `EinsumDense` with per-head axes, `(hidden, heads, head_dim)` and `(heads, head_dim, hidden)`;
here they are `Dense` kernels `(hidden, heads * head_dim)` and `(heads * head_dim, hidden)`, the
same numbers in the same order. Everything else is copied as it is.

keras-hub ties GPT-2's output to its token table, as keras_tfm does; its BERT and GPT-2 use the
tanh approximation of GELU, its ViT the exact one.
"""

from __future__ import annotations

import os

import keras
from keras import ops

from keras_tfm.compat import sublayers
from keras_tfm.convert.files import read_json
from keras_tfm.convert.weights import WeightReader, require_options, set_dense, set_layer_norm
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.models.bert import Bert, BertClassifier, BertMLM
from keras_tfm.models.gpt import GPT
from keras_tfm.models.vit import ViT


def from_keras_hub(model_or_preset):
    """A keras_tfm model with the weights of a keras-hub model.

    Args:
        model_or_preset: a keras-hub model, or the path of a local preset directory (as written by
            `save_to_preset`; a task's preset loads as that task). Supported:
            `GPT2Backbone` and `GPT2CausalLM` -> `GPT`; `BertBackbone` -> `Bert` (token vectors; its
            pooler is left out), `BertMaskedLM` -> `BertMLM` (with keras-hub's head activation and
            epsilon) and `BertTextClassifier` -> `BertClassifier`; `ViTBackbone` ->
            `ViT(include_top=False)` and `ViTImageClassifier` (class-token pooling) -> `ViT`.

    Returns: the model, built, whose outputs equal the keras-hub model's.

    Example:
    >>> import keras_hub
    >>> hub = keras_hub.models.GPT2Backbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=32,
    ...                                     intermediate_dim=64, max_sequence_length=64)
    >>> model = keras_tfm.from_keras_hub(hub)    # a keras_tfm.GPT: logits = hub's output @ token table.T
    """
    if isinstance(model_or_preset, (str, os.PathLike)):
        model_or_preset = _load_preset(os.fspath(model_or_preset))
    kind = type(model_or_preset).__name__
    if kind not in _CONVERTERS:
        raise CheckpointError(f"unsupported model {kind}; supported: {sorted(_CONVERTERS)}.", caller="from_keras_hub")
    task = model_or_preset
    quantized = sorted({layer.quantization_mode for layer in sublayers(task) if layer.quantization_mode})
    if quantized:  # its weights are integers and scales; converting them as floats would be wrong
        raise CheckpointError(
            f"the {kind} is quantized ({', '.join(quantized)}); convert the float model, "
            f"then quantize the keras_tfm model: `from_keras_hub(...).quantize({quantized[0]!r})`.",
            caller="from_keras_hub",
        )
    backbone = getattr(task, "backbone", task)
    weights = {w.path: ops.convert_to_numpy(w) for w in task.weights}  # paths name layers: "token_embedding/..."
    return _CONVERTERS[kind](task, backbone, WeightReader(weights))


def _load_preset(path: str):
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise CheckpointError(
            f"no config.json in directory {path!r}; expected a keras-hub preset.", caller="from_keras_hub"
        )
    try:
        import keras_hub
    except ImportError:
        raise InputError(
            "reading a keras-hub preset needs keras-hub: pip install 'keras_tfm[keras-hub]'.", caller="from_keras_hub"
        ) from None

    task_path = os.path.join(path, "task.json")
    if os.path.isfile(task_path):  # a task's preset: its backbone (config.json) and its own layers
        name = read_json(task_path, "from_keras_hub").get("class_name")
        if name not in _CONVERTERS:
            raise CheckpointError(
                f"unsupported model {name} in {task_path!r}; supported: {sorted(_CONVERTERS)}.", caller="from_keras_hub"
            )
        return getattr(keras_hub.models, name).from_preset(path, preprocessor=None)
    return keras_hub.models.Backbone.from_preset(path)


def _set_attention(attention, w: WeightReader, prefix: str) -> None:
    """keras-hub `EinsumDense` projections (per-head axes) into our `Dense` ones."""
    for dense, name in (
        (attention.query_dense, "query"),
        (attention.key_dense, "key"),
        (attention.value_dense, "value"),
    ):
        kernel = w(f"{prefix}/{name}/kernel")
        set_dense(dense, kernel.reshape(kernel.shape[0], -1), w(f"{prefix}/{name}/bias").reshape(-1))
    kernel = w(f"{prefix}/attention_output/kernel")
    set_dense(attention.output_dense, kernel.reshape(-1, kernel.shape[-1]), w(f"{prefix}/attention_output/bias"))


def _set_layers(pairs, w: WeightReader) -> None:
    """(keras_tfm layer, keras-hub layer path) pairs of Dense or LayerNormalization layers."""
    for layer, path in pairs:
        if hasattr(layer, "kernel"):
            set_dense(layer, w(f"{path}/kernel"), w(f"{path}/bias"))
        else:
            set_layer_norm(layer, w(f"{path}/gamma"), w(f"{path}/beta"))


def _outputs_logits(task) -> bool:
    return task.get_config().get("activation") in (None, "linear")


def _check_all_used(kind: str, w: WeightReader, ignore: tuple = ()) -> None:
    w.check_all_used("from_keras_hub", kind, ignore=lambda name: name.startswith(ignore))


def _text_arguments(backbone) -> dict:
    """What keras-hub's GPT-2 and BERT backbones share, under keras_tfm's names (both use tanh GELU)."""
    return dict(
        vocabulary_size=backbone.vocabulary_size,
        max_length=backbone.max_sequence_length,
        num_layers=backbone.num_layers,
        num_heads=backbone.num_heads,
        hidden_dim=backbone.hidden_dim,
        intermediate_dim=backbone.intermediate_dim,
        dropout=backbone.dropout,
        activation="gelu_approximate",
    )


def _set_transformer_layer(block, w: WeightReader, prefix: str, attention: str) -> None:
    """A keras-hub `TransformerDecoder` (GPT-2) or `TransformerEncoder` (BERT) into our block."""
    _set_attention(block.self_attention, w, f"{prefix}/{attention}")
    _set_layers(
        [
            (block.self_attention_norm, f"{prefix}/self_attention_layer_norm"),
            (block.feed_forward_norm, f"{prefix}/feedforward_layer_norm"),
            (block.feed_forward.intermediate_dense, f"{prefix}/feedforward_intermediate_dense"),
            (block.feed_forward.output_dense, f"{prefix}/feedforward_output_dense"),
        ],
        w,
    )


def _gpt2(task, backbone, w: WeightReader) -> GPT:
    model = GPT(**_text_arguments(backbone), layer_norm_epsilon=1e-5)
    model.build()
    w.set(model.token_embedding, "token_embedding/embeddings")
    w.set(model.position_embedding, "position_embedding/embeddings")
    for i, block in enumerate(model.blocks):
        _set_transformer_layer(block, w, f"transformer_layer_{i}", "self_attention")
    _set_layers([(model.final_norm, "layer_norm")], w)
    _check_all_used("GPT-2", w)
    return model


def _bert(task, backbone, w: WeightReader):
    arguments = dict(_text_arguments(backbone), num_segments=backbone.num_segments, layer_norm_epsilon=1e-12)
    masked_lm = type(task).__name__ == "BertMaskedLM"
    classifier = task is not backbone and not masked_lm
    if classifier and not _outputs_logits(task):
        raise CheckpointError(
            f"BertTextClassifier with activation={task.get_config()['activation']!r} is "
            "not supported; keras_tfm's BertClassifier outputs logits.",
            caller="from_keras_hub",
        )
    if masked_lm:  # keras-hub's head: exact GELU and epsilon 1e-5 (its MaskedLMHead's defaults)
        head = task.masked_lm_head
        model = BertMLM(
            **arguments,
            head_activation=keras.activations.serialize(head.intermediate_activation),
            head_layer_norm_epsilon=head.layer_norm_epsilon,
        )
    else:
        model = BertClassifier(num_classes=task.num_classes, **arguments) if classifier else Bert(**arguments)
    model.build()
    encoder = model if isinstance(model, Bert) else model.encoder
    w.set(encoder.token_embedding, "token_embedding/embeddings")
    w.set(encoder.position_embedding, "position_embedding/embeddings")
    w.set(encoder.segment_embedding, "segment_embedding/embeddings")
    _set_layers([(encoder.embedding_norm, "embeddings_layer_norm")], w)
    for i, block in enumerate(encoder.blocks):
        _set_transformer_layer(block, w, f"transformer_layer_{i}", "self_attention_layer")
    if classifier:
        _set_layers([(model.head.transform.dense, "pooled_dense"), (model.head.classifier, "logits")], w)
    if masked_lm:
        _set_layers(
            [
                (model.head.transform.dense, "mlm_head/intermediate_dense"),
                (model.head.transform.norm, "mlm_head/intermediate_layer_norm"),
            ],
            w,
        )
        model.head.output_bias.assign(w("mlm_head/output_bias"))
    _check_all_used("BERT", w, ignore=() if classifier else ("pooled_dense/",))  # no pooler in Bert or BertMLM
    return model


def _vit(task, backbone, w: WeightReader) -> ViT:
    config = backbone.get_config()
    require_options(
        "ViTBackbone",
        config,
        caller="from_keras_hub",
        use_class_token=True,
        use_mha_bias=True,
        use_mlp_bias=True,
        use_patch_bias=True,
    )
    image_shape, patch_size = config["image_shape"], config["patch_size"]
    patch_size = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    if image_shape[0] != image_shape[1] or patch_size[0] != patch_size[1]:
        raise CheckpointError(
            f"ViTBackbone with non-square image_shape={tuple(image_shape)} or "
            f"patch_size={patch_size} is not supported.",
            caller="from_keras_hub",
        )
    include_top = task is not backbone
    if include_top and (task.pooling != "token" or task.intermediate_dim is not None or not _outputs_logits(task)):
        raise CheckpointError(
            f"ViTImageClassifier with pooling={task.pooling!r}, intermediate_dim="
            f"{task.intermediate_dim!r}, activation={task.get_config()['activation']!r} is not supported; keras_tfm's "
            "ViT classifies the class token into logits (keras-hub's 'gap' also averages the class token in).",
            caller="from_keras_hub",
        )
    model = ViT(
        image_size=image_shape[0],
        patch_size=patch_size[0],
        num_classes=task.num_classes if include_top else 1,
        num_layers=config["num_layers"],
        num_heads=config["num_heads"],
        hidden_dim=config["hidden_dim"],
        intermediate_dim=config["mlp_dim"],
        num_channels=image_shape[2],
        include_top=include_top,
        dropout=config["dropout_rate"],
        attention_dropout=config["attention_dropout"],
        layer_norm_epsilon=config["layer_norm_epsilon"],
        activation="gelu",
    )
    model.build()
    embedding = "vit_patching_and_embedding"
    model.class_token.assign(w(f"{embedding}/class_token"))
    w.set(model.position_embedding, f"{embedding}/position_embedding/embeddings")
    model.patch_embedding.projection.set_weights(
        [w(f"{embedding}/patch_embedding/kernel"), w(f"{embedding}/patch_embedding/bias")]
    )
    for i, block in enumerate(model.blocks):
        p = f"vit_encoder/transformer_block_{i + 1}"
        _set_attention(block.self_attention, w, f"{p}/mha")
        _set_layers(
            [
                (block.self_attention_norm, f"{p}/ln_1"),
                (block.feed_forward_norm, f"{p}/ln_2"),
                (block.feed_forward.intermediate_dense, f"{p}/mlp/dense_1"),
                (block.feed_forward.output_dense, f"{p}/mlp/dense_2"),
            ],
            w,
        )
    _set_layers([(model.final_norm, "vit_encoder/ln")] + ([(model.head, "predictions")] if include_top else []), w)
    _check_all_used("ViT", w)
    return model


_CONVERTERS = {
    "GPT2Backbone": _gpt2,
    "GPT2CausalLM": _gpt2,
    "BertBackbone": _bert,
    "BertTextClassifier": _bert,
    "BertMaskedLM": _bert,
    "ViTBackbone": _vit,
    "ViTImageClassifier": _vit,
}
