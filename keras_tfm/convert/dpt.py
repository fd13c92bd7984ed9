"""Depth Anything (`DepthAnythingForDepthEstimation`) and DPT (`DPTForDepthEstimation`,
`DPTForSemanticSegmentation`, with a ViT of their own) <-> `keras_tfm.DPT`.

Depth Anything's backbone is a `Dinov2Backbone` (DINOv2's weights under `backbone.`, read by the DINOv2 converter);
DPT's is a ViT under `dpt.`. The neck and heads are convolutions: PyTorch's (out, in, kh, kw) kernels become Keras'
(kh, kw, in, out), a transposed convolution's (in, out, kh, kw) Keras' (kh, kw, out, in), and 1x1 convolutions
Dense layers. A DPT segmentation checkpoint's auxiliary head (a training-only loss term) is not read.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from keras import ops

from keras_tfm.convert.dinov2 import convert_dinov2, export_dinov2, rename_dinov2, write_patch_embedding
from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.vit import read_encoder, rename_earlier_names, vit_arguments, vit_config, write_blocks
from keras_tfm.convert.weights import WeightReader, WeightWriter, class_names_of, require_options
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.layers.conv_segmentation_head import ConvSegmentationHead
from keras_tfm.layers.depth_head import DepthHead
from keras_tfm.layers.dpt_neck import DPTNeck
from keras_tfm.models.dpt import DPT
from keras_tfm.models.vit import ViT


def _rename(name: str) -> str:
    return rename_dinov2(name) if name.startswith("backbone.") else rename_earlier_names(name)


@converter("depth_anything", "dpt", rename=_rename)
def convert_dpt(config: dict, w: WeightReader, num_classes: int | None = None) -> DPT:
    depth_anything = config["model_type"] == "depth_anything"
    backbone, layers = _depth_anything_backbone(config, w) if depth_anything else _dpt_backbone(config, w)
    neck = DPTNeck(config.get("neck_hidden_sizes", [96, 192, 384, 768]), config.get("reassemble_factors",
                   [4, 2, 1, 0.5]), config.get("fusion_hidden_size", 256),
                   readout="ignore" if depth_anything else config.get("readout_type", "project"),
                   fusion_upsampling="next_map" if depth_anything else "double",
                   activation=config.get("hidden_act", "gelu"))  # fmt: skip
    segmenting = "head.head.1.running_mean" in w.weights
    if segmenting:
        count = w.weights["head.head.4.weight"].shape[0]
        head, names = (
            ConvSegmentationHead(count, config.get("semantic_classifier_dropout", 0.1)),
            class_names_of(config, count),
        )
    else:
        head, names = DepthHead(config.get("head_hidden_size", 32), config.get("depth_estimation_type", "relative"),
                                float(config.get("max_depth") or 1.0)), None  # fmt: skip
    if num_classes is not None:
        raise InputError("DPT and Depth Anything checkpoints keep their own head; num_classes is for classifiers.",
                         "num_classes", "from_huggingface")  # fmt: skip
    model = DPT(backbone, neck, head, layers, normalize_features=depth_anything,
                head_resolution="image" if depth_anything else "double", class_names=names)  # fmt: skip
    model.build()
    _read_neck(model.neck, w)
    if segmenting:
        _read_segmentation_head(model.head, w)
    else:
        for layer, name in zip(model.head.convolutions, _depth_head_names(depth_anything)):
            _read_convolution(layer, w, name)
    w.check_all_used("from_huggingface", config["model_type"], ignore=lambda name: name.startswith(
        ("auxiliary_head.", "dpt.pooler.")))  # fmt: skip
    return model


class _Part(Mapping):
    """The weights under `prefix`, named without it, each read only when looked up."""

    def __init__(self, weights: Mapping, prefix: str):
        self.weights, self.prefix = weights, prefix
        self.names = [name[len(prefix) :] for name in weights if name.startswith(prefix)]

    def __getitem__(self, name: str):
        return self.weights[self.prefix + name]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _depth_anything_backbone(config: dict, w: WeightReader) -> tuple[ViT, list]:
    require_options("Depth Anything", config, head_in_index=-1)
    backbone_config = config.part("backbone_config")
    if backbone_config.get("model_type") != "dinov2" or backbone_config.get("reshape_hidden_states", True):
        raise CheckpointError("Depth Anything checkpoints with a DINOv2 backbone of token sequences "
                              "(reshape_hidden_states false) are supported; received backbone_config with model_type "
                              f"{backbone_config.get('model_type')!r}.", caller="from_huggingface")  # fmt: skip
    part = WeightReader(_Part(w.weights, "backbone."), (), w.config, w.allow_nan)
    backbone = convert_dinov2(backbone_config, part)
    w.used.update("backbone." + name for name in part.used)
    if backbone.patch_size != config.get("patch_size", 14):
        raise CheckpointError(f"the head's patch_size {config.get('patch_size')} differs from the backbone's "
                              f"{backbone.patch_size}.", caller="from_huggingface")  # fmt: skip
    return backbone, list(backbone_config.get("out_indices") or [backbone.num_layers])


def _dpt_backbone(config: dict, w: WeightReader) -> tuple[ViT, list]:
    require_options("DPT", config, is_hybrid=False, backbone_config=None, use_batch_norm_in_fusion_residual=False,
                    add_projection=False, neck_ignore_stages=[], head_in_index=-1, qkv_bias=True)  # fmt: skip
    side = config.get("image_size", 384)
    backbone = ViT(image_size=side, patch_size=config.get("patch_size", 16), include_top=False,
                   position_interpolation="bilinear", **vit_arguments(config, "DPT"))  # fmt: skip
    backbone.build()
    part = WeightReader(_Part(w.weights, "dpt."), (), w.config, w.allow_nan)
    read_encoder(backbone, part)
    w.used.update("dpt." + name for name in part.used)
    return backbone, [index + 1 for index in config.get("backbone_out_indices", [2, 5, 8, 11])]


def _read_convolution(layer, w: WeightReader, name: str) -> None:
    """(out, in, kh, kw) -> (kh, kw, in, out); a transposed convolution's (in, out, kh, kw) -> (kh, kw, out, in)."""
    names = [name + ".weight"] + ([name + ".bias"] if layer.use_bias else [])
    w.assign(layer, [w(names[0]).transpose(2, 3, 1, 0), *(w(n) for n in names[1:])], names)


def _read_pointwise(dense, w: WeightReader, name: str) -> None:
    """A 1x1 convolution as a Dense layer."""
    names = [name + ".weight", name + ".bias"]
    w.assign(dense, [w(names[0])[:, :, 0, 0].T, w(names[1])], names)


def _neck_modules(neck: DPTNeck) -> list[tuple]:
    """`(layer, checkpoint module name, kind)` of every module of the neck: "linear", "pointwise" (a 1x1
    convolution, a Dense layer here) or "convolution"."""
    modules = []
    for i in range(len(neck.reassemble_widths)):
        p, f = f"neck.reassemble_stage.layers.{i}.", f"neck.fusion_stage.layers.{i}."
        if neck.readouts:
            modules.append((neck.readouts[i], f"neck.reassemble_stage.readout_projects.{i}.0", "linear"))
        modules.append((neck.projections[i], p + "projection", "pointwise"))
        if neck.resizes[i] is not None:
            modules.append((neck.resizes[i], p + "resize", "convolution"))
        modules.append((neck.convolutions[i], f"neck.convs.{i}", "convolution"))
        for unit, name in enumerate(("residual_layer1", "residual_layer2")):
            for k in range(2):
                modules.append((neck.fusion_units[2 * i + unit][k], f"{f}{name}.convolution{k + 1}", "convolution"))
        modules.append((neck.fusion_projections[i], f + "projection", "pointwise"))
    return modules


def _read_neck(neck: DPTNeck, w: WeightReader) -> None:
    readers = {"linear": lambda layer, name: w.linear(name, layer), "pointwise": lambda layer, name:
               _read_pointwise(layer, w, name), "convolution": lambda layer, name: _read_convolution(layer, w, name)}  # fmt: skip
    for layer, name, kind in _neck_modules(neck):
        readers[kind](layer, name)


def _depth_head_names(depth_anything: bool) -> tuple:
    """The checkpoint's names of a `DepthHead`'s three convolutions (DPT's are a `Sequential`'s)."""
    return ("head.conv1", "head.conv2", "head.conv3") if depth_anything else ("head.head.0", "head.head.2",
                                                                                "head.head.4")  # fmt: skip


def _read_segmentation_head(head: ConvSegmentationHead, w: WeightReader) -> None:
    _read_convolution(head.convolution, w, "head.head.0")
    names = [f"head.head.1.{name}" for name in ("weight", "bias", "running_mean", "running_var")]
    w.assign(head.batch_norm, [w(name) for name in names], names)
    if "head.head.1.num_batches_tracked" in w.weights:  # PyTorch's counter, which Keras has not
        w("head.head.1.num_batches_tracked")
    _read_pointwise(head.classifier, w, "head.head.4")


@exporter(DPT)
def export_dpt(model: DPT, w: WeightWriter) -> dict:
    """`model` as transformers' `DepthAnythingForDepthEstimation` (a DINOv2 backbone, final-normed features, the
    head at the image's size), or DPT's `DPTForDepthEstimation` / `DPTForSemanticSegmentation` (a plain ViT):
    the converter's inverse."""
    depth_anything = model.normalize_features
    neck, head = model.neck, model.head
    if depth_anything:
        known = (neck.readout, neck.fusion_upsampling, model.head_resolution, model.include_top) == (
            "ignore", "next_map", "image", False)  # fmt: skip
    else:
        known = (neck.fusion_upsampling, model.head_resolution) == ("double", "double")
    if not known:
        raise InputError("Hugging Face has Depth Anything (normalize_features, readout 'ignore', fusion_upsampling "
                         "'next_map', head_resolution 'image', a DepthHead) and DPT (fusion_upsampling 'double', "
                         "head_resolution 'double'); received another combination.", "model",
                         "save_huggingface")  # fmt: skip
    config = _write_depth_anything_backbone(model, w) if depth_anything else _write_dpt_backbone(model, w)
    config.update(neck_hidden_sizes=list(neck.reassemble_widths), reassemble_factors=list(neck.reassemble_factors),
                  fusion_hidden_size=neck.fusion_dim, head_in_index=-1)  # fmt: skip
    _write_neck(neck, w)
    if model.include_top:
        _write_segmentation_head(head, w)
        return dict(config, architectures=["DPTForSemanticSegmentation"], num_labels=head.num_classes,
                    semantic_classifier_dropout=head.classifier_dropout, use_auxiliary_head=False)  # fmt: skip
    for layer, name in zip(head.convolutions, _depth_head_names(depth_anything)):
        _write_convolution(layer, w, name)
    if depth_anything:
        depth = (
            int(head.max_depth) if float(head.max_depth).is_integer() else head.max_depth
        )  # transformers 5 types it int
        config.update(head_hidden_size=head.head_dim, depth_estimation_type=head.depth_type, max_depth=depth)
    elif head.head_dim != 32 or head.depth_type != "relative":
        raise InputError(f"DPT's depth head is 32 wide and relative; received head_dim={head.head_dim}, "
                         f"depth_type={head.depth_type!r}.", "model", "save_huggingface")  # fmt: skip
    return dict(
        config, architectures=["DepthAnythingForDepthEstimation" if depth_anything else "DPTForDepthEstimation"]
    )


def _write_depth_anything_backbone(model: DPT, w: WeightWriter) -> dict:
    part = WeightWriter()
    backbone_config = export_dinov2(model.backbone, part)
    for name, value in part.weights.items():
        w.weights["backbone." + name] = value
    backbone_config.pop("architectures", None)
    backbone_config.update(out_indices=list(model.backbone_layers), apply_layernorm=True, reshape_hidden_states=False)
    return dict(model_type="depth_anything", backbone_config=backbone_config, patch_size=model.backbone.patch_size,
                reassemble_hidden_size=model.backbone.hidden_dim)  # fmt: skip


def _write_dpt_backbone(model: DPT, w: WeightWriter) -> dict:
    backbone = model.backbone
    if backbone.layer_scale_init is not None or backbone.num_extra_tokens or not backbone.use_class_token:
        raise InputError("DPT's backbone is a plain ViT with a class token (no layer scale, registers or "
                         "distillation token).", "model", "save_huggingface")  # fmt: skip
    w["dpt.embeddings.cls_token"] = backbone.class_token
    w["dpt.embeddings.position_embeddings"] = backbone.position_embedding.embeddings[None]
    write_patch_embedding(backbone, w, "dpt.")
    write_blocks(backbone.blocks, w, "dpt.encoder.layer.")
    w.layer_norm("dpt.layernorm", backbone.final_norm)
    return dict(model_type="dpt", **vit_config(backbone, backbone.image_size), is_hybrid=False,
                backbone_out_indices=[layer - 1 for layer in model.backbone_layers], readout_type=model.neck.readout)  # fmt: skip


def _write_convolution(layer, w: WeightWriter, name: str) -> None:
    w[name + ".weight"] = ops.convert_to_numpy(layer.kernel).transpose(3, 2, 0, 1)
    if layer.use_bias:
        w[name + ".bias"] = layer.bias


def _write_pointwise(dense, w: WeightWriter, name: str) -> None:
    w[name + ".weight"] = ops.convert_to_numpy(dense.kernel).T[:, :, None, None]
    w[name + ".bias"] = dense.bias


def _write_neck(neck: DPTNeck, w: WeightWriter) -> None:
    writers = {"linear": lambda layer, name: w.linear(name, layer), "pointwise": lambda layer, name:
               _write_pointwise(layer, w, name), "convolution": lambda layer, name: _write_convolution(layer, w, name)}  # fmt: skip
    for layer, name, kind in _neck_modules(neck):
        writers[kind](layer, name)


def _write_segmentation_head(head: ConvSegmentationHead, w: WeightWriter) -> None:
    _write_convolution(head.convolution, w, "head.head.0")
    norm = head.batch_norm
    for name, value in (("weight", norm.gamma), ("bias", norm.beta), ("running_mean", norm.moving_mean),
                        ("running_var", norm.moving_variance)):  # fmt: skip
        w[f"head.head.1.{name}"] = value
    w.weights["head.head.1.num_batches_tracked"] = np.array(0, dtype="int64")  # PyTorch's counter
    _write_pointwise(head.classifier, w, "head.head.4")
