"""Overlapping patch embedding (SegFormer's, from PVT v2): a strided convolution whose kernel is larger than
its stride, so that neighbouring patches share pixels, then a LayerNorm. It keeps the feature map's layout,
which the next stage of a hierarchical encoder reads."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments


@keras.saving.register_keras_serializable(package="keras_tfm")
class OverlappingPatchEmbedding(keras.layers.Layer):
    """`(batch, height, width, channels)` -> `(batch, ceil(height / stride), ceil(width / stride), hidden_dim)`:
    zero padding of `patch_size // 2` on every side (PyTorch's symmetric padding, which Keras' "same" is not),
    a `patch_size` x `patch_size` convolution with stride `stride`, a LayerNorm.

    Args:
        patch_size: the convolution's kernel side (7 for SegFormer's first stage, 3 after).
        stride: its stride (4, then 2).
        hidden_dim: the channels out.
        layer_norm_epsilon: of the LayerNorm.

    Example:
    >>> embedding = OverlappingPatchEmbedding(patch_size=7, stride=4, hidden_dim=8)
    >>> tuple(embedding(np.zeros((2, 30, 32, 3), "float32")).shape)
    (2, 8, 8, 8)
    """

    def __init__(self, patch_size: int, stride: int, hidden_dim: int, layer_norm_epsilon: float = 1e-5, **kwargs):
        check_arguments("OverlappingPatchEmbedding", locals())
        super().__init__(**kwargs)
        self.patch_size, self.stride, self.hidden_dim = patch_size, stride, hidden_dim
        self.layer_norm_epsilon = layer_norm_epsilon
        policy = self.dtype_policy
        self.projection = keras.layers.Conv2D(hidden_dim, patch_size, strides=stride, dtype=policy, name="projection")
        self.norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy, name="norm")

    def build(self, images_shape):
        if len(images_shape) != 4:
            raise InputError(f"expected images (batch, height, width, channels); received shape "
                             f"{tuple(images_shape)}.", "images", "OverlappingPatchEmbedding")  # fmt: skip
        self.projection.build((None, None, None, images_shape[-1]))
        self.norm.build((None, None, None, self.hidden_dim))
        self.built = True

    def call(self, images):
        pad = self.patch_size // 2
        padded = ops.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        return self.norm(self.projection(padded))

    def compute_output_shape(self, images_shape):
        pad = 2 * (self.patch_size // 2)
        sides = [None if side is None else (side + pad - self.patch_size) // self.stride + 1
                 for side in images_shape[1:3]]  # fmt: skip
        return (images_shape[0], *sides, self.hidden_dim)

    def get_config(self) -> dict:
        return {**super().get_config(), "patch_size": self.patch_size, "stride": self.stride,
                "hidden_dim": self.hidden_dim, "layer_norm_epsilon": self.layer_norm_epsilon}  # fmt: skip
