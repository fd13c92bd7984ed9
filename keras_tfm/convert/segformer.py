"""SegFormer (`SegformerForSemanticSegmentation`, `SegformerModel`) <-> `keras_tfm.SegFormer`.

Published checkpoints name the layers as transformers 4 did (`segformer.encoder.block.0.0.attention.self.query`,
`decode_head.linear_c.0.proj`), and transformers 5 writes them so; those names are read and written, and
transformers 5's own (`segformer.stages.0.blocks.0.attention.q_proj`) are read too.
PyTorch's convolutions `(out, in, kh, kw)` become Keras' `(kh, kw, in, out)`; the decoder's 1x1 convolutions
are Dense layers.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    class_names_of,
    hugging_face_activation,
    keras_activation,
    renamer,
    require_options,
)
from keras_tfm.models.segformer import SegFormer

STAGES = dict(stage_widths="hidden_sizes", stage_depths="depths", stage_heads="num_attention_heads",
              stage_reduction_ratios="sr_ratios", stage_patch_sizes="patch_sizes", stage_strides="strides",
              stage_mlp_ratios="mlp_ratios")  # fmt: skip
TRANSFORMERS_DEFAULTS = dict(hidden_sizes=[32, 64, 160, 256], depths=[2, 2, 2, 2], num_attention_heads=[1, 2, 5, 8],
                             sr_ratios=[8, 4, 2, 1], patch_sizes=[7, 3, 3, 3], strides=[4, 2, 2, 2],
                             mlp_ratios=[4, 4, 4, 4])  # fmt: skip

# transformers 5's module names (an in-memory model's state dict) -> the published ones
_NEW_NAMES = [
    (r"stages\.(\d+)\.patch_embeddings\.", r"encoder.patch_embeddings.\1."),
    (r"stages\.(\d+)\.blocks\.", r"encoder.block.\1."),
    (r"stages\.(\d+)\.layer_norm\.", r"encoder.layer_norm.\1."),
    (r"\.attention\.(q|k|v)_proj\.", lambda match: f".attention.self.{dict(q='query', k='key', v='value')[match[1]]}."),
    (r"\.attention\.sequence_reduction\.sequence_reduction\.", ".attention.self.sr."),
    (r"\.attention\.sequence_reduction\.layer_norm\.", ".attention.self.layer_norm."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."),
    (r"\.mlp\.fc(1|2)\.", r".mlp.dense\1."),
    (r"\.layernorm_before\.", ".layer_norm_1."),
    (r"\.layernorm_after\.", ".layer_norm_2."),
    (r"^decode_head\.linear_projections\.", "decode_head.linear_c."),
]


@converter("segformer", prefixes=("segformer.",), rename=renamer(_NEW_NAMES))
def convert_segformer(config: dict, w: WeightReader, num_classes: int | None = None) -> SegFormer:
    require_options("SegFormer", config, reshape_last_stage=True)
    with_decoder = "decode_head.classifier.weight" in w.weights
    checkpoint_head = with_decoder and num_classes is None
    if checkpoint_head:
        num_classes = w.weights["decode_head.classifier.weight"].shape[0]
    stages = {ours: list(config.get(theirs, TRANSFORMERS_DEFAULTS[theirs])) for ours, theirs in STAGES.items()}
    model = SegFormer(
        num_classes=num_classes or 1,
        **stages,
        decoder_dim=config.get("decoder_hidden_size", 256),
        num_channels=config.get("num_channels", 3),
        include_top=num_classes is not None,
        dropout=config.get("hidden_dropout_prob", 0.0),
        attention_dropout=config.get("attention_probs_dropout_prob", 0.0),
        classifier_dropout=config.get("classifier_dropout_prob", 0.1),
        drop_path_rate=config.get("drop_path_rate", 0.1),
        activation=keras_activation("SegFormer", config, "hidden_act", "gelu"),
        class_names=class_names_of(config, num_classes) if checkpoint_head else None,
    )
    model.build()
    _read_encoder(model, w)
    if checkpoint_head:
        _read_decoder(model, w)
    ignored = () if checkpoint_head else ("decode_head.", "classifier.")  # a new head: fresh
    w.check_all_used("from_huggingface", "SegFormer",
                     ignore=lambda name: name.startswith(ignored) or name.endswith("num_batches_tracked"))  # fmt: skip
    return model


def _convolution(w: WeightReader, name: str, layer, depthwise: bool = False) -> None:
    """PyTorch's `(out, in, kh, kw)` as Keras' `(kh, kw, in, out)`; a depthwise one's `(channels, 1, kh, kw)` as
    `(kh, kw, channels, 1)`."""
    kernel = w(name + ".weight").transpose((2, 3, 0, 1) if depthwise else (2, 3, 1, 0))
    w.assign(layer, [kernel, w(name + ".bias")], [name + ".weight", name + ".bias"])


def _read_encoder(model: SegFormer, w: WeightReader) -> None:
    blocks = iter(model.blocks)
    for stage, depth in enumerate(model.stage_depths):
        p = f"encoder.patch_embeddings.{stage}."
        _convolution(w, p + "proj", model.patch_embeddings[stage].projection)
        w.layer_norm(p + "layer_norm", model.patch_embeddings[stage].norm)
        for index in range(depth):
            _block_modules(next(blocks), w, f"encoder.block.{stage}.{index}.", _convolution)
        w.layer_norm(f"encoder.layer_norm.{stage}", model.stage_norms[stage])


def _block_modules(block, w, p: str, convolution) -> None:
    """A block's modules, read or written (`WeightReader` and `WeightWriter` alike, with `_convolution` or
    `_write_convolution`)."""
    w.layer_norm(p + "layer_norm_1", block.attention_norm)
    w.layer_norm(p + "layer_norm_2", block.feed_forward_norm)
    attention = block.attention
    for dense, name in ((attention.query_dense, "self.query"), (attention.key_dense, "self.key"),
                        (attention.value_dense, "self.value"), (attention.output_dense, "output.dense")):  # fmt: skip
        w.linear(p + "attention." + name, dense)
    if block.reduction is not None:
        w.layer_norm(p + "attention.self.layer_norm", block.reduction_norm)
    w.linear(p + "mlp.dense1", block.intermediate_dense)
    w.linear(p + "mlp.dense2", block.output_dense)
    if block.reduction is not None:
        convolution(w, p + "attention.self.sr", block.reduction)
    convolution(w, p + "mlp.dwconv.dwconv", block.depthwise, depthwise=True)


def _read_decoder(model: SegFormer, w: WeightReader) -> None:
    decoder = model.decoder
    for stage, projection in enumerate(decoder.projections):
        w.linear(f"decode_head.linear_c.{stage}.proj", projection)
    w.assign(decoder.fuse, [w("decode_head.linear_fuse.weight")[:, :, 0, 0].T], ["decode_head.linear_fuse.weight"])
    names = [f"decode_head.batch_norm.{name}" for name in ("weight", "bias", "running_mean", "running_var")]
    w.assign(decoder.batch_norm, [w(name) for name in names], names)
    classifier = [w("decode_head.classifier.weight")[:, :, 0, 0].T, w("decode_head.classifier.bias")]
    w.assign(decoder.classifier, classifier, ["decode_head.classifier.weight", "decode_head.classifier.bias"])


@exporter(SegFormer)
def export_segformer(model: SegFormer, w: WeightWriter) -> dict:
    """`model` as transformers' `SegformerForSemanticSegmentation` (or `SegformerModel` without its decoder):
    the converter's inverse."""
    p = "segformer." if model.include_top else ""
    blocks = iter(model.blocks)
    for stage, depth in enumerate(model.stage_depths):
        embedding = model.patch_embeddings[stage]
        _write_convolution(w, f"{p}encoder.patch_embeddings.{stage}.proj", embedding.projection)
        w.layer_norm(f"{p}encoder.patch_embeddings.{stage}.layer_norm", embedding.norm)
        for index in range(depth):
            _block_modules(next(blocks), w, f"{p}encoder.block.{stage}.{index}.", _write_convolution)
        w.layer_norm(f"{p}encoder.layer_norm.{stage}", model.stage_norms[stage])
    config = dict(
        model_type="segformer",
        num_channels=model.num_channels,
        num_encoder_blocks=len(model.stage_widths),
        **{theirs: list(getattr(model, ours)) for ours, theirs in STAGES.items()},
        decoder_hidden_size=model.decoder_dim,
        hidden_dropout_prob=model.dropout,
        attention_probs_dropout_prob=model.attention_dropout,
        classifier_dropout_prob=model.classifier_dropout,
        drop_path_rate=model.drop_path_rate,
        hidden_act=hugging_face_activation("SegFormer", model.activation),
        reshape_last_stage=True,
    )
    if not model.include_top:
        return dict(config, architectures=["SegformerModel"])
    _write_decoder(model, w)
    return dict(config, architectures=["SegformerForSemanticSegmentation"], num_labels=model.num_classes)


def _write_convolution(w: WeightWriter, name: str, layer, depthwise: bool = False) -> None:
    w[name + ".weight"] = ops.convert_to_numpy(layer.kernel).transpose((2, 3, 0, 1) if depthwise else (3, 2, 0, 1))
    w[name + ".bias"] = layer.bias


def _write_decoder(model: SegFormer, w: WeightWriter) -> None:
    decoder = model.decoder
    for stage, projection in enumerate(decoder.projections):
        w.linear(f"decode_head.linear_c.{stage}.proj", projection)
    w["decode_head.linear_fuse.weight"] = ops.convert_to_numpy(decoder.fuse.kernel).T[:, :, None, None]
    norm = decoder.batch_norm
    for name, value in (("weight", norm.gamma), ("bias", norm.beta), ("running_mean", norm.moving_mean),
                        ("running_var", norm.moving_variance)):  # fmt: skip
        w[f"decode_head.batch_norm.{name}"] = value
    w.weights["decode_head.batch_norm.num_batches_tracked"] = np.array(0, dtype="int64")  # PyTorch's counter
    w["decode_head.classifier.weight"] = ops.convert_to_numpy(decoder.classifier.kernel).T[:, :, None, None]
    w["decode_head.classifier.bias"] = decoder.classifier.bias
