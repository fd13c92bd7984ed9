"""DPT's segmentation head: a fused feature map to per-pixel class logits through a 3x3 convolution, batch norm and
ReLU, then a 1x1 classifier. A head over any neck or backbone that gives a feature map."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.resizing import resize_maps


@keras.saving.register_keras_serializable(package="keras_tfm")
class ConvSegmentationHead(keras.layers.Layer):
    """`(batch, h, w, channels)` -> `(batch, *output_size, num_classes)` logits: a 3x3 convolution (no bias),
    batch norm, ReLU, dropout, a 1x1 convolution to the classes, then a bilinear upsampling (aligned corners) to
    `output_size` (DPT's twice the map's size).

    Args:
        num_classes: the logits per pixel.
        classifier_dropout: before the classifier (training only).

    Call arguments:
        feature_map: `(batch, h, w, channels)`, channels-last.
        output_size: `(height, width)` of the logits; None keeps the map's.

    Example:
    >>> head = ConvSegmentationHead(num_classes=3)
    >>> tuple(head(np.zeros((2, 4, 4, 16), "float32"), output_size=(8, 8)).shape)
    (2, 8, 8, 3)
    """

    def __init__(self, num_classes: int, classifier_dropout: float = 0.1, **kwargs):
        check_arguments("ConvSegmentationHead", locals())
        super().__init__(**kwargs)
        self.num_classes, self.classifier_dropout = num_classes, classifier_dropout

    def build(self, feature_map_shape, output_size_shape=None):
        channels, policy = feature_map_shape[-1], self.dtype_policy
        self.convolution = keras.layers.Conv2D(channels, 3, padding="same", use_bias=False, dtype=policy,
                                               name="convolution")  # fmt: skip
        # PyTorch's BatchNorm2d: epsilon 1e-5, running averages updated by 0.1 of each batch
        self.batch_norm = keras.layers.BatchNormalization(epsilon=1e-5, momentum=0.9, dtype=policy, name="batch_norm")
        self.dropout = keras.layers.Dropout(self.classifier_dropout, dtype=policy, name="dropout")
        self.classifier = keras.layers.Dense(self.num_classes, dtype=policy, name="classifier")
        for layer in (self.convolution, self.batch_norm, self.classifier):
            layer.build((None, None, None, channels))
        self.built = True

    def call(self, feature_map, output_size=None, training=None):
        x = ops.relu(self.batch_norm(self.convolution(feature_map), training=training))
        logits = self.classifier(self.dropout(x, training=training))
        return logits if output_size is None else resize_maps(logits, output_size)

    def compute_output_spec(self, feature_map, output_size=None, training=None):
        # symbolic: JAX's shape tracing would take the sizes for tensors, which the resize matrices cannot be
        return keras.KerasTensor(
            (feature_map.shape[0], *(output_size or feature_map.shape[1:3]), self.num_classes), dtype=self.compute_dtype
        )

    def get_config(self) -> dict:
        return {**super().get_config(), "num_classes": self.num_classes,
                "classifier_dropout": self.classifier_dropout}  # fmt: skip
