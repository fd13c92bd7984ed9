"""ViTMAE (`ViTMAEForPreTraining`, `ViTMAEModel`) <-> `keras_tfm.ViTMAE`, or its encoder as a `ViT`.

The encoder's weights are a ViT's (`vit.layers.{i}...`, earlier `vit.encoder.layer.{i}...`), its fixed sin-cos
position table among them; the decoder's blocks are ViT blocks too (`decoder.decoder_layers.{i}`, earlier
`decoder.decoder_encoder.layer.{i}`, which the ViT renaming maps to the same). A `ViTMAEModel` checkpoint, or a
pretraining one loaded with `num_classes`, becomes a `ViT`: the encoder alone, for features or fine-tuning.
"""

from __future__ import annotations

from keras_tfm.convert.dinov2 import write_patch_embedding
from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.vit import (
    read_blocks,
    read_encoder,
    rename_earlier_names,
    vit_arguments,
    vit_config,
    write_blocks,
)
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    require_options,
)
from keras_tfm.models.vit import ViT
from keras_tfm.models.vit_mae import ViTMAE


@converter("vit_mae", prefixes=("vit.",), rename=rename_earlier_names)
def convert_vit_mae(config: dict, w: WeightReader, num_classes: int | None = None) -> ViTMAE | ViT:
    require_options("ViTMAE", config, qkv_bias=True)
    with_decoder = "decoder.decoder_embed.weight" in w.weights and num_classes is None
    encoder = ViT(
        image_size=config["image_size"],
        patch_size=config["patch_size"],
        num_classes=num_classes or 1,
        include_top=num_classes is not None,
        **vit_arguments(config, "ViTMAE"),
    )
    model = _pretraining_model(config, encoder) if with_decoder else encoder
    model.build()
    read_encoder(encoder, w)
    if with_decoder:
        _read_decoder(model.decoder, w)
    ignored = () if with_decoder else ("decoder.",)
    w.check_all_used("from_huggingface", "ViTMAE", ignore=lambda name: name.startswith(ignored))
    return model


def _pretraining_model(config: dict, encoder: ViT) -> ViTMAE:
    return ViTMAE(
        encoder,
        decoder_dim=config.get("decoder_hidden_size", 512),
        decoder_layers=config.get("decoder_num_hidden_layers", 8),
        decoder_heads=config.get("decoder_num_attention_heads", 16),
        decoder_intermediate_dim=config.get("decoder_intermediate_size", 2048),
        mask_ratio=config.get("mask_ratio", 0.75),
        normalize_targets=config.get("norm_pix_loss", False),
    )


def _read_decoder(decoder, w: WeightReader) -> None:
    w.linear("decoder.decoder_embed", decoder.embed)
    w.set_variable(decoder.mask_token, "decoder.mask_token")
    decoder.positions.assign(w("decoder.decoder_pos_embed")[0])
    read_blocks(decoder.blocks, w, "decoder.decoder_layers.")
    w.layer_norm("decoder.decoder_norm", decoder.norm)
    w.linear("decoder.decoder_pred", decoder.prediction)


@exporter(ViTMAE)
def export_vit_mae(model: ViTMAE, w: WeightWriter) -> dict:
    """`model` as transformers' `ViTMAEForPreTraining`: the converter's inverse."""
    encoder, decoder = model.encoder, model.decoder
    w["vit.embeddings.cls_token"] = encoder.class_token
    w["vit.embeddings.position_embeddings"] = encoder.position_embedding.embeddings[None]
    write_patch_embedding(encoder, w, "vit.")
    write_blocks(encoder.blocks, w, "vit.encoder.layer.")
    w.layer_norm("vit.layernorm", encoder.final_norm)
    w.linear("decoder.decoder_embed", decoder.embed)
    w["decoder.mask_token"] = decoder.mask_token
    w["decoder.decoder_pos_embed"] = decoder.positions[None]
    write_blocks(decoder.blocks, w, "decoder.decoder_encoder.layer.")
    w.layer_norm("decoder.decoder_norm", decoder.norm)
    w.linear("decoder.decoder_pred", decoder.prediction)
    return dict(
        model_type="vit_mae",
        architectures=["ViTMAEForPreTraining"],
        **vit_config(encoder, encoder.image_size),
        decoder_hidden_size=model.decoder_dim,
        decoder_num_hidden_layers=model.decoder_layers,
        decoder_num_attention_heads=model.decoder_heads,
        decoder_intermediate_size=model.decoder_intermediate_dim,
        mask_ratio=model.mask_ratio,
        norm_pix_loss=model.normalize_targets,
    )
