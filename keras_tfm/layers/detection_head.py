"""A set-prediction detection head (DETR's, YOLOS's): each query token's class logits, "no object" last, and its
box, through two small MLPs. A head over any encoder whose tokens each stand for one object."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.layers.arguments import check_arguments


@keras.saving.register_keras_serializable(package="keras_tfm")
class DetectionHead(keras.layers.Layer):
    """Query tokens `(batch, queries, dim)` -> `{"logits": (batch, queries, num_classes + 1), "pred_boxes":
    (batch, queries, 4)}`. Each is an MLP of `mlp_layers` Dense layers as wide as the input, ReLU between; the
    boxes are `(center_x, center_y, width, height)` as fractions of the image, through a sigmoid.

    Args:
        num_classes: the object classes; the logits have one more, the last, for "no object".
        mlp_layers: Dense layers of each MLP (3 in DETR and YOLOS).

    Example:
    >>> head = DetectionHead(num_classes=5)
    >>> outputs = head(np.zeros((2, 10, 16), "float32"))
    >>> tuple(outputs["logits"].shape), tuple(outputs["pred_boxes"].shape)
    ((2, 10, 6), (2, 10, 4))
    """

    def __init__(self, num_classes: int, mlp_layers: int = 3, **kwargs):
        check_arguments("DetectionHead", locals())
        super().__init__(**kwargs)
        self.num_classes, self.mlp_layers = num_classes, mlp_layers

    def build(self, tokens_shape):
        width = tokens_shape[-1]
        self.class_mlp = self._mlp("class", width, self.num_classes + 1)
        self.box_mlp = self._mlp("box", width, 4)
        self.built = True

    def _mlp(self, name: str, width: int, outputs: int) -> list:
        layers = []
        for index in range(self.mlp_layers):
            last = index == self.mlp_layers - 1
            layer = keras.layers.Dense(outputs if last else width, activation=None if last else "relu",
                                       dtype=self.dtype_policy, name=f"{name}_mlp_{index}")  # fmt: skip
            layer.build((None, None, width))
            layers.append(layer)
        return layers

    def call(self, tokens):
        logits, boxes = tokens, tokens
        for layer in self.class_mlp:
            logits = layer(logits)
        for layer in self.box_mlp:
            boxes = layer(boxes)
        return {"logits": logits, "pred_boxes": ops.sigmoid(boxes)}

    def compute_output_shape(self, tokens_shape):
        return {"logits": (*tokens_shape[:-1], self.num_classes + 1), "pred_boxes": (*tokens_shape[:-1], 4)}

    def get_config(self) -> dict:
        return {**super().get_config(), "num_classes": self.num_classes, "mlp_layers": self.mlp_layers}
