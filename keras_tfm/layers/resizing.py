"""Resizing maps exactly as PyTorch's `interpolate` does where Keras' `ops.image.resize` differs: bilinear with
`align_corners=True` (DPT's and Depth Anything's necks and heads), bilinear at any size, and bicubic with A = -0.75 (transformers'
depth post-processing). Each is a matrix per axis, so the result is the same on every backend."""

from __future__ import annotations

from keras import ops

from keras_tfm.layers.positions import bicubic_resize_matrix


def aligned_corners_matrix(in_size, out_size):
    """`(out_size, in_size)` matrix of PyTorch's bilinear `interpolate(..., align_corners=True)`: output `i`
    samples input `i * (in_size - 1) / (out_size - 1)`, so the corners stay where they are."""
    step = ops.cast(in_size - 1, "float32") / ops.cast(ops.maximum(out_size - 1, 1), "float32")
    source = ops.cast(ops.arange(out_size), "float32") * step
    left = ops.minimum(ops.floor(source), ops.cast(ops.maximum(in_size - 2, 0), "float32"))
    fraction = (source - left)[:, None]
    left = ops.cast(left, "int32")
    right = ops.minimum(left + 1, in_size - 1)
    return ops.one_hot(left, in_size) * (1.0 - fraction) + ops.one_hot(right, in_size) * fraction


def half_pixel_matrix(in_size, out_size):
    """`(out_size, in_size)` matrix of PyTorch's bilinear `interpolate(..., align_corners=False)` without
    antialiasing: output `i` samples input `(i + 0.5) * in_size / out_size - 0.5`, clamped at the edges."""
    scale = ops.cast(in_size, "float32") / ops.cast(out_size, "float32")
    source = ops.maximum((ops.cast(ops.arange(out_size), "float32") + 0.5) * scale - 0.5, 0.0)
    left = ops.minimum(ops.floor(source), ops.cast(in_size - 1, "float32"))
    fraction = (source - left)[:, None]
    left = ops.cast(left, "int32")
    right = ops.minimum(left + 1, in_size - 1)
    return ops.one_hot(left, in_size) * (1.0 - fraction) + ops.one_hot(right, in_size) * fraction


MATRICES = {"aligned_corners": aligned_corners_matrix, "bilinear": half_pixel_matrix, "bicubic": bicubic_resize_matrix}


def resize_maps(maps, size, method: str = "aligned_corners"):
    """`(batch, height, width, channels)` -> `(batch, *size, channels)`, resized as PyTorch's `interpolate` does:
    bilinear with aligned corners ("aligned_corners"), bilinear without ("bilinear", no antialiasing), or bicubic
    ("bicubic", A = -0.75, `align_corners=False`). `size` may hold tensors (a traced function's unknown sizes)."""
    height, width = ops.shape(maps)[1], ops.shape(maps)[2]
    make = MATRICES[method]
    rows, cols = (ops.cast(make(old, new), maps.dtype) for old, new in ((height, size[0]), (width, size[1])))
    maps = ops.einsum("hH,bHwc->bhwc", rows, maps)
    return ops.einsum("wW,bhWc->bhwc", cols, maps)
