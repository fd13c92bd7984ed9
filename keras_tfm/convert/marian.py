"""Marian (`MarianMTModel`, `MarianModel`: the opus-mt checkpoints) <-> `keras_tfm.Translator`.

Marian is the paper's post-norm Transformer with [sin | cos] sinusoidal positions, embeddings scaled
by sqrt(d_model) when `scale_embedding`, a padding id that also starts decoding, and a fixed
`final_logits_bias`. Most opus-mt checkpoints share one vocabulary (`model.shared`); those with
`share_encoder_decoder_embeddings=False` have a source table and a target table of
`decoder_vocab_size` rows, to which the output projection is tied. PyTorch `Linear` weights are (out, in); Keras kernels are (in, out).
"""

from __future__ import annotations

import keras

from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    hugging_face_activation,
    keras_activation,
    no_classifier,
)
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.models.translator import Translator


def _blocks(model: Translator, w: WeightReader | WeightWriter, prefix: str = "") -> None:
    """Reads (`WeightReader`) or writes (`WeightWriter`) both stacks' blocks under their checkpoint names."""

    def attention(layer, name):
        for dense, projection in (
            (layer.query_dense, "q_proj"),
            (layer.key_dense, "k_proj"),
            (layer.value_dense, "v_proj"),
            (layer.output_dense, "out_proj"),
        ):
            w.linear(f"{name}.{projection}", dense)

    for stack, blocks in (("encoder", model.encoder_blocks), ("decoder", model.decoder_blocks)):
        for i, block in enumerate(blocks):
            p = f"{prefix}{stack}.layers.{i}."
            attention(block.self_attention, p + "self_attn")
            w.layer_norm(p + "self_attn_layer_norm", block.self_attention_norm)
            if stack == "decoder":
                attention(block.cross_attention, p + "encoder_attn")
                w.layer_norm(p + "encoder_attn_layer_norm", block.cross_attention_norm)
            w.linear(p + "fc1", block.feed_forward.intermediate_dense)
            w.linear(p + "fc2", block.feed_forward.output_dense)
            w.layer_norm(p + "final_layer_norm", block.feed_forward_norm)


@converter("marian", prefixes=("model.",))
def convert_marian(config: dict, w: WeightReader, num_classes: int | None = None) -> Translator:
    no_classifier("Marian", num_classes)
    activation = keras_activation("Marian", config, "activation_function", "gelu")
    shared = config.get("share_encoder_decoder_embeddings", True)
    if config.get("encoder_attention_heads") != config.get("decoder_attention_heads") or config.get(
        "encoder_ffn_dim"
    ) != config.get("decoder_ffn_dim"):
        raise CheckpointError(
            "Marian encoder and decoder must share heads and feed-forward width.", caller="from_huggingface"
        )
    model = Translator(
        source_vocabulary_size=config["vocab_size"],
        target_vocabulary_size=config["vocab_size"]
        if shared
        else config.get("decoder_vocab_size") or config["vocab_size"],
        num_encoder_layers=config["encoder_layers"],
        num_decoder_layers=config["decoder_layers"],
        num_heads=config["encoder_attention_heads"],
        hidden_dim=config["d_model"],
        intermediate_dim=config["encoder_ffn_dim"],
        max_length=config["max_position_embeddings"],
        positions="sinusoidal",
        norm_first=False,
        share_embeddings=shared,
        tie_embeddings=config.get("tie_word_embeddings", True),
        scale_embeddings=config.get("scale_embedding", False),
        use_output_bias=True,
        activation=activation,
        dropout=config.get("dropout", 0.1),
        attention_dropout=config.get("attention_dropout", 0.0),
        pad_token_id=config["pad_token_id"],
        start_token_id=config.get("decoder_start_token_id", config["pad_token_id"]),
        end_token_id=config["eos_token_id"],
    )
    model.build()
    if shared:
        w.set(model.source_embedding, "shared.weight")
    else:
        w.set(model.source_embedding, "encoder.embed_tokens.weight")
        w.set(model.target_embedding, "decoder.embed_tokens.weight")
    if "final_logits_bias" in w:
        model.output_bias.assign(w("final_logits_bias").reshape(-1))
    _blocks(model, w)
    if not model.tie_embeddings:
        w.linear("lm_head", model.lm_head)
    # with a shared vocabulary the per-stack token tables are copies of `shared`; the position
    # tables are the fixed sinusoids; a tied `lm_head` is a copy of the target table
    copies = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight") if shared else ()
    w.check_all_used(
        "from_huggingface",
        "Marian",
        ignore=lambda name: name == "lm_head.weight" or name.endswith((*copies, "embed_positions.weight")),
    )
    return model


@exporter(Translator)
def export_marian(model: Translator, w: WeightWriter) -> dict:
    # Marian's LayerNorms use PyTorch's default epsilon, which its config cannot change
    if model.norm_first or model.positions != "sinusoidal" or model.layer_norm_epsilon != 1e-5:
        raise InputError(
            f"Marian is the post-norm Transformer with sinusoidal positions and "
            f"layer_norm_epsilon 1e-5; received norm_first={model.norm_first}, positions={model.positions!r}, "
            f"layer_norm_epsilon={model.layer_norm_epsilon}.",
            caller="save_huggingface",
        )
    if model.share_embeddings:  # with the stacks' copies, which transformers 5 does not tie when the output is untied
        for name in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
            w[name] = model.source_embedding.embeddings
    else:
        w["model.encoder.embed_tokens.weight"] = model.source_embedding.embeddings
        w["model.decoder.embed_tokens.weight"] = model.target_embedding.embeddings
    # a fixed buffer in Marian, zero in the opus-mt checkpoints
    w["final_logits_bias"] = (
        model.output_bias if model.use_output_bias else keras.ops.zeros((model.target_vocabulary_size,))
    )[None]
    _blocks(model, w, "model.")
    if not model.tie_embeddings:
        w.linear("lm_head", model.lm_head)
    return dict(
        model_type="marian",
        architectures=["MarianMTModel"],
        vocab_size=model.source_vocabulary_size,
        decoder_vocab_size=model.target_vocabulary_size,
        share_encoder_decoder_embeddings=model.share_embeddings,
        tie_word_embeddings=model.tie_embeddings,
        d_model=model.hidden_dim,
        encoder_layers=model.num_encoder_layers,
        decoder_layers=model.num_decoder_layers,
        encoder_attention_heads=model.num_heads,
        decoder_attention_heads=model.num_heads,
        encoder_ffn_dim=model.intermediate_dim,
        decoder_ffn_dim=model.intermediate_dim,
        max_position_embeddings=model.max_length,
        scale_embedding=model.scale_embeddings,
        dropout=model.dropout,
        attention_dropout=model.attention_dropout,
        activation_dropout=0.0,
        activation_function=hugging_face_activation("Marian", model.activation),
        pad_token_id=model.pad_token_id,
        decoder_start_token_id=model.start_token_id,
        eos_token_id=model.end_token_id,
        forced_eos_token_id=model.end_token_id,
    )
