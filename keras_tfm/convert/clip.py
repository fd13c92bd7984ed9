"""CLIP (`CLIPModel` -> `keras_tfm.CLIP`) and its vision tower (`CLIPVisionModel` <-> `keras_tfm.ViT`).

CLIP's tower is the one ViT with a patch embedding without bias, a LayerNorm before the blocks (`pre_layrnorm`)
and `quick_gelu`. Its `last_hidden_state` is the blocks' output before the final norm (`model.hidden_states(images,
[num_layers])`); its `pooler_output` is the normalized class token, `model.features(images)[:, 0]`.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_tfm.convert.dinov2 import attention_modules
from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    hugging_face_activation,
    keras_activation,
    no_classifier,
    set_layer_norm,
)
from keras_tfm.errors import InputError
from keras_tfm.models.clip import CLIP, CLIPTextEncoder
from keras_tfm.models.vit import ViT


@converter("clip_vision_model", prefixes=("vision_model.",))  # CLIPVisionModelWithProjection's names
def convert_clip_vision(config: dict, w: WeightReader, num_classes: int | None = None) -> ViT | CLIP:
    """`CLIPVisionModel` as a `ViT`; `CLIPVisionModelWithProjection` as a `CLIP` of the image tower alone."""
    no_classifier("CLIPVisionModel", num_classes)
    return _one_tower(config, w, _vision_tower(config), "visual_projection", "CLIPVisionModel")


@converter("clip_text_model", prefixes=("text_model.",))  # transformers 4's and ...WithProjection's names
def convert_clip_text(config: dict, w: WeightReader, num_classes: int | None = None) -> CLIPTextEncoder | CLIP:
    """`CLIPTextModel` as a `CLIPTextEncoder`; `CLIPTextModelWithProjection` as a `CLIP` of the text tower alone."""
    no_classifier("CLIPTextModel", num_classes)
    return _one_tower(config, w, _text_tower(config), "text_projection", "CLIPTextModel")


def _one_tower(config: dict, w: WeightReader, tower, projection: str, architecture: str):
    """The tower alone, or with its projection (a `...WithProjection` checkpoint) as a CLIP of that tower."""
    projected = projection + ".weight" in w
    towers = (tower, None) if projection == "visual_projection" else (None, tower)
    model = CLIP(*towers, projection_dim=config.get("projection_dim", 512)) if projected else tower
    model.build()
    (_read_vision if projection == "visual_projection" else _read_text)(tower, w, "")
    if projected:
        w.linear(projection, getattr(model, projection))
    w.check_all_used("from_huggingface", architecture, ignore=lambda name: name.endswith("position_ids"))
    return model


@converter("clip")
def convert_clip(config: dict, w: WeightReader, num_classes: int | None = None) -> CLIP:
    no_classifier("CLIPModel", num_classes)
    text_config = config.get("text_config") or {}
    model = CLIP(_vision_tower(config.get("vision_config") or {}), _text_tower(text_config),
                 projection_dim=config.get("projection_dim", 512),
                 logit_scale_init=config.get("logit_scale_init_value", 2.6592))  # fmt: skip
    model.build()
    _read_vision(model.vision_encoder, w, "vision_model.")
    _read_text(model.text_encoder, w, "text_model.")
    w.linear("visual_projection", model.visual_projection)
    w.linear("text_projection", model.text_projection)
    model.logit_scale.assign(np.asarray(w("logit_scale"), "float32").reshape(()))
    w.check_all_used("from_huggingface", "CLIPModel", ignore=lambda name: name.endswith("position_ids"))
    return model


CLIP_VISION = dict(image_size=224, patch_size=32, num_hidden_layers=12, num_attention_heads=12, hidden_size=768,
                   intermediate_size=3072, hidden_act="quick_gelu", layer_norm_eps=1e-5)  # fmt: skip


def _vision_tower(config: dict) -> ViT:
    return vision_tower("CLIP", config, CLIP_VISION, patch_bias=False, norm_before_blocks=True)


def vision_tower(family: str, config: dict, defaults: dict, **fixed) -> ViT:
    """The image tower (a `ViT` without its head) of a vision config (`defaults` where it says nothing), with the
    `fixed` arguments."""
    get = {**defaults, **config}.get
    return ViT(
        image_size=get("image_size"),
        patch_size=get("patch_size"),
        num_layers=get("num_hidden_layers"),
        num_heads=get("num_attention_heads"),
        hidden_dim=get("hidden_size"),
        intermediate_dim=get("intermediate_size"),
        num_channels=get("num_channels", 3),
        include_top=False,
        attention_dropout=get("attention_dropout", 0.0),
        layer_norm_epsilon=get("layer_norm_eps"),
        activation=keras_activation(family, {**defaults, **config}, "hidden_act", defaults["hidden_act"]),
        name="vision_encoder",
        **fixed,
    )


CLIP_TEXT = dict(vocab_size=49408, max_position_embeddings=77, num_hidden_layers=12, num_attention_heads=8,
                 hidden_size=512, intermediate_size=2048, hidden_act="quick_gelu", layer_norm_eps=1e-5)  # fmt: skip


def _text_tower(config: dict) -> CLIPTextEncoder:
    end = config.get("eos_token_id", 49407)
    pooling = "largest_id" if end == 2 else "end_token"  # 2: the first checkpoints' configs
    return text_tower("CLIP", config, CLIP_TEXT, end_token_id=end, pooling=pooling)


def text_tower(family: str, config: dict, defaults: dict, **fixed) -> CLIPTextEncoder:
    """The `CLIPTextEncoder` of a text config (`defaults` where it says nothing), with the `fixed` arguments."""
    get = {**defaults, **config}.get
    return CLIPTextEncoder(
        vocabulary_size=get("vocab_size"),
        max_length=get("max_position_embeddings"),
        num_layers=get("num_hidden_layers"),
        num_heads=get("num_attention_heads"),
        hidden_dim=get("hidden_size"),
        intermediate_dim=get("intermediate_size"),
        activation=keras_activation(family, {**defaults, **config}, "hidden_act", defaults["hidden_act"]),
        layer_norm_epsilon=get("layer_norm_eps"),
        attention_dropout=get("attention_dropout", 0.0),
        name="text_encoder",
        **fixed,
    )


def _read_vision(model: ViT, w: WeightReader, p: str) -> None:
    w.check_shape(p + "embeddings.class_embedding", np.shape(w(p + "embeddings.class_embedding")), (model.hidden_dim,))
    model.class_token.assign(w(p + "embeddings.class_embedding").reshape(1, 1, -1))
    w.set(model.position_embedding, p + "embeddings.position_embedding.weight")
    kernel = w(p + "embeddings.patch_embedding.weight").transpose(2, 3, 1, 0)  # PyTorch's (out, in, kh, kw)
    model.patch_embedding.projection.set_weights([kernel])
    set_layer_norm(model.pre_norm, w(p + "pre_layrnorm.weight"), w(p + "pre_layrnorm.bias"))
    _read_blocks(model.blocks, w, p)
    set_layer_norm(model.final_norm, w(p + "post_layernorm.weight"), w(p + "post_layernorm.bias"))


def _read_text(model: CLIPTextEncoder, w: WeightReader, p: str) -> None:
    w.set(model.token_embedding, p + "embeddings.token_embedding.weight")
    w.set(model.position_embedding, p + "embeddings.position_embedding.weight")
    _read_blocks(model.blocks, w, p)
    set_layer_norm(model.final_norm, w(p + "final_layer_norm.weight"), w(p + "final_layer_norm.bias"))


def _read_blocks(blocks: list, w: WeightReader, p: str) -> None:
    for i, block in enumerate(blocks):
        b = f"{p}encoder.layers.{i}."
        set_layer_norm(block.self_attention_norm, w(b + "layer_norm1.weight"), w(b + "layer_norm1.bias"))
        for dense, name in attention_modules(block.self_attention):
            w.linear(b + "self_attn." + name.replace("o_proj", "out_proj"), dense)
        set_layer_norm(block.feed_forward_norm, w(b + "layer_norm2.weight"), w(b + "layer_norm2.bias"))
        w.linear(b + "mlp.fc1", block.feed_forward.intermediate_dense)
        w.linear(b + "mlp.fc2", block.feed_forward.output_dense)


def is_clip_vision(model: ViT) -> bool:
    """Whether `save_huggingface` writes `model` as CLIP's vision tower: a ViT with a norm before its blocks."""
    return model.norm_before_blocks


def export_clip_vision(model: ViT, w: WeightWriter, p: str = "") -> dict:
    """`model` as transformers' `CLIPVisionModel` (under `p`, a `CLIPModel`'s tower): the converter's inverse."""
    _check_clip_layout(model)
    w[p + "embeddings.class_embedding"] = keras.ops.convert_to_numpy(model.class_token).reshape(-1)
    kernel = keras.ops.convert_to_numpy(model.patch_embedding.projection.kernel)
    w[p + "embeddings.patch_embedding.weight"] = kernel.transpose(3, 2, 0, 1)
    w[p + "embeddings.position_embedding.weight"] = model.position_embedding.embeddings
    w.layer_norm(p + "pre_layrnorm", model.pre_norm)
    _write_blocks(model.blocks, w, p)
    w.layer_norm(p + "post_layernorm", model.final_norm)
    return dict(
        model_type="clip_vision_model",
        architectures=["CLIPVisionModel"],
        image_size=model.image_size,
        patch_size=model.patch_size,
        num_channels=model.num_channels,
        **_tower_config(model),
    )


@exporter(CLIP)
def export_clip(model: CLIP, w: WeightWriter) -> dict:
    """`model` as transformers' `CLIPModel`, or of one tower `CLIPVisionModelWithProjection` /
    `CLIPTextModelWithProjection`."""
    text, vision = model.text_encoder, model.vision_encoder
    if text is not None and not isinstance(text, CLIPTextEncoder):
        raise InputError(f"CLIPModel's text tower is a CLIPTextEncoder; received a {type(text).__name__}.",
                         "model", caller="save_huggingface")  # fmt: skip
    config = {"projection_dim": model.projection_dim}
    if vision is not None:
        vision_config = export_clip_vision(vision, w, "vision_model.")
        w.linear("visual_projection", model.visual_projection)
        if text is None:
            return dict(vision_config, architectures=["CLIPVisionModelWithProjection"], **config)
        config["vision_config"] = {k: v for k, v in vision_config.items() if k not in ("model_type", "architectures")}
    text_config = export_clip_text(text, w, "text_model.")
    w.linear("text_projection", model.text_projection)
    if vision is None:
        return dict(text_config, architectures=["CLIPTextModelWithProjection"], **config)
    w["logit_scale"] = model.logit_scale
    config["text_config"] = {k: v for k, v in text_config.items() if k not in ("model_type", "architectures")}
    return dict(model_type="clip", architectures=["CLIPModel"], logit_scale_init_value=model.logit_scale_init,
                **config)  # fmt: skip


@exporter(CLIPTextEncoder)
def export_clip_text(text: CLIPTextEncoder, w: WeightWriter, p: str = "") -> dict:
    """`text` as transformers' `CLIPTextModel` (under `p`, a `CLIPModel`'s tower): the converter's inverse."""
    if not text.causal or text.pooling == "last_token":
        raise InputError("CLIPTextModel is causal and pooled at its end token; received causal="
                         f"{text.causal}, pooling={text.pooling!r} (SigLIP's: save the SigLIP).", "model",
                         caller="save_huggingface")  # fmt: skip
    w[p + "embeddings.token_embedding.weight"] = text.token_embedding.embeddings
    w[p + "embeddings.position_embedding.weight"] = text.position_embedding.embeddings
    _write_blocks(text.blocks, w, p)
    w.layer_norm(p + "final_layer_norm", text.final_norm)
    end = 2 if text.pooling == "largest_id" else text.end_token_id
    return dict(model_type="clip_text_model", architectures=["CLIPTextModel"], vocab_size=text.vocabulary_size,
                max_position_embeddings=text.max_length, eos_token_id=end, **_tower_config(text))  # fmt: skip


def _tower_config(tower) -> dict:
    return dict(
        hidden_size=tower.hidden_dim,
        intermediate_size=tower.intermediate_dim,
        num_hidden_layers=tower.num_layers,
        num_attention_heads=tower.num_heads,
        hidden_act=hugging_face_activation("CLIP", tower.activation),
        layer_norm_eps=tower.layer_norm_epsilon,
        attention_dropout=tower.attention_dropout,
    )


def _write_blocks(blocks: list, w: WeightWriter, p: str) -> None:
    for i, block in enumerate(blocks):
        b = f"{p}encoder.layers.{i}."
        w.layer_norm(b + "layer_norm1", block.self_attention_norm)
        for dense, name in attention_modules(block.self_attention):
            w.linear(b + "self_attn." + name.replace("o_proj", "out_proj"), dense)
        w.layer_norm(b + "layer_norm2", block.feed_forward_norm)
        w.linear(b + "mlp.fc1", block.feed_forward.intermediate_dense)
        w.linear(b + "mlp.fc2", block.feed_forward.output_dense)


def _check_clip_layout(model: ViT) -> None:
    """Refuses, naming the argument, a ViT with a norm before its blocks that `CLIPVisionModel` cannot hold."""
    expected = dict(include_top=False, positions="learned", patch_bias=False, distillation_token=False,
                    num_register_tokens=0, mask_token=False, layer_scale_init=None, gated_feed_forward=False,
                    dropout=0.0)  # fmt: skip
    for name, value in expected.items():
        if getattr(model, name) != value:
            raise InputError(f"CLIPVisionModel (a ViT with norm_before_blocks=True) has {name}={value!r}; received "
                             f"{name}={getattr(model, name)!r}.", name, caller="save_huggingface")  # fmt: skip
