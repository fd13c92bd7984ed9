"""Positions: without them attention is permutation equivariant. Learned tables and sinusoids.

Every position layer returns only the position vectors, broadcast to the shape of its input; the
caller adds them (`x = x + positions(x)`). `start_index` shifts the positions, so a decoder that
feeds one token at a time (with a key/value cache) gets the position of that token.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.initializers import own_initializer


def is_per_row(start_index) -> bool:
    """Whether `start_index` gives each row its own first position (a `(batch,)` tensor), rather than
    one position for every row (an int or a scalar tensor): the server's rows decode at their own
    positions."""
    return len(getattr(start_index, "shape", ())) == 1


def _sinusoids(positions, dim: int, max_wavelength: float, interleave: bool):
    """sin/cos of `positions` (float, shape (n,)) at `dim // 2` geometric frequencies -> (n, dim)."""
    half = dim // 2
    frequencies = ops.exp(ops.arange(half, dtype="float32") * (-math.log(max_wavelength) * 2.0 / dim))
    angles = ops.expand_dims(positions, -1) * frequencies  # (n, half)
    if interleave:  # "Attention is all you need": dims 2i are sin, 2i+1 are cos
        return ops.reshape(ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1), (-1, 2 * half))
    return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)  # [sin | cos] (Marian, MAE)


@keras.saving.register_keras_serializable(package="keras_tfm")
class LearnedPositionEmbedding(keras.layers.Layer):
    """A trainable table of `max_length` position vectors (BERT, GPT-2, ViT).

    Args:
        max_length: number of positions in the table; longer inputs raise `ValueError`.
        initializer: of the `(max_length, hidden_dim)` table.

    Call arguments:
        inputs: `(batch, length, hidden_dim)`; only its shape is used.
        start_index: position of the first token (an int or scalar tensor), for cached decoding;
            or a `(batch,)` int tensor: each row's own first position.
        positions: `(batch, length)` int, each token's own row of the table (RoBERTa counts a row's
            positions from its first real token, whatever padding comes before); `start_index` is then
            not used.

    Masks: passes the input's Keras mask through unchanged.

    Example:
    >>> x = keras.ops.zeros((2, 10, 32))
    >>> x = x + LearnedPositionEmbedding(max_length=512)(x)
    """

    def __init__(self, max_length: int, initializer="glorot_uniform", **kwargs):
        check_arguments("LearnedPositionEmbedding", locals())
        super().__init__(**kwargs)
        self.max_length = max_length
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_length, inputs_shape[-1]),
            initializer=own_initializer(self.initializer),
        )
        self.built = True

    def call(self, inputs, start_index=0, positions=None):
        if positions is not None:
            return ops.take(ops.cast(self.embeddings, self.compute_dtype), positions, axis=0)
        length = inputs.shape[1]
        if isinstance(length, int) and isinstance(start_index, int) and start_index + length > self.max_length:
            raise InputError(
                f"sequence length {length} starting at position "
                f"{start_index} exceeds max_length={self.max_length}; received `inputs` of shape "
                f"{tuple(inputs.shape)}.",
                caller="LearnedPositionEmbedding",
            )
        table = ops.cast(self.embeddings, self.compute_dtype)
        rows = inputs.shape[0]
        if is_per_row(start_index) and isinstance(rows, int) and start_index.shape[0] not in (None, rows):
            raise InputError(
                f"`start_index` per row must have shape (batch,) = ({rows},); received shape "
                f"{tuple(start_index.shape)}.",
                caller="LearnedPositionEmbedding",
            )
        if is_per_row(start_index):
            positions = ops.take(table, ops.expand_dims(start_index, 1) + ops.arange(ops.shape(inputs)[1])[None, :], 0)
        elif isinstance(length, int):
            positions = ops.slice(table, (start_index, 0), (length, table.shape[-1]))
        else:  # unknown while tracing, or symbolic (JAX export): a slice of it would need `length <= max_length`
            positions = ops.take(table, ops.arange(ops.shape(inputs)[1]) + start_index, axis=0)
        return ops.broadcast_to(positions, ops.shape(inputs))

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            max_length=self.max_length,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config


@keras.saving.register_keras_serializable(package="keras_tfm")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Fixed 1-D sinusoidal positions: `PE[p, 2i] = sin(p / w^(2i/d))`, `PE[p, 2i+1] = cos(...)`.

    Args:
        max_wavelength: `w` above, the longest wavelength (10000 in the original Transformer).
        interleave: True puts sin and cos in alternating dimensions (the formula above);
            False puts all sines first, then all cosines (Marian / fairseq layout).

    Call arguments:
        inputs: `(batch, length, hidden_dim)` with an even `hidden_dim`; only its shape is used.
        start_index: position of the first token, for cached decoding; or a `(batch,)` int tensor: each
            row's own first position.

    Masks: passes the input's Keras mask through unchanged.

    Example:
    >>> x = keras.ops.zeros((2, 10, 32))
    >>> x = x + SinusoidalPositionEncoding()(x)
    """

    def __init__(self, max_wavelength: float = 10000.0, interleave: bool = True, **kwargs):
        check_arguments("SinusoidalPositionEncoding", locals())
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength
        self.interleave = interleave
        self.supports_masking = True

    def build(self, inputs_shape):
        if inputs_shape[-1] is not None and inputs_shape[-1] % 2:
            raise InputError(
                f"SinusoidalPositionEncoding needs an even hidden_dim; received `inputs` of shape "
                f"{tuple(inputs_shape)}."
            )
        self.built = True

    def call(self, inputs, start_index=0):
        length = ops.shape(inputs)[1]
        if is_per_row(start_index):  # (batch, length) positions, sinusoids of each
            positions = ops.cast(ops.expand_dims(start_index, 1) + ops.arange(length)[None, :], "float32")
            encoding = _sinusoids(ops.reshape(positions, (-1,)), inputs.shape[-1], self.max_wavelength, self.interleave)
            encoding = ops.reshape(encoding, ops.shape(inputs))
        else:
            positions = ops.cast(ops.arange(length) + start_index, "float32")
            encoding = _sinusoids(positions, inputs.shape[-1], self.max_wavelength, self.interleave)
        return ops.broadcast_to(ops.cast(encoding, self.compute_dtype), ops.shape(inputs))

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength, interleave=self.interleave)
        return config


@keras.saving.register_keras_serializable(package="keras_tfm")
class SinusoidalPositionEncoding2D(keras.layers.Layer):
    """Fixed 2-D sinusoidal positions for a grid of patches (as in MAE): the first half of each
    vector encodes the row, the second half the column, each with 1-D sin/cos features.

    Args:
        max_wavelength: the longest wavelength of the per-axis sinusoids.

    Call arguments:
        inputs: `(batch, rows * cols, hidden_dim)` patch tokens in raster order (as produced by
            `PatchEmbedding`) together with `grid_shape=(rows, cols)`, or `(batch, rows, cols,
            hidden_dim)`. `hidden_dim` must be a multiple of 4.
        grid_shape: `(rows, cols)` for rank-3 inputs (ints, or scalar tensors).

    Example:
    >>> tokens = keras.ops.zeros((2, 64, 32))  # an 8 x 8 grid
    >>> tokens = tokens + SinusoidalPositionEncoding2D()(tokens, grid_shape=(8, 8))
    """

    def __init__(self, max_wavelength: float = 10000.0, **kwargs):
        check_arguments("SinusoidalPositionEncoding2D", locals())
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength
        self.supports_masking = True

    def call(self, inputs, grid_shape: tuple[int, int] | None = None):
        dim = inputs.shape[-1]
        if dim is None or dim % 4:
            raise InputError(
                f"SinusoidalPositionEncoding2D needs hidden_dim divisible by 4; received `inputs` "
                f"of shape {tuple(inputs.shape)}."
            )
        if len(inputs.shape) == 4:
            rows, cols = ops.shape(inputs)[1], ops.shape(inputs)[2]
        elif len(inputs.shape) == 3:
            if grid_shape is None:
                raise InputError(
                    "rank-3 `inputs` (batch, tokens, hidden_dim) need `grid_shape=(rows, cols)`.",
                    caller="SinusoidalPositionEncoding2D",
                )
            rows, cols = grid_shape
            if all(isinstance(n, int) for n in (rows, cols, inputs.shape[1])) and rows * cols != inputs.shape[1]:
                raise InputError(
                    f"`grid_shape`={tuple(grid_shape)} has "
                    f"{rows * cols} cells but `inputs` has {inputs.shape[1]} tokens.",
                    caller="SinusoidalPositionEncoding2D",
                )
        else:
            raise InputError(
                f"SinusoidalPositionEncoding2D expects rank-3 or rank-4 `inputs`; received shape {tuple(inputs.shape)}."
            )
        half = dim // 2
        row_enc = _sinusoids(ops.arange(rows, dtype="float32"), half, self.max_wavelength, False)
        col_enc = _sinusoids(ops.arange(cols, dtype="float32"), half, self.max_wavelength, False)
        grid = ops.concatenate(
            [
                ops.broadcast_to(row_enc[:, None, :], (rows, cols, half)),
                ops.broadcast_to(col_enc[None, :, :], (rows, cols, half)),
            ],
            axis=-1,
        )
        if len(inputs.shape) == 3:
            grid = ops.reshape(grid, (rows * cols, dim))
        return ops.broadcast_to(ops.cast(grid, self.compute_dtype), ops.shape(inputs))

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength)
        return config


def bicubic_resize_matrix(in_size: int, out_size, antialias: bool = False):
    """`(out_size, in_size)` matrix of PyTorch's bicubic resize (A = -0.75, align_corners=False), or with
    `antialias` of its antialiased one (PIL's filter, A = -0.5, widened by the scale when it shrinks).

    Resizing a grid of position vectors is then `M_rows @ grid @ M_cols^T`, identical on every backend
    and to Hugging Face's `interpolate_pos_encoding`. `out_size` may be a scalar tensor (a size a
    traced function leaves unknown); at `out_size == in_size` the matrix is exactly the identity."""
    if antialias:
        return _antialiased_bicubic_matrix(in_size, out_size)
    a = -0.75
    source = (ops.cast(ops.arange(out_size), "float32") + 0.5) * (in_size / ops.cast(out_size, "float32")) - 0.5
    left = ops.floor(source)
    t = source - left
    weights = [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
    ]
    weights.append(1.0 - weights[0] - weights[1] - weights[2])
    matrix = 0.0
    for k, weight in enumerate(weights):  # neighbours left - 1 ... left + 2, clamped to the edges
        neighbour = ops.clip(ops.cast(left, "int32") - 1 + k, 0, in_size - 1)
        matrix = matrix + ops.one_hot(neighbour, in_size) * weight[:, None]
    return matrix


def bilinear_resize_matrix(in_size: int, out_size):
    """`(out_size, in_size)` matrix of PyTorch's `interpolate(..., mode="bilinear", align_corners=False,
    antialias=True)`, as SigLIP 2 resizes its position table: output `i` weighs input `j` by the triangle filter
    at `(j - (scale * (i + 0.5) - 0.5)) / max(scale, 1)`, each row normalized to sum to 1; the identity at
    `out_size == in_size`."""
    scale = in_size / ops.cast(out_size, "float32")
    centers = (ops.cast(ops.arange(out_size), "float32") + 0.5) * scale - 0.5
    distance = ops.abs(ops.arange(in_size, dtype="float32")[None, :] - centers[:, None]) / ops.maximum(scale, 1.0)
    weights = ops.maximum(1.0 - distance, 0.0)
    return weights / ops.sum(weights, axis=1, keepdims=True)


def _antialiased_bicubic_matrix(in_size: int, out_size):
    """PyTorch's `interpolate(..., mode="bicubic", antialias=True)` as a matrix: output `i` weighs input
    `j` by the cubic filter (A = -0.5) at `(j + 0.5 - scale * (i + 0.5)) / max(scale, 1)`, the weights of
    a row normalized to sum to 1 (the filter's support is what limits each row)."""
    scale = in_size / ops.cast(out_size, "float32")
    centers = (ops.cast(ops.arange(out_size), "float32") + 0.5) * scale
    x = ops.abs((ops.arange(in_size, dtype="float32")[None, :] + 0.5 - centers[:, None]) / ops.maximum(scale, 1.0))
    a = -0.5
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    weights = ops.where(x < 1, near, ops.where(x < 2, far, 0.0))
    return weights / ops.sum(weights, axis=1, keepdims=True)
