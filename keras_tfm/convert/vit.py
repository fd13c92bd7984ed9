"""ViT (`ViTModel`, `ViTForImageClassification`) -> `keras_tfm.ViT`.

transformers 5 names the weights `layers.{i}.attention.q_proj`, `mlp.fc1`, ...; checkpoints saved by
earlier versions use `encoder.layer.{i}.attention.attention.query`, `intermediate.dense`, ...
Both are read. PyTorch `Linear` kernels are (out, in) and are transposed; the patch convolution goes
from (out, in, kh, kw) to Keras' (kh, kw, in, out).
"""

from __future__ import annotations

import re

from keras_tfm.convert.huggingface import WeightReader, converter, set_dense, set_layer_norm
from keras_tfm.models.vit import ViT

_OLD_NAMES = [
    (r"encoder\.layer\.(\d+)\.attention\.attention\.query\.", r"layers.\1.attention.q_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.attention\.key\.", r"layers.\1.attention.k_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.attention\.value\.", r"layers.\1.attention.v_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attention.o_proj."),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.mlp.fc1."),
    (r"encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.mlp.fc2."),
    (r"encoder\.layer\.(\d+)\.", r"layers.\1."),
]
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_approximate", "gelu_pytorch_tanh": "gelu_approximate", "relu": "relu"}


def _rename(name: str) -> str:
    for pattern, replacement in _OLD_NAMES:
        name = re.sub(pattern, replacement, name)
    return name


@converter("vit")
def convert_vit(config: dict, weights: dict) -> ViT:
    weights = {_rename(k): v for k, v in weights.items()}
    include_top = "classifier.weight" in weights
    if config.get("hidden_act", "gelu") not in _ACTIVATIONS:
        raise ValueError(f"from_huggingface: ViT activation {config['hidden_act']!r} is not supported.")
    image_size, patch_size = config["image_size"], config["patch_size"]
    model = ViT(
        image_size=image_size if isinstance(image_size, int) else image_size[0],
        patch_size=patch_size if isinstance(patch_size, int) else patch_size[0],
        num_classes=weights["classifier.weight"].shape[0] if include_top else 1,
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        hidden_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        num_channels=config.get("num_channels", 3),
        include_top=include_top,
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
        activation=_ACTIVATIONS[config.get("hidden_act", "gelu")],
    )
    model.build()
    w = WeightReader(weights, prefixes=("vit.",))
    model.class_token.assign(w("embeddings.cls_token"))
    model.position_embedding.set_weights([w("embeddings.position_embeddings")[0]])
    model.patch_embedding.projection.set_weights([
        w("embeddings.patch_embeddings.projection.weight").transpose(2, 3, 1, 0),
        w("embeddings.patch_embeddings.projection.bias"),
    ])
    for i, block in enumerate(model.blocks):
        p = f"layers.{i}."
        attention = block.self_attention
        set_layer_norm(block.self_attention_norm, w(p + "layernorm_before.weight"), w(p + "layernorm_before.bias"))
        for dense, name in ((attention.query_dense, "q_proj"), (attention.key_dense, "k_proj"),
                            (attention.value_dense, "v_proj"), (attention.output_dense, "o_proj")):
            set_dense(dense, w(p + f"attention.{name}.weight").T, w(p + f"attention.{name}.bias"))
        set_layer_norm(block.feed_forward_norm, w(p + "layernorm_after.weight"), w(p + "layernorm_after.bias"))
        set_dense(block.feed_forward.intermediate_dense, w(p + "mlp.fc1.weight").T, w(p + "mlp.fc1.bias"))
        set_dense(block.feed_forward.output_dense, w(p + "mlp.fc2.weight").T, w(p + "mlp.fc2.bias"))
    set_layer_norm(model.final_norm, w("layernorm.weight"), w("layernorm.bias"))
    if include_top:
        set_dense(model.head, w("classifier.weight").T, w("classifier.bias"))
    leftover = w.unused(ignore=lambda name: name.startswith(("pooler.", "vit.pooler.")))
    if leftover:
        raise ValueError(f"from_huggingface: ViT weights not converted: {leftover[:5]}")
    return model
