"""A checkpoint's `config.json`, checked once when read: every field a converter reads has the type
transformers writes, and a missing or malformed one is a `CheckpointError` that names the file, the
field, what was expected and what came (rather than a `KeyError` or `TypeError` deep in a converter)."""

from __future__ import annotations

import numbers

from keras_tfm.errors import CheckpointError


def _positive_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _token_ids(value) -> bool:
    """One id or a list of ids (Llama 3 and Qwen stop at either of two); None: unset."""
    ids = value if isinstance(value, list) else [value]
    return all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)


# field -> (check, what it must be); None is allowed for every field (transformers' "unset")
_EXPECTED = {
    **dict.fromkeys(
        (
            "vocab_size",
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "intermediate_size",
            "max_position_embeddings",
            "num_key_value_heads",
            "head_dim",
            "n_embd",
            "n_head",
            "n_layer",
            "n_positions",
            "n_inner",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "decoder_vocab_size",
            "type_vocab_size",
            "num_channels",
            "sliding_window",
            "max_new_tokens",
        ),
        (_positive_integer, "an integer > 0"),
    ),
    # a hierarchical encoder's (SegFormer's) stages, one number each
    **dict.fromkeys(
        ("hidden_sizes", "depths", "sr_ratios", "patch_sizes", "strides"),
        (
            lambda value: _positive_integer(value) or (isinstance(value, list) and all(map(_positive_integer, value))),
            "an integer > 0 or a list of them",
        ),
    ),
    **dict.fromkeys(
        ("eos_token_id", "bos_token_id", "pad_token_id", "decoder_start_token_id"),
        (_token_ids, "a token id (an integer >= 0) or a list of them"),
    ),
    **dict.fromkeys(
        (
            "rms_norm_eps",
            "layer_norm_eps",
            "layer_norm_epsilon",
            "rope_theta",
            "attention_dropout",
            "hidden_dropout_prob",
            "attention_probs_dropout_prob",
            "partial_rotary_factor",
            "temperature",
            "top_p",
            "repetition_penalty",
        ),
        (_number, "a number"),
    ),
    **dict.fromkeys(
        (
            "tie_word_embeddings",
            "attention_bias",
            "mlp_bias",
            "use_sliding_window",
            "scale_embedding",
            "qkv_bias",
            "do_sample",
        ),
        (lambda value: isinstance(value, bool), "true or false"),
    ),
    **dict.fromkeys(("rope_scaling", "rope_parameters"), (lambda value: isinstance(value, dict), "an object")),
    **dict.fromkeys(
        ("model_type", "hidden_act", "activation_function"), (lambda value: isinstance(value, str), "a string")
    ),
}


# model types whose heads are a list, one number per stage
STAGED_TYPES = ("segformer",)
_PER_STAGE = {"num_attention_heads": _EXPECTED["hidden_sizes"]}


class CheckpointConfig(dict):
    """A checkpoint's config as a dict that knows where it came from (`where`, named in errors): reading
    a field it lacks is a `CheckpointError` naming the file and the field."""

    def __init__(self, fields: dict, where: str):
        super().__init__(fields)
        self.where = where

    def __missing__(self, field: str):
        raise CheckpointError(
            f"{self.where} lacks the field {field!r}, which a {self.get('model_type')!r} checkpoint needs."
        )

    def part(self, field: str) -> CheckpointConfig:
        """A nested object (`rope_scaling`) as a `CheckpointConfig` of its own."""
        return CheckpointConfig(self.get(field) or {}, f"{self.where} ({field})")


def checkpoint_config(fields, where: str) -> CheckpointConfig:
    """`fields` (a parsed `config.json`) checked field by field; `where` names it in errors."""
    if not isinstance(fields, dict):
        raise CheckpointError(f"{where} must hold a JSON object; it holds {type(fields).__name__}.")
    expectations = {**_EXPECTED, **_PER_STAGE} if fields.get("model_type") in STAGED_TYPES else _EXPECTED
    for field, (check, expected) in expectations.items():
        value = fields.get(field)
        if value is not None and not check(value):
            raise CheckpointError(f"{where}: the field {field!r} must be {expected}; it is {value!r}.")
    return CheckpointConfig(fields, where)
