"""GPT-2 (`GPT2Model`, `GPT2LMHeadModel`) -> `keras_tfm.GPT`.

GPT-2 stores its projections as `Conv1D` with kernels laid out (in, out), as Keras does; the fused
`c_attn` kernel is split into query, key and value.
"""

from __future__ import annotations

from keras_tfm.convert.huggingface import WeightReader, converter, no_classifier, require_options, set_layer_norm
from keras_tfm.models.gpt import GPT

_ACTIVATIONS = {"gelu_new": "gelu_approximate", "gelu_pytorch_tanh": "gelu_approximate", "gelu": "gelu", "relu": "relu"}


@converter("gpt2", prefixes=("transformer.",))
def convert_gpt2(config: dict, w: WeightReader, num_classes: int | None = None) -> GPT:
    no_classifier("GPT-2", num_classes)
    # (reorder_and_upcast_attn only changes the precision of the attention logits: allowed)
    require_options("GPT-2", config, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                    add_cross_attention=False)
    if config.get("activation_function", "gelu_new") not in _ACTIVATIONS:
        raise ValueError(f"from_huggingface: GPT-2 activation {config['activation_function']!r} is not supported.")
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
        activation=_ACTIVATIONS[config.get("activation_function", "gelu_new")],
    )
    model.build()
    model.token_embedding.set_weights([w("wte.weight")])
    model.position_embedding.set_weights([w("wpe.weight")])
    for i, block in enumerate(model.blocks):
        p = f"h.{i}."
        set_layer_norm(block.self_attention_norm, w(p + "ln_1.weight"), w(p + "ln_1.bias"))
        attention = block.self_attention
        w.linear(p + "attn.c_attn", attention.query_dense, attention.key_dense, attention.value_dense, transpose=False)
        w.linear(p + "attn.c_proj", attention.output_dense, transpose=False)
        set_layer_norm(block.feed_forward_norm, w(p + "ln_2.weight"), w(p + "ln_2.bias"))
        w.linear(p + "mlp.c_fc", block.feed_forward.intermediate_dense, transpose=False)
        w.linear(p + "mlp.c_proj", block.feed_forward.output_dense, transpose=False)
    set_layer_norm(model.final_norm, w("ln_f.weight"), w("ln_f.bias"))
    if not model.tie_embeddings:
        w.linear("lm_head", model.lm_head)
    leftover = w.unused(ignore=lambda name: name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias")))
    if leftover:
        raise ValueError(f"from_huggingface: GPT-2 weights not converted: {leftover[:5]}")
    return model
