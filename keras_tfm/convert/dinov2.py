"""DINOv2 (`Dinov2Model`, `Dinov2WithRegistersModel`, their `...ForImageClassification`) <-> `keras_tfm.ViT`.

DINOv2 is the one ViT with layer scale, a mask token, register tokens (the `_with_registers` checkpoints,
whose positions are resized with antialiasing) and, in its giant size, a SwiGLU MLP. Published checkpoints
name the layers as transformers 4 did (`attention.attention.query`, `mlp.weights_in`, ...); transformers 5's
names are read too, and written.
"""

from __future__ import annotations

import numpy as np

from keras_tfm.convert.registry import converter
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    class_names_of,
    hugging_face_activation,
    keras_activation,
    renamer,
    require_options,
    set_layer_norm,
)
from keras_tfm.errors import CheckpointError
from keras_tfm.models.vit import ViT

_OLD_NAMES = [
    (r"\.attention\.attention\.query\.", ".attention.q_proj."),
    (r"\.attention\.attention\.key\.", ".attention.k_proj."),
    (r"\.attention\.attention\.value\.", ".attention.v_proj."),
    (r"\.attention\.output\.dense\.", ".attention.o_proj."),
    (r"\.mlp\.weights_out\.", ".mlp.down_proj."),
]

rename_dinov2 = renamer(_OLD_NAMES)


def swiglu_width(hidden_size: int, mlp_ratio: float) -> int:
    """DINOv2's SwiGLU width: two thirds of the MLP's, rounded up to a multiple of 8."""
    return (int(int(hidden_size * mlp_ratio) * 2 / 3) + 7) // 8 * 8


@converter("dinov2", "dinov2_with_registers", prefixes=("dinov2.", "dinov2_with_registers."), rename=rename_dinov2)
def convert_dinov2(config: dict, w: WeightReader, num_classes: int | None = None) -> ViT:
    require_options("DINOv2", config, qkv_bias=True, apply_layernorm=True)
    checkpoint_head = "classifier.weight" in w.weights and num_classes is None
    if checkpoint_head:
        num_classes = w.weights["classifier.weight"].shape[0]
    hidden, ratio, swiglu = config["hidden_size"], config.get("mlp_ratio", 4), config.get("use_swiglu_ffn", False)
    registers = config.get("num_register_tokens", 0) if config["model_type"] == "dinov2_with_registers" else 0
    model = ViT(
        image_size=_square(config, "image_size"),
        patch_size=_square(config, "patch_size"),
        num_classes=num_classes or 1,
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        hidden_dim=hidden,
        intermediate_dim=swiglu_width(hidden, ratio) if swiglu else int(hidden * ratio),
        num_channels=config.get("num_channels", 3),
        pooling="token_and_mean",  # Dinov2ForImageClassification's head reads both
        include_top=num_classes is not None,
        dropout=config.get("hidden_dropout_prob", 0.0),
        attention_dropout=config.get("attention_probs_dropout_prob", 0.0),
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-6),
        activation=keras_activation("DINOv2", config, "hidden_act", "gelu"),
        class_names=class_names_of(config, num_classes) if checkpoint_head else None,
        num_register_tokens=registers,
        mask_token="embeddings.mask_token" in w,
        layer_scale_init=config.get("layerscale_value", 1.0),
        drop_path_rate=config.get("drop_path_rate", 0.0),
        gated_feed_forward=swiglu,
        position_antialias=bool(registers) or config["model_type"] == "dinov2_with_registers",
    )
    model.build()
    _read_weights(model, w)
    if checkpoint_head:
        w.linear("classifier", model.head)
    ignored = () if checkpoint_head else ("classifier.",)  # a new head: fresh
    w.check_all_used("from_huggingface", "DINOv2", ignore=lambda name: name.startswith(ignored))
    return model


def _square(config: dict, field: str) -> int:
    value = config[field]
    if not isinstance(value, int) and len(set(value)) != 1:
        raise CheckpointError(f"DINOv2 checkpoints with a non-square {field}={value!r} are not supported.",
                              caller="from_huggingface")  # fmt: skip
    return value if isinstance(value, int) else value[0]


def _read_weights(model: ViT, w: WeightReader) -> None:
    w.set_variable(model.class_token, "embeddings.cls_token")
    model.position_embedding.set_weights([w("embeddings.position_embeddings")[0]])
    if model.mask_token:
        w.set_variable(model.mask_weight, "embeddings.mask_token")
    if model.num_register_tokens:
        w.set_variable(model.register_weight, "embeddings.register_tokens")
    read_patch_embedding(model, w)
    for i, block in enumerate(model.blocks):
        p = f"encoder.layer.{i}."
        set_layer_norm(block.self_attention_norm, w(p + "norm1.weight"), w(p + "norm1.bias"))
        for dense, name in attention_modules(block.self_attention):
            w.linear(p + "attention." + name, dense)
        w.set_variable(block.self_attention_scale.gamma, p + "layer_scale1.lambda1")
        set_layer_norm(block.feed_forward_norm, w(p + "norm2.weight"), w(p + "norm2.bias"))
        _read_mlp(block.feed_forward, w, p + "mlp.", model.gated_feed_forward)
        w.set_variable(block.feed_forward_scale.gamma, p + "layer_scale2.lambda1")
    set_layer_norm(model.final_norm, w("layernorm.weight"), w("layernorm.bias"))


def read_patch_embedding(model: ViT, w: WeightReader) -> None:
    """The patch projection: PyTorch's convolution (out, in, kh, kw) as Keras' (kh, kw, in, out)."""
    kernel = w("embeddings.patch_embeddings.projection.weight").transpose(2, 3, 1, 0)
    model.patch_embedding.projection.set_weights([kernel, w("embeddings.patch_embeddings.projection.bias")])


def write_patch_embedding(model, w: WeightWriter, p: str) -> None:
    """The patch projection under `{p}embeddings.patch_embeddings.projection`: `read_patch_embedding`'s inverse."""
    projection = model.patch_embedding.projection
    w[p + "embeddings.patch_embeddings.projection.weight"] = np.asarray(projection.kernel).transpose(3, 2, 0, 1)
    w[p + "embeddings.patch_embeddings.projection.bias"] = projection.bias


def attention_modules(attention) -> list:
    """`(Dense, transformers 5's module name)` of a self-attention's four projections."""
    return [(attention.query_dense, "q_proj"), (attention.key_dense, "k_proj"), (attention.value_dense, "v_proj"),
            (attention.output_dense, "o_proj")]  # fmt: skip


def _read_mlp(feed_forward, w: WeightReader, p: str, gated: bool) -> None:
    if not gated:
        w.linear(p + "fc1", feed_forward.intermediate_dense)
        w.linear(p + "fc2", feed_forward.output_dense)
        return
    if p + "weights_in.weight" in w:  # transformers 4's one matrix: the gate's rows, then the up projection's
        w.linear(p + "weights_in", feed_forward.gate_dense, feed_forward.up_dense)
    else:
        w.linear(p + "gate_proj", feed_forward.gate_dense)
        w.linear(p + "up_proj", feed_forward.up_dense)
    w.linear(p + "down_proj", feed_forward.output_dense)


def is_dinov2(model: ViT) -> bool:
    """Whether `save_huggingface` writes `model` as a DINOv2 checkpoint: a ViT with layer scale."""
    return model.layer_scale_init is not None and not model.distillation_token


def export_dinov2(model: ViT, w: WeightWriter) -> dict:
    """`model` as transformers' `Dinov2Model` (or with registers, or with its classifier): the converter's
    inverse."""
    if model.positions != "learned" or (model.include_top and model.pooling != "token_and_mean"):
        raise CheckpointError("DINOv2 checkpoints have learned positions and classify from the class token and "
                              f"the mean patch; received positions={model.positions!r}, pooling={model.pooling!r}.",
                              caller="save_huggingface")  # fmt: skip
    registers = model.num_register_tokens > 0 or model.position_antialias
    p = ("dinov2_with_registers." if registers else "dinov2.") if model.include_top else ""
    w[p + "embeddings.cls_token"] = model.class_token
    w[p + "embeddings.mask_token"] = model.mask_weight if model.mask_token else np.zeros((1, model.hidden_dim))
    if model.num_register_tokens:
        w[p + "embeddings.register_tokens"] = model.register_weight
    w[p + "embeddings.position_embeddings"] = model.position_embedding.embeddings[None]
    write_patch_embedding(model, w, p)
    for i, block in enumerate(model.blocks):
        b = f"{p}encoder.layer.{i}."
        w.layer_norm(b + "norm1", block.self_attention_norm)
        for dense, name in attention_modules(block.self_attention):
            w.linear(b + "attention." + name, dense)
        w[b + "layer_scale1.lambda1"] = block.self_attention_scale.gamma
        w.layer_norm(b + "norm2", block.feed_forward_norm)
        mlp = block.feed_forward
        if model.gated_feed_forward:
            w.linear(b + "mlp.gate_proj", mlp.gate_dense)
            w.linear(b + "mlp.up_proj", mlp.up_dense)
            w.linear(b + "mlp.down_proj", mlp.output_dense)
        else:
            w.linear(b + "mlp.fc1", mlp.intermediate_dense)
            w.linear(b + "mlp.fc2", mlp.output_dense)
        w[b + "layer_scale2.lambda1"] = block.feed_forward_scale.gamma
    w.layer_norm(p + "layernorm", model.final_norm)
    config = dict(
        model_type="dinov2_with_registers" if registers else "dinov2",
        image_size=model.image_size,
        patch_size=model.patch_size,
        num_channels=model.num_channels,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        hidden_size=model.hidden_dim,
        mlp_ratio=_mlp_ratio(model),
        use_swiglu_ffn=model.gated_feed_forward,
        hidden_dropout_prob=model.dropout,
        attention_probs_dropout_prob=model.attention_dropout,
        layer_norm_eps=model.layer_norm_epsilon,
        layerscale_value=model.layer_scale_init,
        drop_path_rate=model.drop_path_rate,
        hidden_act=hugging_face_activation("DINOv2", model.activation),
        qkv_bias=True,
        use_mask_token=True,
        **({"num_register_tokens": model.num_register_tokens} if registers else {}),
    )
    name = "Dinov2WithRegisters" if registers else "Dinov2"
    if not model.include_top:
        return dict(config, architectures=[f"{name}Model"])
    w.linear("classifier", model.head)
    return dict(config, architectures=[f"{name}ForImageClassification"], num_labels=model.num_classes)


def _mlp_ratio(model: ViT) -> float:
    """The `mlp_ratio` that gives the model's MLP width (DINOv2's SwiGLU width is derived from it)."""
    if not model.gated_feed_forward:
        ratio = model.intermediate_dim / model.hidden_dim
        return int(ratio) if ratio == int(ratio) else ratio
    for ratio in (4, 4.0, 8 / 3, 2, 3, 6):
        if swiglu_width(model.hidden_dim, ratio) == model.intermediate_dim:
            return ratio
    raise CheckpointError(f"no DINOv2 mlp_ratio gives a SwiGLU width of {model.intermediate_dim} for "
                          f"{model.hidden_dim} channels.", caller="save_huggingface")  # fmt: skip
