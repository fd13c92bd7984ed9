"""CLIP's vision tower (`CLIPVisionModel`) <-> `keras_tfm.ViT`.

CLIP's tower is the one ViT with a patch embedding without bias, a LayerNorm before the blocks (`pre_layrnorm`)
and `quick_gelu`. Its `last_hidden_state` is the blocks' output before the final norm (`model.hidden_states(images,
[num_layers])`); its `pooler_output` is the normalized class token, `model.features(images)[:, 0]`.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_tfm.convert.dinov2 import attention_modules
from keras_tfm.convert.registry import converter
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    hugging_face_activation,
    keras_activation,
    no_classifier,
    set_layer_norm,
)
from keras_tfm.errors import InputError
from keras_tfm.models.vit import ViT


@converter("clip_vision_model")
def convert_clip_vision(config: dict, w: WeightReader, num_classes: int | None = None) -> ViT:
    no_classifier("CLIPVisionModel", num_classes)
    model = ViT(
        image_size=config["image_size"],
        patch_size=config["patch_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        hidden_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        num_channels=config.get("num_channels", 3),
        include_top=False,
        attention_dropout=config.get("attention_dropout", 0.0),
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-5),
        activation=keras_activation("CLIP", config, "hidden_act", "quick_gelu"),
        patch_bias=False,
        norm_before_blocks=True,
    )
    model.build()
    w.check_shape("embeddings.class_embedding", np.shape(w("embeddings.class_embedding")), (model.hidden_dim,))
    model.class_token.assign(w("embeddings.class_embedding").reshape(1, 1, -1))
    w.set(model.position_embedding, "embeddings.position_embedding.weight")
    kernel = w("embeddings.patch_embedding.weight").transpose(2, 3, 1, 0)  # PyTorch's (out, in, kh, kw)
    model.patch_embedding.projection.set_weights([kernel])
    set_layer_norm(model.pre_norm, w("pre_layrnorm.weight"), w("pre_layrnorm.bias"))
    for i, block in enumerate(model.blocks):
        p = f"encoder.layers.{i}."
        set_layer_norm(block.self_attention_norm, w(p + "layer_norm1.weight"), w(p + "layer_norm1.bias"))
        for dense, name in attention_modules(block.self_attention):
            w.linear(p + "self_attn." + name.replace("o_proj", "out_proj"), dense)
        set_layer_norm(block.feed_forward_norm, w(p + "layer_norm2.weight"), w(p + "layer_norm2.bias"))
        w.linear(p + "mlp.fc1", block.feed_forward.intermediate_dense)
        w.linear(p + "mlp.fc2", block.feed_forward.output_dense)
    set_layer_norm(model.final_norm, w("post_layernorm.weight"), w("post_layernorm.bias"))
    w.check_all_used("from_huggingface", "CLIPVisionModel", ignore=lambda name: name.endswith("position_ids"))
    return model


def is_clip_vision(model: ViT) -> bool:
    """Whether `save_huggingface` writes `model` as CLIP's vision tower: a ViT with a norm before its blocks."""
    return model.norm_before_blocks


def export_clip_vision(model: ViT, w: WeightWriter) -> dict:
    """`model` as transformers' `CLIPVisionModel`: the converter's inverse."""
    _check_clip_layout(model)
    w["embeddings.class_embedding"] = keras.ops.convert_to_numpy(model.class_token).reshape(-1)
    kernel = keras.ops.convert_to_numpy(model.patch_embedding.projection.kernel)
    w["embeddings.patch_embedding.weight"] = kernel.transpose(3, 2, 0, 1)
    w["embeddings.position_embedding.weight"] = model.position_embedding.embeddings
    w.layer_norm("pre_layrnorm", model.pre_norm)
    for i, block in enumerate(model.blocks):
        p = f"encoder.layers.{i}."
        w.layer_norm(p + "layer_norm1", block.self_attention_norm)
        for dense, name in attention_modules(block.self_attention):
            w.linear(p + "self_attn." + name.replace("o_proj", "out_proj"), dense)
        w.layer_norm(p + "layer_norm2", block.feed_forward_norm)
        w.linear(p + "mlp.fc1", block.feed_forward.intermediate_dense)
        w.linear(p + "mlp.fc2", block.feed_forward.output_dense)
    w.layer_norm("post_layernorm", model.final_norm)
    return dict(
        model_type="clip_vision_model",
        architectures=["CLIPVisionModel"],
        image_size=model.image_size,
        patch_size=model.patch_size,
        num_channels=model.num_channels,
        hidden_size=model.hidden_dim,
        intermediate_size=model.intermediate_dim,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        hidden_act=hugging_face_activation("CLIP", model.activation),
        layer_norm_eps=model.layer_norm_epsilon,
        attention_dropout=model.attention_dropout,
    )


def _check_clip_layout(model: ViT) -> None:
    """Refuses, naming the argument, a ViT with a norm before its blocks that `CLIPVisionModel` cannot hold."""
    expected = dict(include_top=False, positions="learned", patch_bias=False, distillation_token=False,
                    num_register_tokens=0, mask_token=False, layer_scale_init=None, gated_feed_forward=False,
                    dropout=0.0)  # fmt: skip
    for name, value in expected.items():
        if getattr(model, name) != value:
            raise InputError(f"CLIPVisionModel (a ViT with norm_before_blocks=True) has {name}={value!r}; received "
                             f"{name}={getattr(model, name)!r}.", name, caller="save_huggingface")  # fmt: skip
