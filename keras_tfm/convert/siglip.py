"""SigLIP and SigLIP 2 at fixed resolution (`SiglipModel` <-> `keras_tfm.SigLIP`) and the image tower
(`SiglipVisionModel` <-> `keras_tfm.ViT`); SigLIP 2's own classes (`Siglip2Model`, `Siglip2VisionModel`) read at
one resolution per batch: a linear projection of flattened patches (the ViT's patch convolution, reshaped) and a
position table resized bilinearly with antialiasing (`position_interpolation="bilinear"`) to each image's grid.

SigLIP's tower is the one ViT without a class token (`use_class_token=False`), its tokens pooled by attention
(`pooling="attention"`: transformers' `head`, a probe with PyTorch's fused `in_proj` of queries, keys and values).
Its `last_hidden_state` is `model.features(images)`; its `pooler_output` is `model.pooled_features(images)`.
SigLIP 2's fixed-resolution checkpoints are `SiglipModel`s with Gemma's tokenizer.
"""

from __future__ import annotations

import math

import keras
import numpy as np

from keras_tfm.convert.clip import _read_blocks, _read_text, _tower_config, _write_blocks, text_tower, vision_tower
from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.weights import WeightReader, WeightWriter, no_classifier, set_layer_norm
from keras_tfm.errors import InputError
from keras_tfm.models.clip import CLIPTextEncoder
from keras_tfm.models.siglip import SigLIP
from keras_tfm.models.vit import ViT

_POSITION_IDS = lambda name: name.endswith("position_ids")  # noqa: E731  (buffers, not weights)


@converter("siglip_vision_model", prefixes=("vision_model.",))  # transformers 4 wrote the tower's names under it
def convert_siglip_vision(config: dict, w: WeightReader, num_classes: int | None = None) -> ViT:
    no_classifier("SiglipVisionModel", num_classes)
    return _image_tower(config, w, "SiglipVisionModel", siglip2=False)


@converter("siglip2_vision_model", prefixes=("vision_model.",))
def convert_siglip2_vision(config: dict, w: WeightReader, num_classes: int | None = None) -> ViT:
    no_classifier("Siglip2VisionModel", num_classes)
    return _image_tower(config, w, "Siglip2VisionModel", siglip2=True)


@converter("siglip")
def convert_siglip(config: dict, w: WeightReader, num_classes: int | None = None) -> SigLIP:
    no_classifier("SiglipModel", num_classes)
    return _both_towers(config, w, "SiglipModel", siglip2=False)


@converter("siglip2")
def convert_siglip2(config: dict, w: WeightReader, num_classes: int | None = None) -> SigLIP:
    no_classifier("Siglip2Model", num_classes)
    return _both_towers(config, w, "Siglip2Model", siglip2=True)


def _image_tower(config: dict, w: WeightReader, architecture: str, siglip2: bool) -> ViT:
    model = _vision_tower(_fixed_resolution(config) if siglip2 else config, siglip2)
    model.build()
    _read_vision(model, w, "", siglip2)
    w.check_all_used("from_huggingface", architecture, ignore=_POSITION_IDS)
    return model


def _both_towers(config: dict, w: WeightReader, architecture: str, siglip2: bool) -> SigLIP:
    vision_config, text_config = config.get("vision_config") or {}, config.get("text_config") or {}
    vision_config = _fixed_resolution(vision_config) if siglip2 else vision_config
    model = SigLIP(_vision_tower(vision_config, siglip2), _text_tower(text_config))
    model.build()
    _read_vision(model.vision_encoder, w, "vision_model.", siglip2)
    _read_text(model.text_encoder, w, "text_model.")
    _read_scores(model, w)
    w.check_all_used("from_huggingface", architecture, ignore=_POSITION_IDS)
    return model


def _fixed_resolution(config: dict) -> dict:
    """SigLIP 2's vision config with the square image size its position table was learned at."""
    side = math.isqrt(config.get("num_patches", 256))
    return {**config, "image_size": side * config.get("patch_size", 16)}


def _read_scores(model: SigLIP, w: WeightReader) -> None:
    w.linear("text_model.head", model.text_head)
    for variable, name in ((model.logit_scale, "logit_scale"), (model.logit_bias, "logit_bias")):
        w.check_shape(name, np.shape(w(name)), (1,))
        variable.assign(np.asarray(w(name), "float32").reshape(()))


@converter("siglip_text_model", "siglip2_text_model", prefixes=("text_model.",))  # transformers 4's names
def convert_siglip_text(config: dict, w: WeightReader, num_classes: int | None = None) -> SigLIP:
    """`SiglipTextModel` (the text tower and its head) as a `SigLIP` of the text tower alone."""
    no_classifier("SiglipTextModel", num_classes)
    model = SigLIP(None, _text_tower(config), embedding_dim=config.get("projection_size") or config.get("hidden_size"))
    model.build()
    _read_text(model.text_encoder, w, "")
    w.linear("head", model.text_head)
    w.check_all_used("from_huggingface", "SiglipTextModel", ignore=_POSITION_IDS)
    return model


SIGLIP_VISION = dict(image_size=224, patch_size=16, num_hidden_layers=12, num_attention_heads=12, hidden_size=768,
                     intermediate_size=3072, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)  # fmt: skip


def _vision_tower(config: dict, siglip2: bool = False) -> ViT:
    pooling = "attention" if config.get("vision_use_head", True) else "mean"
    interpolation = "bilinear" if siglip2 else "bicubic"
    return vision_tower("SigLIP", config, SIGLIP_VISION, pooling=pooling, use_class_token=False,
                        position_interpolation=interpolation)  # fmt: skip


SIGLIP_TEXT = dict(vocab_size=32000, max_position_embeddings=64, num_hidden_layers=12, num_attention_heads=12,
                   hidden_size=768, intermediate_size=3072, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)  # fmt: skip


def _text_tower(config: dict) -> CLIPTextEncoder:
    return text_tower("SigLIP", config, SIGLIP_TEXT, end_token_id=config.get("eos_token_id", 1),
                      pad_token_id=config.get("pad_token_id", 1), pooling="last_token", causal=False)  # fmt: skip


def _read_vision(model: ViT, w: WeightReader, p: str, siglip2: bool = False) -> None:
    names = (p + "embeddings.patch_embedding.weight", p + "embeddings.patch_embedding.bias")
    if siglip2:  # a Linear over each patch's pixels flattened as (row, column, channel)
        size, channels = model.patch_size, model.num_channels
        w.check_shape(names[0], np.shape(w(names[0])), (model.hidden_dim, size * size * channels))
        kernel = w(names[0]).reshape(model.hidden_dim, size, size, channels).transpose(1, 2, 3, 0)
    else:
        kernel = w(names[0]).transpose(2, 3, 1, 0)  # PyTorch's (out, in, kh, kw)
    w.assign(model.patch_embedding.projection, [kernel, w(names[1])], names)
    w.set(model.position_embedding, p + "embeddings.position_embedding.weight")
    _read_blocks(model.blocks, w, p)
    set_layer_norm(model.final_norm, w(p + "post_layernorm.weight"), w(p + "post_layernorm.bias"))
    if model.attention_pool is not None:
        _read_pooling(model.attention_pool, w, p + "head.")


def _read_pooling(pooling, w: WeightReader, p: str) -> None:
    """The MAP head: its probe, PyTorch's `MultiheadAttention` (queries, keys and values in one `in_proj`), MLP."""
    w.set_variable(pooling.probe, p + "probe")
    attention = pooling.attention
    kernels, biases = np.split(w(p + "attention.in_proj_weight"), 3), np.split(w(p + "attention.in_proj_bias"), 3)
    names = (p + "attention.in_proj_weight", p + "attention.in_proj_bias")
    for dense, kernel, bias in zip(
        (attention.query_dense, attention.key_dense, attention.value_dense), kernels, biases
    ):
        w.assign(dense, [kernel.T, bias], names, transposed=True)
    w.linear(p + "attention.out_proj", attention.output_dense)
    set_layer_norm(pooling.norm, w(p + "layernorm.weight"), w(p + "layernorm.bias"))
    w.linear(p + "mlp.fc1", pooling.mlp.intermediate_dense)
    w.linear(p + "mlp.fc2", pooling.mlp.output_dense)


def is_siglip_vision(model: ViT) -> bool:
    """Whether `save_huggingface` writes `model` as SigLIP's image tower: a ViT without a class token."""
    return not model.use_class_token


def export_siglip_vision(model: ViT, w: WeightWriter, p: str = "") -> dict:
    """`model` as transformers' `SiglipVisionModel` (under `p`, a `SiglipModel`'s tower): the converter's inverse."""
    _check_siglip_layout(model)
    kernel = keras.ops.convert_to_numpy(model.patch_embedding.projection.kernel)
    siglip2 = model.position_interpolation == "bilinear"
    kernel = kernel.transpose(3, 0, 1, 2).reshape(model.hidden_dim, -1) if siglip2 else kernel.transpose(3, 2, 0, 1)
    w[p + "embeddings.patch_embedding.weight"] = kernel
    w[p + "embeddings.patch_embedding.bias"] = model.patch_embedding.projection.bias
    w[p + "embeddings.position_embedding.weight"] = model.position_embedding.embeddings
    _write_blocks(model.blocks, w, p)
    w.layer_norm(p + "post_layernorm", model.final_norm)
    if model.attention_pool is not None:
        _write_pooling(model.attention_pool, w, p + "head.")
    config = dict(patch_size=model.patch_size, num_channels=model.num_channels,
                  vision_use_head=model.attention_pool is not None, **_siglip_config(model))  # fmt: skip
    if siglip2:
        return dict(config, model_type="siglip2_vision_model", architectures=["Siglip2VisionModel"],
                    num_patches=model.grid_size**2)  # fmt: skip
    return dict(
        config, model_type="siglip_vision_model", architectures=["SiglipVisionModel"], image_size=model.image_size
    )


def _write_pooling(pooling, w: WeightWriter, p: str) -> None:
    w[p + "probe"] = pooling.probe
    attention = pooling.attention
    projections = (attention.query_dense, attention.key_dense, attention.value_dense)
    w[p + "attention.in_proj_weight"] = np.concatenate([keras.ops.convert_to_numpy(d.kernel).T for d in projections])
    w[p + "attention.in_proj_bias"] = np.concatenate([keras.ops.convert_to_numpy(d.bias) for d in projections])
    w.linear(p + "attention.out_proj", attention.output_dense)
    w.layer_norm(p + "layernorm", pooling.norm)
    w.linear(p + "mlp.fc1", pooling.mlp.intermediate_dense)
    w.linear(p + "mlp.fc2", pooling.mlp.output_dense)


@exporter(SigLIP)
def export_siglip(model: SigLIP, w: WeightWriter) -> dict:
    """`model` as transformers' `SiglipModel`; of one tower, `SiglipVisionModel` or `SiglipTextModel`."""
    text, vision = model.text_encoder, model.vision_encoder
    if text is not None and (not isinstance(text, CLIPTextEncoder) or text.causal or text.pooling != "last_token"):
        raise InputError("SiglipModel's text tower is a CLIPTextEncoder with causal=False, pooling='last_token'; "
                         f"received {text!r:.80}.", "model", caller="save_huggingface")  # fmt: skip
    if text is None:
        return export_siglip_vision(vision, w)
    p = "" if vision is None else "text_model."
    w[p + "embeddings.token_embedding.weight"] = text.token_embedding.embeddings
    w[p + "embeddings.position_embedding.weight"] = text.position_embedding.embeddings
    _write_blocks(text.blocks, w, p)
    w.layer_norm(p + "final_layer_norm", text.final_norm)
    w.linear(p + "head", model.text_head)
    text_config = dict(vocab_size=text.vocabulary_size, max_position_embeddings=text.max_length,
                       eos_token_id=text.end_token_id, pad_token_id=text.pad_token_id,
                       projection_size=model.embedding_dim, **_siglip_config(text))  # fmt: skip
    if vision is None:
        return dict(text_config, model_type="siglip_text_model", architectures=["SiglipTextModel"])
    vision_config = {k: v for k, v in export_siglip_vision(vision, w, "vision_model.").items()
                     if k not in ("model_type", "architectures")}  # fmt: skip
    w["logit_scale"] = np.reshape(keras.ops.convert_to_numpy(model.logit_scale), (1,))
    w["logit_bias"] = np.reshape(keras.ops.convert_to_numpy(model.logit_bias), (1,))
    if model.vision_encoder.position_interpolation == "bilinear":
        return dict(model_type="siglip2", architectures=["Siglip2Model"], text_config=text_config,
                    vision_config=vision_config)  # fmt: skip
    return dict(model_type="siglip", architectures=["SiglipModel"], text_config=text_config,
                vision_config=vision_config)  # fmt: skip


def _siglip_config(tower) -> dict:
    config = _tower_config(tower)
    if tower.activation == "gelu_approximate":  # SigLIP's own name for the tanh GELU
        config["hidden_act"] = "gelu_pytorch_tanh"
    return config


def _check_siglip_layout(model: ViT) -> None:
    """Refuses, naming the argument, a ViT without a class token that `SiglipVisionModel` cannot hold."""
    expected = dict(include_top=False, positions="learned", patch_bias=True, norm_before_blocks=False, position_antialias=False,
                    distillation_token=False, num_register_tokens=0, mask_token=False, layer_scale_init=None,
                    gated_feed_forward=False, dropout=0.0)  # fmt: skip
    for name, value in expected.items():
        if getattr(model, name) != value:
            raise InputError(f"SiglipVisionModel (a ViT with use_class_token=False) has {name}={value!r}; received "
                             f"{name}={getattr(model, name)!r}.", name, caller="save_huggingface")  # fmt: skip
    if model.pooling not in ("attention", "mean"):
        raise InputError(f"SiglipVisionModel pools by attention, or not at all ('mean'); received pooling="
                         f"{model.pooling!r}.", "pooling", caller="save_huggingface")  # fmt: skip
