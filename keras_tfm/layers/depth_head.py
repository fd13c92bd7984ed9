"""DPT's and Depth Anything's depth head: a fused feature map to one depth per pixel at a given size. A head over
any neck or backbone that gives a feature map."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.resizing import resize_maps

DEPTH_TYPES = ("relative", "metric")


@keras.saving.register_keras_serializable(package="keras_tfm")
class DepthHead(keras.layers.Layer):
    """`(batch, h, w, channels)` -> `(batch, *output_size)` depths: a 3x3 convolution to half the channels, a
    bilinear upsampling (aligned corners) to `output_size`, a 3x3 convolution to `head_dim` channels, ReLU, a 1x1
    convolution to one channel, then ReLU ("relative": disparity, as Depth Anything's relative checkpoints and DPT
    give it) or a sigmoid times `max_depth` ("metric": metres up to `max_depth`).

    Args:
        head_dim: the channels before the last convolution (32 in DPT and Depth Anything).
        depth_type: "relative" or "metric".
        max_depth: the largest depth of a "metric" head (its sigmoid's scale); 1 for "relative".

    Call arguments:
        feature_map: `(batch, h, w, channels)`, channels-last.
        output_size: `(height, width)` of the depths.

    Example:
    >>> head = DepthHead(head_dim=8)
    >>> tuple(head(np.zeros((2, 4, 4, 16), "float32"), output_size=(8, 8)).shape)
    (2, 8, 8)
    """

    def __init__(self, head_dim: int = 32, depth_type: str = "relative", max_depth: float = 1.0, **kwargs):
        check_arguments("DepthHead", {"head_dim": head_dim, "max_depth": max_depth})
        if depth_type not in DEPTH_TYPES:
            raise InputError(f"expected one of {DEPTH_TYPES}; received {depth_type!r}.", "depth_type", "DepthHead")
        super().__init__(**kwargs)
        self.head_dim, self.depth_type, self.max_depth = head_dim, depth_type, max_depth

    def build(self, feature_map_shape, output_size_shape=None):
        channels = feature_map_shape[-1]
        if channels is None or channels < 2:
            raise InputError(f"expected a map with at least 2 channels; received shape {feature_map_shape}.",
                             "feature_map", "DepthHead")  # fmt: skip
        layers = (("convolution_0", channels // 2, 3, channels), ("convolution_1", self.head_dim, 3, channels // 2),
                  ("convolution_2", 1, 1, self.head_dim))  # fmt: skip
        self.convolutions = []
        for name, filters, kernel, inputs in layers:
            layer = keras.layers.Conv2D(filters, kernel, padding="same", dtype=self.dtype_policy, name=name)
            layer.build((None, None, None, inputs))
            self.convolutions.append(layer)
        self.built = True

    def call(self, feature_map, output_size):
        x = resize_maps(self.convolutions[0](feature_map), output_size)
        x = self.convolutions[2](ops.relu(self.convolutions[1](x)))
        x = ops.relu(x) if self.depth_type == "relative" else ops.sigmoid(x) * self.max_depth
        return x[..., 0]

    def compute_output_spec(self, feature_map, output_size=None, training=None):
        # symbolic: JAX's shape tracing would take the sizes for tensors, which the resize matrices cannot be
        return keras.KerasTensor((feature_map.shape[0], *output_size), dtype=self.compute_dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "head_dim": self.head_dim, "depth_type": self.depth_type,
                "max_depth": self.max_depth}  # fmt: skip
