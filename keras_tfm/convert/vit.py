"""ViT (`ViTModel`, `ViTForImageClassification`) <-> `keras_tfm.ViT`.

transformers 5 names the weights `layers.{i}.attention.q_proj`, `mlp.fc1`, ...; checkpoints saved by
earlier versions use `encoder.layer.{i}.attention.attention.query`, `intermediate.dense`, ...
Both are read. `save_huggingface` writes the earlier names, which transformers 5 renames as it
loads them (as it does for the published checkpoints): both versions load the files. PyTorch
`Linear` kernels are (out, in) and are transposed; the patch convolution goes
from (out, in, kh, kw) to Keras' (kh, kw, in, out).
"""

from __future__ import annotations

import os

import keras
import numpy as np

from keras_tfm.convert.clip import export_clip_vision, is_clip_vision
from keras_tfm.convert.dinov2 import (
    attention_modules,
    export_dinov2,
    is_dinov2,
    read_patch_embedding,
    write_patch_embedding,
)
from keras_tfm.convert.files import checkpoint_directory, read_json
from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.siglip import export_siglip_vision, is_siglip_vision
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    class_names_of,
    hugging_face_activation,
    keras_activation,
    renamer,
    require_options,
)
from keras_tfm.errors import CheckpointError, InputError
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

rename_earlier_names = renamer(_OLD_NAMES)


@converter("vit", "deit", prefixes=("vit.", "deit."), rename=rename_earlier_names)
def convert_vit(config: dict, w: WeightReader, num_classes: int | None = None) -> ViT:
    """ViT, and DeiT: a ViT with a distillation token, classified from the class token (`classifier`) or by
    two heads averaged (`cls_classifier` and `distillation_classifier`: `...WithTeacher`)."""
    require_options("ViT", config, qkv_bias=True)
    deit, distilled = config["model_type"] == "deit", "cls_classifier.weight" in w.weights
    head_name = "cls_classifier" if distilled else "classifier"
    checkpoint_head = f"{head_name}.weight" in w.weights and num_classes is None
    include_top = checkpoint_head or num_classes is not None
    if checkpoint_head:
        num_classes = w.weights[f"{head_name}.weight"].shape[0]
    image_size, patch_size = config["image_size"], config["patch_size"]
    for field, value in (("image_size", image_size), ("patch_size", patch_size)):
        if not isinstance(value, int) and len(set(value)) != 1:
            raise CheckpointError(
                f"ViT checkpoints with a non-square {field}={value!r} are not supported.", caller="from_huggingface"
            )
    model = ViT(
        image_size=image_size if isinstance(image_size, int) else image_size[0],
        patch_size=patch_size if isinstance(patch_size, int) else patch_size[0],
        num_classes=num_classes or 1,
        include_top=include_top,
        pooling="distilled" if distilled and checkpoint_head else "token",
        **vit_arguments(config, "ViT"),
        class_names=class_names_of(config, num_classes) if checkpoint_head else None,
        distillation_token=deit,
    )
    model.build()
    if deit:
        w.set_variable(model.distillation_weight, "embeddings.distillation_token")
    read_encoder(model, w)
    if checkpoint_head:
        w.linear(head_name, model.head)
        if distilled:
            w.linear("distillation_classifier", model.distillation_head)
    heads = ("classifier.", "cls_classifier.", "distillation_classifier.")
    ignored = ("pooler.", "vit.pooler.", "deit.pooler.") + (() if checkpoint_head else heads)  # a new head: fresh
    w.check_all_used("from_huggingface", "ViT", ignore=lambda name: name.startswith(ignored))
    return model


@exporter(ViT)
def export_vit(model: ViT, w: WeightWriter, image_preprocessing: tuple | None = None) -> dict:
    if is_siglip_vision(model) and image_preprocessing is None:
        return export_siglip_vision(model, w)
    if is_dinov2(model) and image_preprocessing is None:
        return export_dinov2(model, w)
    if is_clip_vision(model) and image_preprocessing is None:
        return export_clip_vision(model, w)
    _check_plain_vit(model)
    deit = model.distillation_token
    image_size = model.image_size
    if image_preprocessing is not None:
        w.files["preprocessor_config.json"], image_size = image_processor_config(
            *image_preprocessing, num_channels=model.num_channels
        )
        if image_size % model.patch_size:
            raise InputError(
                f"image_preprocessing gives the model {image_size}x{image_size} images, "
                f"which its {model.patch_size}-pixel patches do not divide.",
                caller="save_huggingface",
            )
    p = ("deit." if deit else "vit.") if model.include_top else ""  # ...ForImageClassification's names, or ...Model's
    w[p + "embeddings.cls_token"] = model.class_token
    if deit:
        w[p + "embeddings.distillation_token"] = model.distillation_weight
    grid = image_size // model.patch_size  # a model fine-tuned at another size: the table it used there
    table = model.position_embedding.embeddings if grid == model.grid_size else model.position_table(grid, grid)
    w[p + "embeddings.position_embeddings"] = table[None]
    write_patch_embedding(model, w, p)
    write_blocks(model.blocks, w, p + "encoder.layer.")
    w.layer_norm(p + "layernorm", model.final_norm)
    config = dict(model_type="deit" if deit else "vit", **vit_config(model, image_size))
    family = "DeiT" if deit else "ViT"
    if not model.include_top:
        return dict(config, architectures=[f"{family}Model"])
    if model.pooling == "distilled":
        w.linear("cls_classifier", model.head)
        w.linear("distillation_classifier", model.distillation_head)
        return dict(config, architectures=["DeiTForImageClassificationWithTeacher"], num_labels=model.num_classes)
    w.linear("classifier", model.head)
    return dict(config, architectures=[f"{family}ForImageClassification"], num_labels=model.num_classes)


def vit_arguments(config: dict, family: str) -> dict:
    """The `ViT` arguments of the fields of transformers' `ViTConfig` (and of the configs built on it); `vit_config`'s
    inverse."""
    return dict(
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        hidden_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        num_channels=config.get("num_channels", 3),
        dropout=config.get("hidden_dropout_prob", 0.0),
        attention_dropout=config.get("attention_probs_dropout_prob", 0.0),
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
        activation=keras_activation(family, config, "hidden_act", "gelu"),
    )


def read_encoder(model: ViT, w: WeightReader) -> None:
    """A ViT's embeddings, blocks and final norm under transformers 5's names (the ViT's and ViTMAE's)."""
    w.set_variable(model.class_token, "embeddings.cls_token")
    model.position_embedding.set_weights([w("embeddings.position_embeddings")[0]])
    read_patch_embedding(model, w)
    read_blocks(model.blocks, w, "layers.")
    w.layer_norm("layernorm", model.final_norm)


def vit_config(model: ViT, image_size: int) -> dict:
    """The fields of transformers' `ViTConfig` (and of the configs built on it) that `model` sets."""
    return dict(
        image_size=image_size,
        patch_size=model.patch_size,
        num_channels=model.num_channels,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        hidden_size=model.hidden_dim,
        intermediate_size=model.intermediate_dim,
        hidden_dropout_prob=model.dropout,
        attention_probs_dropout_prob=model.attention_dropout,
        layer_norm_eps=model.layer_norm_epsilon,
        hidden_act=hugging_face_activation("ViT", model.activation),
        qkv_bias=True,
    )


def read_blocks(blocks: list, w: WeightReader, p: str) -> None:
    """ViT blocks under transformers 5's names, `{p}{i}.attention.q_proj`, ... (earlier names renamed to them)."""
    for i, block in enumerate(blocks):
        b = f"{p}{i}."
        w.layer_norm(b + "layernorm_before", block.self_attention_norm)
        for dense, name in attention_modules(block.self_attention):
            w.linear(b + "attention." + name, dense)
        w.layer_norm(b + "layernorm_after", block.feed_forward_norm)
        w.linear(b + "mlp.fc1", block.feed_forward.intermediate_dense)
        w.linear(b + "mlp.fc2", block.feed_forward.output_dense)


def write_blocks(blocks: list, w: WeightWriter, p: str) -> None:
    """ViT blocks under the published names, `{p}{i}.attention.attention.query`, ..., which every transformers
    version reads."""
    for i, block in enumerate(blocks):
        b = f"{p}{i}."
        attention = block.self_attention
        w.layer_norm(b + "layernorm_before", block.self_attention_norm)
        for dense, name in (
            (attention.query_dense, "attention.attention.query"),
            (attention.key_dense, "attention.attention.key"),
            (attention.value_dense, "attention.attention.value"),
            (attention.output_dense, "attention.output.dense"),
        ):
            w.linear(b + name, dense)
        w.layer_norm(b + "layernorm_after", block.feed_forward_norm)
        w.linear(b + "intermediate.dense", block.feed_forward.intermediate_dense)
        w.linear(b + "output.dense", block.feed_forward.output_dense)


def _check_plain_vit(model: ViT) -> None:
    """Refuses a ViT that transformers' `ViT*` and `DeiT*` classes cannot hold, naming the family that can."""
    if model.norm_before_blocks or not model.patch_bias:
        raise InputError("a ViT with a norm before its blocks or a patch embedding without bias is written as CLIP's "
                         "vision tower (both, with `model.image_processor` rather than image_preprocessing).",
                         caller="save_huggingface")  # fmt: skip
    if model.layer_scale_init is not None or model.num_register_tokens or model.gated_feed_forward:
        raise InputError("a ViT with layer scale, registers or a SwiGLU MLP is written as DINOv2 (without a "
                         "distillation token, and with `model.image_processor` rather than image_preprocessing).",
                         caller="save_huggingface")  # fmt: skip
    deit = model.distillation_token
    poolings = ("token", "distilled") if deit else ("token",)
    if model.positions != "learned" or (model.include_top and model.pooling not in poolings):
        also = " (DeiT's also from both heads, pooling='distilled')" if deit else ""
        raise InputError(
            f"Hugging Face ViTs have learned positions and classify from the class token{also}; received "
            f"positions={model.positions!r}, pooling={model.pooling!r}.",
            caller="save_huggingface",
        )


def image_preprocessing(directory: str) -> tuple[int, list]:
    """How the checkpoint's Hugging Face image processor (`preprocessor_config.json`: `ViTImageProcessor`,
    or `DeiTImageProcessor`, which also center-crops) prepares raw 0-255 pixels, as Keras layers: returns
    `(side, layers)`, where `side` is the square size it resizes images to and `layers` do the rest
    in its order: center crop (where it crops), rescale, normalise. Apply them after resizing to
    `side`; to fine-tune at another size, resize to that size and skip the crop. Without a
    `preprocessor_config.json`, the processor's defaults: 224, rescale by 1/255, mean and std 0.5.
    `directory`: the checkpoint's directory, or its Hub model id (see `checkpoint_directory`).

    Example:
    >>> import transformers
    >>> config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
    ...                                 num_attention_heads=2, intermediate_size=64)
    >>> transformers.ViTForImageClassification(config).save_pretrained("tiny-vit")  # or a Hub id
    >>> written = transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained("tiny-vit")
    >>> side, layers = keras_tfm.convert.image_preprocessing("tiny-vit")
    >>> side
    32
    >>> model = keras.Sequential([keras.layers.Resizing(side, side), *layers,
    ...                           keras_tfm.from_huggingface("tiny-vit", num_classes=10)])
    """
    path = os.path.join(checkpoint_directory(directory, "image_preprocessing"), "preprocessor_config.json")
    processor = read_json(path, "image_preprocessing") if os.path.isfile(path) else {}

    def side_of(key: str, default: int) -> int:
        value = processor.get(key, default)
        if isinstance(value, dict):
            value = value.get("height", value.get("shortest_edge"))
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(
                f"{path!r}: expected an image size in {key!r}; found {processor.get(key)!r}.",
                caller="image_preprocessing",
            )
        return value

    size = side_of("size", 224)
    layers = []
    if processor.get("do_center_crop"):
        crop = side_of("crop_size", size)
        if crop > size:
            raise InputError(
                f"{path!r}: 'crop_size' {crop} is larger than the resized images ('size' {size}).",
                caller="image_preprocessing",
            )
        layers.append(keras.layers.CenterCrop(crop, crop, name="center_crop"))
    if processor.get("do_rescale", True):
        layers.append(keras.layers.Rescaling(processor.get("rescale_factor", 1 / 255), name="rescaling"))
    if processor.get("do_normalize", True):
        mean = np.asarray(processor.get("image_mean", [0.5, 0.5, 0.5]), "float32")
        std = np.asarray(processor.get("image_std", [0.5, 0.5, 0.5]), "float32")
        layers.append(keras.layers.Normalization(mean=mean, variance=std**2, name="normalization"))
    return size, layers


def image_processor_config(side: int, layers: list, num_channels: int = 3) -> tuple[dict, int]:
    """transformers' image processor (`preprocessor_config.json`) for raw 0-255 pixels resized to `side`
    and then given to `layers`: `image_preprocessing`'s inverse, which `save_huggingface(model, directory,
    image_preprocessing=(side, layers))` writes beside a ViT. `layers` are, in this order and each
    optional, a square `CenterCrop` (then a `DeiTImageProcessor`, else a `ViTImageProcessor`), a
    `Rescaling` (its offset becomes part of the normalisation) and a per-channel `Normalization`.
    Returns the config and the side of the images the model then sees (the crop's, or `side`).
    Images are resized bilinearly, as `keras.layers.Resizing`; grayscale images become RGB for a
    3-channel model, as the ViT recipe makes them for a checkpoint."""

    def refuse(what: str):
        raise InputError(f"image_preprocessing: {what}", caller="save_huggingface")

    if not isinstance(side, int) or isinstance(side, bool) or side < 1:
        refuse(f"expected a positive image side; received {side!r}.")
    config = {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": side, "width": side},
        "resample": 2,
        "do_convert_rgb": num_channels == 3,
        "do_center_crop": False,
        "do_rescale": False,
        "rescale_factor": 1 / 255,
        "do_normalize": False,
        "image_mean": [0.0] * num_channels,
        "image_std": [1.0] * num_channels,
    }
    model_side, offset, steps = side, 0.0, (keras.layers.CenterCrop, keras.layers.Rescaling, keras.layers.Normalization)
    done = -1

    for layer in layers:
        step = next((i for i, kind in enumerate(steps) if isinstance(layer, kind)), None)
        if step is None or step <= done:
            refuse(
                f"expected a CenterCrop, a Rescaling and a Normalization, each at most once and in that order; "
                f"received {[type(layer).__name__ for layer in layers]}."
            )
        done = step
        if step == 0:
            if layer.height != layer.width or layer.height > side:
                refuse(
                    f"the center crop must be square and at most {side} pixels; received {layer.height}x{layer.width}."
                )
            model_side = layer.height
            config.update(
                image_processor_type="DeiTImageProcessor",
                do_center_crop=True,
                crop_size={"height": layer.height, "width": layer.width},
            )
        elif step == 1:
            scale, offset = (
                np.asarray(keras.ops.convert_to_numpy(value), "float64") for value in (layer.scale, layer.offset)
            )
            if scale.size != 1 or offset.size != 1:
                refuse(
                    f"a Rescaling with one scale and one offset; received scale={layer.scale}, offset={layer.offset}."
                )
            config.update(do_rescale=True, rescale_factor=float(scale.reshape(())))
            offset = float(offset.reshape(()))
            if offset:  # x * scale + offset = (x * scale - (-offset)) / 1
                config.update(do_normalize=True, image_mean=[-offset] * num_channels)
        else:
            config.update(_normalization(layer, offset, num_channels, refuse))
    return config, model_side


def _normalization(layer, offset: float, num_channels: int, refuse) -> dict:
    """The image processor's mean and std of a Normalization after a Rescaling with `offset`."""
    if layer.invert or tuple(layer.axis) not in ((-1,), (3,)):
        refuse("a Normalization over the channels (axis -1), not inverted.")
    mean = layer.input_mean if layer.input_mean is not None else getattr(layer, "mean", None)
    variance = layer.input_variance if layer.input_variance is not None else getattr(layer, "variance", None)
    if mean is None or variance is None:
        refuse("the Normalization has no mean and variance yet (adapt it first).")

    def per_channel(values, name: str) -> list:
        values = np.asarray(keras.ops.convert_to_numpy(values), "float64").reshape(-1)
        if values.size == 1:
            values = np.repeat(values, num_channels)
        if values.size != num_channels:
            refuse(f"{name} has {values.size} values; the model takes {num_channels}-channel images.")
        return values

    # ((x * scale + offset) - mean) / std = (x * scale - (mean - offset)) / std
    return dict(
        do_normalize=True,
        image_mean=[float(m) - offset for m in per_channel(mean, "the mean")],
        image_std=[float(np.sqrt(v)) for v in per_channel(variance, "the variance")],
    )
