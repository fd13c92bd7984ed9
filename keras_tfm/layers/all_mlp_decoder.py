"""SegFormer's all-MLP decoder: each stage's feature map projected to one width, upsampled to the finest map's
size, concatenated, fused and classified per pixel. A head over any encoder that gives feature maps at
several scales."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments


@keras.saving.register_keras_serializable(package="keras_tfm")
class AllMLPDecoder(keras.layers.Layer):
    """A list of channels-last maps, finest first, -> `(batch, height, width, num_classes)` logits at the first
    map's size: `classify(dropout(relu(batch_norm(fuse(concat(upsample(dense_i(map_i)), last stage first))))))`.
    The upsampling is bilinear (PyTorch's `align_corners=False`); fuse and classify are 1x1 convolutions, so
    Dense layers here.

    Args:
        hidden_dim: the width every map is projected to, and the fused map's.
        num_classes: the logits per pixel.
        classifier_dropout: before the classifier (training only).

    Example:
    >>> decoder = AllMLPDecoder(hidden_dim=16, num_classes=3)
    >>> maps = [np.zeros((2, 8, 8, 4), "float32"), np.zeros((2, 4, 4, 6), "float32")]
    >>> tuple(decoder(maps).shape)
    (2, 8, 8, 3)
    """

    def __init__(self, hidden_dim: int, num_classes: int, classifier_dropout: float = 0.1, **kwargs):
        check_arguments("AllMLPDecoder", locals())
        super().__init__(**kwargs)
        self.hidden_dim, self.num_classes, self.classifier_dropout = hidden_dim, num_classes, classifier_dropout

    def build(self, maps_shape):
        if not isinstance(maps_shape, (list, tuple)) or not all(len(shape) == 4 for shape in maps_shape):
            raise InputError(f"expected a list of feature maps (batch, height, width, channels); received shapes "
                             f"{maps_shape!r}.", "maps", "AllMLPDecoder")  # fmt: skip
        policy = self.dtype_policy
        self.projections = [keras.layers.Dense(self.hidden_dim, dtype=policy, name=f"projection_{i}")
                            for i in range(len(maps_shape))]  # fmt: skip
        for projection, shape in zip(self.projections, maps_shape):
            projection.build((None, None, None, shape[-1]))
        self.fuse = keras.layers.Dense(self.hidden_dim, use_bias=False, dtype=policy, name="fuse")
        self.fuse.build((None, None, None, self.hidden_dim * len(maps_shape)))
        # PyTorch's BatchNorm2d: epsilon 1e-5, running averages updated by 0.1 of each batch
        self.batch_norm = keras.layers.BatchNormalization(epsilon=1e-5, momentum=0.9, dtype=policy, name="batch_norm")
        self.batch_norm.build((None, None, None, self.hidden_dim))
        self.dropout = keras.layers.Dropout(self.classifier_dropout, dtype=policy, name="dropout")
        self.classifier = keras.layers.Dense(self.num_classes, dtype=policy, name="classifier")
        self.classifier.build((None, None, None, self.hidden_dim))
        self.built = True

    def call(self, maps, training=None):
        size = tuple(ops.shape(maps[0])[1:3])
        projected = [projection(feature_map) for projection, feature_map in zip(self.projections, maps)]
        upsampled = [projected[0]] + [
            ops.image.resize(x, size, interpolation="bilinear", antialias=False) for x in projected[1:]
        ]
        fused = ops.relu(self.batch_norm(self.fuse(ops.concatenate(upsampled[::-1], axis=-1)), training=training))
        return self.classifier(self.dropout(fused, training=training))

    def compute_output_shape(self, maps_shape):
        return (*tuple(maps_shape[0])[:3], self.num_classes)

    def get_config(self) -> dict:
        return {**super().get_config(), "hidden_dim": self.hidden_dim, "num_classes": self.num_classes,
                "classifier_dropout": self.classifier_dropout}  # fmt: skip
