"""The checks of constructor arguments that layers and models share, by argument name.

Every layer and model of the zoo checks its arguments when it is constructed, so that a bad value is
refused with the zoo's own argument name (not Keras' `units` or `output_dim`, nor at the first call
deep inside `fit`). The rule of an argument follows from its name, so one name means one thing
everywhere: `num_layers` is an integer >= 1 wherever it appears.
"""

from __future__ import annotations

import math
import numbers

import keras
import numpy as np

from keras_tfm.errors import InputError


def is_integer(value) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite Python or NumPy number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _integer(minimum: int):
    return f"an integer >= {minimum}", lambda value: is_integer(value) and value >= minimum


def _number(expected: str, within):
    return expected, lambda value: is_number(value) and within(value)


_RATE = _number("a rate in [0, 1)", lambda value: 0.0 <= value < 1.0)
_POSITIVE = _number("a number > 0", lambda value: value > 0.0)
_BOOLEAN = ("True or False", lambda value: isinstance(value, (bool, np.bool_)))


def _known_to(get):
    def holds(value) -> bool:
        try:
            return get(value) is not None
        except (ValueError, TypeError):
            return False

    return holds


_ACTIVATION = (
    "a Keras activation (a name or a function), 'gelu_approximate' or 'quick_gelu'",
    lambda value: value in ("gelu_approximate", "quick_gelu") or _known_to(keras.activations.get)(value),
)
_INITIALIZER = ("a Keras initializer (a name, a config or an instance)", _known_to(keras.initializers.get))

RULES = {
    **dict.fromkeys(
        (
            "vocabulary_size",
            "source_vocabulary_size",
            "target_vocabulary_size",
            "max_length",
            "num_layers",
            "num_encoder_layers",
            "num_decoder_layers",
            "num_heads",
            "key_dim",
            "value_dim",
            "output_dim",
            "hidden_dim",
            "intermediate_dim",
            "projection_dim",
            "embedding_dim",
            "num_classes",
            "image_size",
            "patch_size",
            "num_channels",
            "num_key_value_heads",
            "head_dim",
            "sliding_window",
            "original_max_length",
            "local_attention",
            "global_attention_every",
            "reduction_ratio",
            "stride",
            "decoder_dim",
            "decoder_layers",
            "decoder_heads",
            "decoder_intermediate_dim",
            "grid_size",
            "patch_dim",
            "num_detection_tokens",
            "mlp_layers",
            "fusion_dim",
        ),
        _integer(1),
    ),
    **dict.fromkeys(
        ("pad_token_id", "start_token_id", "end_token_id", "position_offset", "num_segments", "num_register_tokens"),
        _integer(0),
    ),
    **dict.fromkeys(("dropout", "attention_dropout", "classifier_dropout", "drop_path_rate"), _RATE),
    **dict.fromkeys(("distillation_token", "mask_token", "position_antialias", "use_class_token", "causal"), _BOOLEAN),
    **dict.fromkeys(
        (
            "layer_norm_epsilon",
            "head_layer_norm_epsilon",
            "max_wavelength",
            "query_key_norm_epsilon",
            "low_frequency_factor",
            "high_frequency_factor",
            "beta_fast",
            "beta_slow",
            "attention_factor",
            "global_rope_theta",
            "local_rope_theta",
            "layer_scale_init",
            "norm_epsilon",
            "max_depth",
        ),
        _POSITIVE,
    ),
    "scaling_factor": _number("a number >= 1", lambda value: value >= 1.0),
    "rotary_fraction": _number("a fraction in (0, 1]", lambda value: 0.0 < value <= 1.0),
    "mask_ratio": _number("a fraction in (0, 1)", lambda value: 0.0 < value < 1.0),
    "rotary_embedding": ("a dict of RotaryEmbedding arguments", lambda value: isinstance(value, dict)),
    **dict.fromkeys(("activation", "head_activation", "pooler_activation"), _ACTIVATION),
    **dict.fromkeys(("initializer", "kernel_initializer", "bias_initializer", "embeddings_initializer"), _INITIALIZER),
    **dict.fromkeys(
        (
            "remat",
            "tie_embeddings",
            "include_top",
            "norm_first",
            "share_embeddings",
            "scale_embeddings",
            "use_output_bias",
            "use_bias",
            "norm_center",
            "patch_bias",
            "norm_before_blocks",
            "mask_zero",
            "interleave",
            "use_cross_attention",
            "truncate",
            "output_use_bias",
            "gated_feed_forward",
            "attention_use_bias",
            "attention_output_use_bias",
            "feed_forward_use_bias",
            "query_key_norm",
            "norm_use_bias",
            "normalize_attention_input",
            "normalize_targets",
            "mid_position_embeddings",
            "normalize_features",
        ),
        _BOOLEAN,
    ),
}


def check_arguments(owner: str, arguments: dict, optional: tuple = ()) -> None:
    """Refuses the first value of `arguments` that breaks the rule of its name (`RULES`), with an
    `InputError` that names `owner` (its `caller`), the argument, what was expected and what came; the names in
    `optional` may also be `None` (their defaults)."""
    for name, value in arguments.items():
        if name not in RULES or (value is None and name in optional):
            continue
        expected, holds = RULES[name]
        if not holds(value):
            raise InputError(
                f"{name} must be {expected}{' or None' if name in optional else ''}; received {value!r}.", caller=owner
            )
