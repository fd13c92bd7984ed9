"""Rotary positions (RoPE): each pair of query/key features is rotated by an angle proportional to
the token's position, so that the dot product q_m . k_n depends on m - n only.

    angle[p, i] = p * inv_freq[i],   inv_freq[i] = theta^(-2i / d)      (d: the rotated features)
    x' = x * cos(angle) + rotate_half(x) * sin(angle)

The features are paired as Hugging Face's Llama pairs them: feature i with feature i + d/2
("rotate half"), not adjacent features. The scalings stretch the frequencies for contexts longer than
the training one, as the checkpoints that use them define it (transformers' `rope_type`).
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.positions import is_per_row

SCALINGS = ("linear", "llama3", "dynamic", "yarn")


def _inverse_frequencies(dim: int, theta: float) -> np.ndarray:
    # float32 as transformers computes them, so that angles agree to the last bit
    return (1.0 / (np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))).astype("float32")


def _llama3(inv_freq, factor, low_frequency_factor, high_frequency_factor, original_max_length):
    low_wavelength = original_max_length / low_frequency_factor
    high_wavelength = original_max_length / high_frequency_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = np.where(wavelength > low_wavelength, inv_freq / factor, inv_freq)
    smooth = (original_max_length / wavelength - low_frequency_factor) / (high_frequency_factor - low_frequency_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return np.where(medium, smoothed, scaled).astype("float32")


def _yarn(dim, theta, factor, original_max_length, beta_fast, beta_slow, truncate):
    def correction_dim(rotations):
        return (dim * math.log(original_max_length / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: keep the frequency (high frequencies), 0: interpolate it
    frequencies = np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    inv_freq = (1.0 / (factor * frequencies)) * (1 - extrapolation) + (1.0 / frequencies) * extrapolation
    return inv_freq.astype("float32")


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's default scale of cos and sin (`0.1 ln(factor) + 1`; DeepSeek's ratio with `mscale`)."""

    def get(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return float(get(factor, mscale) / get(factor, mscale_all_dim))
    return get(factor)


@keras.saving.register_keras_serializable(package="keras_tfm")
class RotaryEmbedding(keras.layers.Layer):
    """Rotates queries or keys by their positions (RoPE), with the context-extension scalings of
    Llama 3, Qwen and Mistral checkpoints.

    Args:
        max_wavelength: `theta`, the base of the frequencies (Hugging Face's `rope_theta`).
        rotary_fraction: the fraction of each head's features that is rotated (the first ones; the
            rest pass unchanged): `partial_rotary_factor`.
        scaling: None (plain RoPE), "linear" (positions divided by `scaling_factor`), "llama3"
            (Llama 3.1: low frequencies divided by `scaling_factor`, high ones kept, a smooth blend
            between), "dynamic" (NTK: the base grows once the sequence is longer than
            `original_max_length`) or "yarn" (YaRN: interpolation blended by frequency, cos and sin
            scaled by `attention_factor`).
        scaling_factor: how much longer the context becomes (`factor`).
        original_max_length: the context the model was trained with
            (`original_max_position_embeddings`; for "dynamic", `max_position_embeddings`).
        low_frequency_factor, high_frequency_factor: "llama3"'s wavelength bounds.
        beta_fast, beta_slow, truncate: "yarn"'s correction range.
        attention_factor: "yarn"'s scale of cos and sin; None: `0.1 ln(scaling_factor) + 1`.

    Call arguments:
        inputs: `(batch, length, num_heads, head_dim)` queries or keys.
        start_index: position of the first token (an int or scalar tensor), for cached decoding;
            or a `(batch,)` int tensor: each row's own first position.

    The angles are computed in float32 and their cos and sin cast to the compute dtype, as transformers
    does. "dynamic" computes its base from `start_index + length`, as transformers' model does for the
    longest position of a forward pass.

    Example:
    >>> rope = RotaryEmbedding(max_wavelength=500000.0, scaling="llama3", scaling_factor=32.0,
    ...                        original_max_length=8192)
    >>> queries = np.zeros((2, 10, 8, 64), "float32")
    >>> rotated = rope(queries, start_index=5)  # (2, 10, 8, 64): positions 5 ... 14
    """

    def __init__(
        self,
        max_wavelength: float = 10000.0,
        rotary_fraction: float = 1.0,
        scaling: str | None = None,
        scaling_factor: float = 1.0,
        original_max_length: int | None = None,
        low_frequency_factor: float = 1.0,
        high_frequency_factor: float = 4.0,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        truncate: bool = True,
        attention_factor: float | None = None,
        **kwargs,
    ):
        check_arguments("RotaryEmbedding", locals(), optional=("original_max_length", "attention_factor"))
        if scaling is not None and scaling not in SCALINGS:
            raise InputError(
                f"scaling must be None or one of {list(SCALINGS)}; received {scaling!r}.",
                "scaling",
                caller="RotaryEmbedding",
            )
        if scaling in ("llama3", "dynamic", "yarn") and original_max_length is None:
            raise InputError(
                f"scaling={scaling!r} needs original_max_length (the trained context); received None.",
                "original_max_length",
                caller="RotaryEmbedding",
            )
        if scaling == "llama3" and not high_frequency_factor > low_frequency_factor:
            raise InputError(
                f"high_frequency_factor must exceed low_frequency_factor; received "
                f"{high_frequency_factor} and {low_frequency_factor}.",
                "high_frequency_factor",
                caller="RotaryEmbedding",
            )
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength
        self.rotary_fraction = rotary_fraction
        self.scaling = scaling
        self.scaling_factor = scaling_factor
        self.original_max_length = original_max_length
        self.low_frequency_factor = low_frequency_factor
        self.high_frequency_factor = high_frequency_factor
        self.beta_fast = beta_fast
        self.beta_slow = beta_slow
        self.truncate = truncate
        self.attention_factor = attention_factor

    def rotary_dim(self, head_dim: int) -> int:
        dim = int(head_dim * self.rotary_fraction)
        if dim < 2 or dim % 2:
            raise InputError(
                f"head_dim * rotary_fraction must be an even number >= 2; received head_dim="
                f"{head_dim}, rotary_fraction={self.rotary_fraction} ({head_dim * self.rotary_fraction:g} features).",
                caller="RotaryEmbedding",
            )
        return dim

    def inverse_frequencies(self, head_dim: int) -> tuple[np.ndarray, float]:
        """The `(rotary_dim // 2,)` inverse frequencies and the scale of cos and sin (the static
        scalings; "dynamic" starts from the plain frequencies and scales its base per call)."""
        dim = self.rotary_dim(head_dim)
        if self.scaling == "yarn":
            factor = self.scaling_factor
            scale = yarn_attention_factor(factor) if self.attention_factor is None else self.attention_factor
            inv_freq = _yarn(
                dim,
                self.max_wavelength,
                factor,
                self.original_max_length,
                self.beta_fast,
                self.beta_slow,
                self.truncate,
            )
            return inv_freq, scale
        inv_freq = _inverse_frequencies(dim, self.max_wavelength)
        if self.scaling == "linear":
            inv_freq = (inv_freq / np.float32(self.scaling_factor)).astype("float32")
        elif self.scaling == "llama3":
            inv_freq = _llama3(
                inv_freq,
                self.scaling_factor,
                self.low_frequency_factor,
                self.high_frequency_factor,
                self.original_max_length,
            )
        return inv_freq, 1.0

    def cos_sin(self, length, head_dim: int, start_index=0):
        """cos and sin of the angles of positions `start_index ... start_index + length - 1`:
        two `(length, rotary_dim)` float32 tensors (each frequency twice: halves, as Llama); for a
        `(batch,)` `start_index` (each row at its own position), `(batch, length, rotary_dim)`."""
        inv_freq, scale = self.inverse_frequencies(head_dim)
        if is_per_row(start_index):  # (batch, length): each row at its own position
            positions = ops.cast(ops.expand_dims(start_index, 1) + ops.arange(length)[None, :], "float32")
        else:
            positions = ops.cast(ops.arange(length) + start_index, "float32")
        inv_freq = ops.convert_to_tensor(inv_freq)
        if self.scaling == "dynamic":
            dim = self.rotary_dim(head_dim)
            last = ops.max(start_index) if is_per_row(start_index) else start_index
            seen = ops.maximum(ops.cast(last + length, "float32"), float(self.original_max_length))
            base = self.max_wavelength * (
                (self.scaling_factor * seen / self.original_max_length) - (self.scaling_factor - 1)
            ) ** (dim / (dim - 2))
            exponents = ops.convert_to_tensor(np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
            inv_freq = 1.0 / ops.power(base, exponents)
        angles = ops.expand_dims(positions, -1) * inv_freq
        angles = ops.concatenate([angles, angles], axis=-1)
        if scale == 1.0:  # one op less each (PyTorch dispatches every op of a decoding step)
            return ops.cos(angles), ops.sin(angles)
        return ops.cos(angles) * scale, ops.sin(angles) * scale

    def call(self, inputs, start_index=0):
        if len(inputs.shape) != 4:
            raise InputError(
                f"`inputs` must have shape (batch, length, num_heads, head_dim); received shape {tuple(inputs.shape)}.",
                caller="RotaryEmbedding",
            )
        return self.rotate(inputs, self.angles(ops.shape(inputs)[1], inputs.shape[-1], inputs.dtype, start_index))

    def angles(self, length, head_dim: int, dtype, start_index=0) -> tuple:
        """`(cos, sin)` of positions `start_index, ...`, shaped `(1, length, 1, rotary_dim)` in `dtype`
        (`(batch, length, 1, rotary_dim)` for a `(batch,)` `start_index`):
        what `rotate` applies (computed once for the queries and keys of one attention)."""
        cos, sin = self.cos_sin(length, head_dim, start_index)
        if is_per_row(start_index):
            return ops.expand_dims(ops.cast(cos, dtype), 2), ops.expand_dims(ops.cast(sin, dtype), 2)
        return ops.cast(cos, dtype)[None, :, None, :], ops.cast(sin, dtype)[None, :, None, :]

    def rotate(self, inputs, angles: tuple):
        """`inputs` `(batch, length, num_heads, head_dim)` rotated by `angles` (from `angles`)."""
        cos, sin = angles
        dim = cos.shape[-1]
        rotated, passed = (inputs, None) if dim == inputs.shape[-1] else (inputs[..., :dim], inputs[..., dim:])
        first, second = rotated[..., : dim // 2], rotated[..., dim // 2 :]
        rotated = rotated * cos + ops.concatenate([-second, first], axis=-1) * sin
        return rotated if passed is None else ops.concatenate([rotated, passed], axis=-1)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def rotation(self) -> dict:
        """The arguments that set the angles: two layers with equal ones rotate alike."""
        return dict(
            max_wavelength=self.max_wavelength,
            rotary_fraction=self.rotary_fraction,
            scaling=self.scaling,
            scaling_factor=self.scaling_factor,
            original_max_length=self.original_max_length,
            low_frequency_factor=self.low_frequency_factor,
            high_frequency_factor=self.high_frequency_factor,
            beta_fast=self.beta_fast,
            beta_slow=self.beta_slow,
            truncate=self.truncate,
            attention_factor=self.attention_factor,
        )

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(self.rotation())
        return config
