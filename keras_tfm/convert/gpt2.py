"""GPT-2 (`GPT2Model`, `GPT2LMHeadModel`) <-> `keras_tfm.GPT`.

GPT-2 stores its projections as `Conv1D` with kernels laid out (in, out), as Keras does; the fused
`c_attn` kernel is split into query, key and value.
"""

from __future__ import annotations

from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    hugging_face_activation,
    keras_activation,
    no_classifier,
    require_options,
)
from keras_tfm.models.gpt import GPT


def _blocks(model: GPT, w: WeightReader | WeightWriter, prefix: str = "") -> None:
    """Reads (`WeightReader`) or writes (`WeightWriter`) the blocks under their checkpoint names."""
    for i, block in enumerate(model.blocks):
        p = f"{prefix}h.{i}."
        w.layer_norm(p + "ln_1", block.self_attention_norm)
        attention = block.self_attention
        w.linear(p + "attn.c_attn", attention.query_dense, attention.key_dense, attention.value_dense, transpose=False)
        w.linear(p + "attn.c_proj", attention.output_dense, transpose=False)
        w.layer_norm(p + "ln_2", block.feed_forward_norm)
        w.linear(p + "mlp.c_fc", block.feed_forward.intermediate_dense, transpose=False)
        w.linear(p + "mlp.c_proj", block.feed_forward.output_dense, transpose=False)


@converter("gpt2", prefixes=("transformer.",))
def convert_gpt2(config: dict, w: WeightReader, num_classes: int | None = None) -> GPT:
    no_classifier("GPT-2", num_classes)
    # (reorder_and_upcast_attn only changes the precision of the attention logits: allowed)
    require_options(
        "GPT-2", config, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, add_cross_attention=False
    )
    hidden_dim = config["n_embd"]
    model = GPT(
        vocabulary_size=config["vocab_size"],
        max_length=config["n_positions"],
        num_layers=config["n_layer"],
        num_heads=config["n_head"],
        hidden_dim=hidden_dim,
        intermediate_dim=config.get("n_inner") or 4 * hidden_dim,
        # what fine-tuning trains with, as in transformers; one rate for embeddings and residual
        # branches (GPT-2's embd_pdrop and resid_pdrop, equal in the published checkpoints: 0.1)
        dropout=config.get("resid_pdrop", 0.1),
        attention_dropout=config.get("attn_pdrop", 0.1),
        layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-5),
        tie_embeddings=config.get("tie_word_embeddings", True),
        activation=keras_activation("GPT-2", config, "activation_function", "gelu_new"),
    )
    model.build()
    w.set(model.token_embedding, "wte.weight")
    w.set(model.position_embedding, "wpe.weight")
    _blocks(model, w)
    w.layer_norm("ln_f", model.final_norm)
    if not model.tie_embeddings:
        w.linear("lm_head", model.lm_head)
    w.check_all_used(
        "from_huggingface",
        "GPT-2",
        ignore=lambda name: name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias")),
    )
    return model


@exporter(GPT)
def export_gpt2(model: GPT, w: WeightWriter) -> dict:
    w["transformer.wte.weight"] = model.token_embedding.embeddings
    w["transformer.wpe.weight"] = model.position_embedding.embeddings
    _blocks(model, w, "transformer.")
    w.layer_norm("transformer.ln_f", model.final_norm)
    if not model.tie_embeddings:
        w.linear("lm_head", model.lm_head)
    return dict(
        model_type="gpt2",
        architectures=["GPT2LMHeadModel"],
        vocab_size=model.vocabulary_size,
        n_positions=model.max_length,
        n_layer=model.num_layers,
        n_head=model.num_heads,
        n_embd=model.hidden_dim,
        n_inner=model.intermediate_dim,
        resid_pdrop=model.dropout,
        embd_pdrop=model.dropout,
        attn_pdrop=model.attention_dropout,
        layer_norm_epsilon=model.layer_norm_epsilon,
        tie_word_embeddings=model.tie_embeddings,
        activation_function=hugging_face_activation("GPT-2", model.activation),
        # GPT-2's <|endoftext|>, where the vocabulary is GPT-2's (transformers' defaults); none otherwise
        **({} if model.vocabulary_size > 50256 else dict(bos_token_id=None, eos_token_id=None)),
    )
