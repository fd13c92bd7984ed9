"""Marian (`MarianMTModel`, `MarianModel`: the opus-mt checkpoints) -> `keras_tfm.Translator`.

Marian is the paper's post-norm Transformer with [sin | cos] sinusoidal positions, embeddings scaled
by sqrt(d_model) when `scale_embedding`, a padding id that also starts decoding, and a fixed
`final_logits_bias`. Most opus-mt checkpoints share one vocabulary (`model.shared`); those with
`share_encoder_decoder_embeddings=False` have a source table and a target table of
`decoder_vocab_size` rows, to which the output projection is tied. PyTorch `Linear` weights are (out, in); Keras kernels are (in, out).
"""

from __future__ import annotations

from keras_tfm.convert.huggingface import WeightReader, converter, no_classifier, set_layer_norm
from keras_tfm.models.translator import Translator

_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "swish": "silu", "silu": "silu", "gelu_new": "gelu_approximate"}


@converter("marian", prefixes=("model.",))
def convert_marian(config: dict, w: WeightReader, num_classes: int | None = None) -> Translator:
    no_classifier("Marian", num_classes)
    activation = config.get("activation_function", "gelu")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"from_huggingface: Marian activation {activation!r} is not supported.")
    shared = config.get("share_encoder_decoder_embeddings", True)
    if config.get("encoder_attention_heads") != config.get("decoder_attention_heads") or config.get(
            "encoder_ffn_dim") != config.get("decoder_ffn_dim"):
        raise ValueError("from_huggingface: Marian encoder and decoder must share heads and feed-forward width.")
    model = Translator(
        source_vocabulary_size=config["vocab_size"],
        target_vocabulary_size=config["vocab_size"] if shared else config.get("decoder_vocab_size") or config["vocab_size"],
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
        activation=_ACTIVATIONS[activation],
        dropout=config.get("dropout", 0.1),
        attention_dropout=config.get("attention_dropout", 0.0),
        pad_token_id=config["pad_token_id"],
        start_token_id=config.get("decoder_start_token_id", config["pad_token_id"]),
        end_token_id=config["eos_token_id"],
    )
    model.build()
    if shared:
        model.source_embedding.set_weights([w("shared.weight")])
    else:
        model.source_embedding.set_weights([w("encoder.embed_tokens.weight")])
        model.target_embedding.set_weights([w("decoder.embed_tokens.weight")])
    if "final_logits_bias" in w:
        model.output_bias.assign(w("final_logits_bias").reshape(-1))

    def attention(layer, prefix):
        for dense, name in ((layer.query_dense, "q_proj"), (layer.key_dense, "k_proj"),
                            (layer.value_dense, "v_proj"), (layer.output_dense, "out_proj")):
            w.linear(f"{prefix}.{name}", dense)

    def feed_forward(block, prefix):
        w.linear(prefix + "fc1", block.feed_forward.intermediate_dense)
        w.linear(prefix + "fc2", block.feed_forward.output_dense)
        set_layer_norm(block.feed_forward_norm, w(prefix + "final_layer_norm.weight"), w(prefix + "final_layer_norm.bias"))

    for i, block in enumerate(model.encoder_blocks):
        p = f"encoder.layers.{i}."
        attention(block.self_attention, p + "self_attn")
        set_layer_norm(block.self_attention_norm, w(p + "self_attn_layer_norm.weight"), w(p + "self_attn_layer_norm.bias"))
        feed_forward(block, p)
    for i, block in enumerate(model.decoder_blocks):
        p = f"decoder.layers.{i}."
        attention(block.self_attention, p + "self_attn")
        set_layer_norm(block.self_attention_norm, w(p + "self_attn_layer_norm.weight"), w(p + "self_attn_layer_norm.bias"))
        attention(block.cross_attention, p + "encoder_attn")
        set_layer_norm(block.cross_attention_norm, w(p + "encoder_attn_layer_norm.weight"),
                       w(p + "encoder_attn_layer_norm.bias"))
        feed_forward(block, p)
    if not model.tie_embeddings:
        w.linear("lm_head", model.lm_head)
    # with a shared vocabulary the per-stack token tables are copies of `shared`; the position
    # tables are the fixed sinusoids; a tied `lm_head` is a copy of the target table
    copies = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight") if shared else ()
    leftover = w.unused(ignore=lambda name: name == "lm_head.weight" or name.endswith(
        (*copies, "embed_positions.weight")))
    if leftover:
        raise ValueError(f"from_huggingface: Marian weights not converted: {leftover[:5]}")
    return model
