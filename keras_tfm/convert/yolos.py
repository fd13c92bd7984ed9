"""YOLOS (`YolosForObjectDetection`, `YolosModel`) <-> `keras_tfm.YOLOS`.

The encoder's blocks are ViT blocks under ViT's names; the embeddings add the detection tokens, and the
mid-position table is `vit.encoder.mid_position_embeddings` as published (transformers 5 keeps it as
`vit.encoder.interpolation.mid_position_embeddings` in memory). The heads are two MLPs of three Linear layers.
A `YolosModel` checkpoint loads without the head (its pooler is not read).
"""

from __future__ import annotations

import keras

from keras_tfm.convert.dinov2 import read_patch_embedding, write_patch_embedding
from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.vit import _OLD_NAMES, read_blocks, vit_arguments, vit_config, write_blocks
from keras_tfm.convert.weights import WeightReader, WeightWriter, class_names_of, renamer, require_options
from keras_tfm.models.yolos import YOLOS

rename_yolos_names = renamer([*_OLD_NAMES, (r"encoder\.interpolation\.mid_position", r"encoder.mid_position")])
HEADS = (("class_labels_classifier", "class_mlp"), ("bbox_predictor", "box_mlp"))
# the loss settings' names in `YolosConfig`
LOSS_NAMES = dict(class_cost="class_cost", box_cost="bbox_cost", giou_cost="giou_cost",
                  no_object_weight="eos_coefficient", box_weight="bbox_loss_coefficient",
                  giou_weight="giou_loss_coefficient")  # fmt: skip


@converter("yolos", prefixes=("vit.",), rename=rename_yolos_names)
def convert_yolos(config: dict, w: WeightReader, num_classes: int | None = None) -> YOLOS:
    require_options("YOLOS", config, qkv_bias=True, auxiliary_loss=False)
    checkpoint_head = "class_labels_classifier.layers.2.weight" in w.weights
    include_top = checkpoint_head or num_classes is not None
    checkpoint_classes = w.weights["class_labels_classifier.layers.2.weight"].shape[0] - 1 if checkpoint_head else None
    num_classes = num_classes or checkpoint_classes
    own_head = checkpoint_classes is not None and num_classes == checkpoint_classes  # no other number asked
    image_size, patch_size = config.get("image_size", [512, 864]), config.get("patch_size", 16)
    model = YOLOS(
        image_shape=tuple(image_size) if isinstance(image_size, (list, tuple)) else (image_size, image_size),
        patch_size=patch_size if isinstance(patch_size, int) else patch_size[0],
        num_classes=num_classes or 1,
        num_detection_tokens=config.get("num_detection_tokens", 100),
        mid_position_embeddings=config.get("use_mid_position_embeddings", True),
        include_top=include_top,
        class_names=class_names_of(config, num_classes) if own_head else None,
        loss_settings=_loss_settings(config),
        **vit_arguments(config, "YOLOS"),
    )
    model.build()
    w.set_variable(model.class_token, "embeddings.cls_token")
    w.set_variable(model.detection_tokens, "embeddings.detection_tokens")
    model.position_table.assign(w("embeddings.position_embeddings")[0])
    if model.mid_position_table is not None:
        model.mid_position_table.assign(w("encoder.mid_position_embeddings")[:, 0])
    read_patch_embedding(model, w)
    read_blocks(model.blocks, w, "layers.")
    w.layer_norm("layernorm", model.final_norm)
    if own_head:
        for name, mlp in HEADS:
            for index, dense in enumerate(getattr(model.head, mlp)):
                w.linear(f"{name}.layers.{index}", dense)
    unread = ("pooler.", *(name for name, _ in HEADS), *(("encoder.mid_position",) if model.num_layers == 1 else ()))
    w.check_all_used("from_huggingface", "YOLOS", ignore=lambda name: name.removeprefix("vit.").startswith(unread))
    return model


def _loss_settings(config: dict) -> dict:
    return {ours: config[theirs] for ours, theirs in LOSS_NAMES.items() if theirs in config}


@exporter(YOLOS)
def export_yolos(model: YOLOS, w: WeightWriter) -> dict:
    """`model` as transformers' `YolosForObjectDetection` (or `YolosModel` without its head)."""
    p = "vit." if model.include_top else ""
    w[p + "embeddings.cls_token"] = model.class_token
    w[p + "embeddings.detection_tokens"] = model.detection_tokens
    w[p + "embeddings.position_embeddings"] = keras.ops.convert_to_numpy(model.position_table)[None]
    if model.mid_position_table is not None:
        w[p + "encoder.mid_position_embeddings"] = keras.ops.convert_to_numpy(model.mid_position_table)[:, None]
    write_patch_embedding(model, w, p)
    write_blocks(model.blocks, w, p + "encoder.layer.")
    w.layer_norm(p + "layernorm", model.final_norm)
    if model.include_top:
        for name, mlp in HEADS:
            for index, dense in enumerate(getattr(model.head, mlp)):
                w.linear(f"{name}.layers.{index}", dense)
    return dict(
        model_type="yolos",
        architectures=["YolosForObjectDetection" if model.include_top else "YolosModel"],
        **{**vit_config(model, list(model.image_shape)), "qkv_bias": True},
        num_detection_tokens=model.num_detection_tokens,
        use_mid_position_embeddings=model.mid_position_table is not None,
        **({"num_labels": model.num_classes} if model.include_top else {}),
        # transformers 5 types the costs and weights as integers, the no-object weight as a float
        **{
            LOSS_NAMES[name]: int(value) if float(value).is_integer() and name != "no_object_weight" else value
            for name, value in model.loss_settings.items()
        },
    )
