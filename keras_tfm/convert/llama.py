"""Llama, Mistral, Qwen2 and Qwen3 (`*ForCausalLM`, `*Model`) <-> `keras_tfm.DecoderLM`.

The four share one layout (`model.layers.{i}.self_attn.q_proj`, `mlp.gate_proj`, ...) and differ in
what their configs switch: biases, QK-norm, the sliding window and the RoPE scaling. The config drives
the model; a setting DecoderLM does not compute (a RoPE type it lacks, partial rotation in these
families) is refused by name, never ignored.
"""

from __future__ import annotations

from keras_tfm.convert.registry import converter, exporter
from keras_tfm.convert.weights import (
    WeightReader,
    WeightWriter,
    hugging_face_activation,
    keras_activation,
    no_classifier,
)
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.layers.rotary import yarn_attention_factor
from keras_tfm.models.decoder_lm import DecoderLM

NAMES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
ARCHITECTURES["qwen3"] = "Qwen3ForCausalLM"


def _blocks(model: DecoderLM, w: WeightReader | WeightWriter, prefix: str = "") -> None:
    """Reads (`WeightReader`) or writes (`WeightWriter`) the blocks under their checkpoint names."""
    for i, block in enumerate(model.blocks):
        p = f"{prefix}layers.{i}."
        attention = block.self_attention
        w.rms_norm(p + "input_layernorm", block.self_attention_norm)
        for module, dense in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"), ("o_proj", "output")):
            w.linear(p + "self_attn." + module, getattr(attention, dense + "_dense"))
        if model.query_key_norm:
            w.rms_norm(p + "self_attn.q_norm", attention.query_norm)
            w.rms_norm(p + "self_attn.k_norm", attention.key_norm)
        w.rms_norm(p + "post_attention_layernorm", block.feed_forward_norm)
        feed_forward = block.feed_forward
        for module, dense in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "output")):
            w.linear(p + "mlp." + module, getattr(feed_forward, dense + "_dense"))


def _rotary_embedding(config: dict, name: str) -> dict:
    """`RotaryEmbedding`'s arguments from a config's `rope_theta` and `rope_scaling` (transformers 4)
    or `rope_parameters` (transformers 5)."""
    parameters = config.part("rope_parameters")
    parameters.update(config.get("rope_scaling") or {})
    if config.get("rope_scaling"):
        parameters.where = f"{config.where} (rope_scaling)"
    theta = config.get("rope_theta", parameters.get("rope_theta", 10000.0))
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    fraction = parameters.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if fraction != 1.0:
        raise CheckpointError(
            f"{name} checkpoints with partial_rotary_factor={fraction!r} are not supported; "
            f"transformers' {name} rotates every feature of a head.",
            caller="from_huggingface",
        )
    rotary = {"max_wavelength": float(theta)}
    if rope_type == "default":
        return rotary
    if rope_type not in ("linear", "llama3", "dynamic", "yarn"):
        raise CheckpointError(
            f"{name} checkpoints with rope_type={rope_type!r} are not supported; supported: "
            "'default', 'linear', 'llama3', 'dynamic', 'yarn'.",
            caller="from_huggingface",
        )
    factor = parameters.get("factor")
    original = parameters.get("original_max_position_embeddings")
    if rope_type == "yarn" and factor is None and original:  # DeepSeek's form: the ratio of the two contexts
        factor = config["max_position_embeddings"] / original
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
        raise CheckpointError(
            f"{parameters.where}: rope_type {rope_type!r} needs a 'factor', a number > 0; it is {factor!r}."
        )
    rotary.update(scaling=rope_type, scaling_factor=float(factor))
    if rope_type == "llama3":
        rotary.update(
            original_max_length=int(original),
            low_frequency_factor=float(parameters["low_freq_factor"]),
            high_frequency_factor=float(parameters["high_freq_factor"]),
        )
    elif rope_type == "dynamic":  # transformers scales from max_position_embeddings
        rotary.update(original_max_length=int(config["max_position_embeddings"]))
    elif rope_type == "yarn":
        attention_factor = parameters.get("attention_factor")
        if attention_factor is None:
            attention_factor = yarn_attention_factor(factor, parameters.get("mscale"), parameters.get("mscale_all_dim"))
        rotary.update(
            original_max_length=int(original),
            beta_fast=float(parameters.get("beta_fast") or 32.0),
            beta_slow=float(parameters.get("beta_slow") or 1.0),
            truncate=bool(parameters.get("truncate", True)),
            attention_factor=float(attention_factor),
        )
    return rotary


def _sliding_window(config: dict, model_type: str) -> tuple[int | None, list[int] | None]:
    """The window and the layers that use it (None: every layer)."""
    if model_type == "llama":
        return None, None
    if model_type == "mistral":
        return config.get("sliding_window"), None
    if not config.get("use_sliding_window", False) or config.get("sliding_window") is None:
        return None, None
    num_layers = config["num_hidden_layers"]
    layer_types = config.get("layer_types") or [
        "sliding_attention" if i >= config.get("max_window_layers", 28) else "full_attention" for i in range(num_layers)
    ]
    layers = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    return config["sliding_window"], (None if len(layers) == num_layers else layers)


@converter("llama", "mistral", "qwen2", "qwen3", prefixes=("model.",))
def convert_llama(config: dict, w: WeightReader, num_classes: int | None = None) -> DecoderLM:
    model_type = config["model_type"]
    name = NAMES[model_type]
    no_classifier(name, num_classes)
    activation = keras_activation(name, config, "hidden_act", "silu")
    attention_bias = config.get("attention_bias", False)
    biases = dict(
        attention_use_bias=True if model_type == "qwen2" else attention_bias,
        attention_output_use_bias=False if model_type == "qwen2" else attention_bias,
        feed_forward_use_bias=config.get("mlp_bias", False) if model_type == "llama" else False,
    )
    sliding_window, sliding_window_layers = _sliding_window(config, model_type)
    num_heads = config["num_attention_heads"]
    model = DecoderLM(
        vocabulary_size=config["vocab_size"],
        max_length=config["max_position_embeddings"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        hidden_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        num_key_value_heads=config.get("num_key_value_heads") or num_heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
        rotary_embedding=_rotary_embedding(config, name),
        layer_norm_epsilon=config.get("rms_norm_eps", 1e-6),
        tie_embeddings=config.get("tie_word_embeddings", False),
        activation=activation,
        sliding_window=sliding_window,
        sliding_window_layers=sliding_window_layers,
        query_key_norm=model_type == "qwen3",
        dropout=0.0,  # these checkpoints train without dropout on residuals
        attention_dropout=config.get("attention_dropout", 0.0),
        **biases,
    )
    model.build()
    w.set(model.token_embedding, "embed_tokens.weight")
    _blocks(model, w)
    w.rms_norm("norm", model.final_norm)
    if not model.tie_embeddings:
        w.linear("lm_head", model.lm_head)
    w.check_all_used(
        "from_huggingface",
        name,
        ignore=lambda weight: weight == "lm_head.weight" or weight.endswith("rotary_emb.inv_freq"),
    )
    return model


def _model_type(model: DecoderLM) -> str:
    """The family whose transformers class computes what `model` computes."""
    qkv, output, mlp = model.attention_use_bias, model.attention_output_use_bias, model.feed_forward_use_bias
    if model.query_key_norm:
        model_type = "qwen3"
        ok = qkv == output and not mlp
    elif qkv and not output:
        model_type = "qwen2"
        ok = not mlp
    elif model.sliding_window is not None:
        if model.sliding_window_layers is not None:
            raise InputError(
                f"a sliding window on some layers only (sliding_window_layers) is Qwen2's or "
                f"Qwen3's; {model.name!r} has neither Qwen2's query/key/value biases nor Qwen3's QK-norm.",
                caller="save_huggingface",
            )
        model_type = "mistral"
        ok = not (qkv or output or mlp)
    else:
        model_type = "llama"
        ok = qkv == output
    if not ok:
        raise InputError(
            f"no transformers class has the biases of {model.name!r} (attention_use_bias={qkv}, "
            f"attention_output_use_bias={output}, feed_forward_use_bias={mlp}) together with its other settings.",
            caller="save_huggingface",
        )
    return model_type


def _rope_config(model: DecoderLM) -> dict:
    rotary = model.rotary_embedding
    if rotary.get("rotary_fraction", 1.0) != 1.0:
        raise InputError(
            f"transformers' Llama-family classes rotate every feature; {model.name!r} has "
            f"rotary_fraction={rotary['rotary_fraction']}.",
            caller="save_huggingface",
        )
    scaling = rotary.get("scaling")
    if scaling is None:
        return dict(rope_theta=rotary["max_wavelength"], rope_scaling=None)
    parameters = {"rope_type": scaling, "factor": rotary.get("scaling_factor", 1.0)}
    original = rotary.get("original_max_length")
    if scaling == "llama3":
        parameters.update(
            low_freq_factor=rotary.get("low_frequency_factor", 1.0),
            high_freq_factor=rotary.get("high_frequency_factor", 4.0),
            original_max_position_embeddings=original,
        )
    elif scaling == "dynamic" and original != model.max_length:
        raise InputError(
            f"transformers' dynamic RoPE scales from max_position_embeddings; {model.name!r} has "
            f"original_max_length={original} and max_length={model.max_length}.",
            caller="save_huggingface",
        )
    elif scaling == "yarn":
        parameters.update(
            original_max_position_embeddings=original,
            beta_fast=rotary.get("beta_fast", 32.0),
            beta_slow=rotary.get("beta_slow", 1.0),
            truncate=rotary.get("truncate", True),
            attention_factor=rotary.get("attention_factor") or yarn_attention_factor(parameters["factor"]),
        )
    return dict(rope_theta=rotary["max_wavelength"], rope_scaling=parameters)


@exporter(DecoderLM)
def export_llama(model: DecoderLM, w: WeightWriter) -> dict:
    config = huggingface_config(model)
    w["model.embed_tokens.weight"] = model.token_embedding.embeddings
    _blocks(model, w, "model.")
    w.rms_norm("model.norm", model.final_norm)
    if not model.tie_embeddings:
        w.linear("lm_head", model.lm_head)
    return config


def huggingface_config(model: DecoderLM) -> dict:
    """The `config.json` of the transformers class that computes what `model` computes (nothing is built)."""
    model_type = _model_type(model)
    config = dict(
        model_type=model_type,
        architectures=[ARCHITECTURES[model_type]],
        vocab_size=model.vocabulary_size,
        max_position_embeddings=model.max_length,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        num_key_value_heads=model.num_key_value_heads,
        head_dim=model.head_dim,
        hidden_size=model.hidden_dim,
        intermediate_size=model.intermediate_dim,
        rms_norm_eps=model.layer_norm_epsilon,
        tie_word_embeddings=model.tie_embeddings,
        hidden_act=hugging_face_activation(NAMES[model_type], model.activation),
        attention_dropout=model.attention_dropout,
        # no token of the vocabulary is special to a model trained here
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **_rope_config(model),
    )
    if model_type == "llama":
        config.update(attention_bias=model.attention_use_bias, mlp_bias=model.feed_forward_use_bias)
    elif model_type == "qwen3":
        config.update(attention_bias=model.attention_use_bias)
    if model_type == "mistral":
        config.update(sliding_window=model.sliding_window)
    elif model_type in ("qwen2", "qwen3"):
        window = model.sliding_window
        layers = range(model.num_layers) if model.sliding_window_layers is None else model.sliding_window_layers
        config.update(
            use_sliding_window=window is not None,
            sliding_window=window,
            max_window_layers=model.num_layers,
            layer_types=[
                "sliding_attention" if window is not None and i in layers else "full_attention"
                for i in range(model.num_layers)
            ],
        )
    return config
