"""YOLOS (Fang et al. 2021): object detection with a plain ViT and learned detection tokens.

image -> patches (PatchEmbedding) -> [class token, patches, detection tokens] + positions (the patches' resized
      bicubically to the image's grid) -> EncoderBlock x L (with "mid" positions added after each block but the
      last, where the checkpoint has them) -> LayerNorm -> the detection tokens -> DetectionHead
      -> {"logits": (batch, tokens, classes + 1), "pred_boxes": (batch, tokens, 4)}
Images go in channels-last, of any size that is a multiple of the patch; the boxes are fractions of the image.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_tfm.detection import set_prediction_losses
from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments, is_integer
from keras_tfm.layers.blocks import EncoderBlock
from keras_tfm.layers.detection_head import DetectionHead
from keras_tfm.layers.embeddings import PatchEmbedding
from keras_tfm.layers.positions import bicubic_resize_matrix
from keras_tfm.models.base import ZooModel
from keras_tfm.models.detection_tasks import DetectionTasks
from keras_tfm.models.inputs import checked_class_names

LOSS_SETTINGS = ("class_cost", "box_cost", "giou_cost", "no_object_weight", "box_weight", "giou_weight")


@keras.saving.register_keras_serializable(package="keras_tfm")
class YOLOS(DetectionTasks, ZooModel):
    """YOLOS: a ViT whose detection tokens each predict one object (or none).

    Args:
        image_shape: `(height, width)` of the training images; the position table's grid is `side // patch_size`.
        patch_size: side of a square patch.
        num_classes: the object classes (COCO's 91 ids by default); the logits have one more, "no object".
        num_detection_tokens: the tokens that predict objects (100): at most this many per image.
        num_layers, num_heads, hidden_dim, intermediate_dim, num_channels: the encoder.
        mid_position_embeddings: a learned position table added after each block but the last (YOLOS-S and
            larger).
        include_top: False returns the normalized tokens `(batch, 1 + patches + detection tokens, hidden_dim)`.
        dropout, attention_dropout, layer_norm_epsilon, activation: the blocks'.
        class_names: the classes' names (default LABEL_0, ...), a checkpoint's `id2label`.
        loss_settings: the set-prediction loss's costs and weights (`detection.set_prediction_losses`'
            arguments; transformers' defaults).

    Call arguments:
        images: `(batch, height, width, num_channels)`; height and width multiples of `patch_size`.

    `fit(images, {"labels": (batch, objects) int with -1 for padding, "boxes": (batch, objects, 4)})` trains
    with the set-prediction loss; `detect(images)` answers boxes in pixels.

    Example:
    >>> model = YOLOS(image_shape=(32, 48), patch_size=8, num_classes=3, num_detection_tokens=5, num_layers=2,
    ...               num_heads=2, hidden_dim=16)
    >>> outputs = model(np.zeros((1, 32, 48, 3), "float32"))
    >>> tuple(outputs["logits"].shape), tuple(outputs["pred_boxes"].shape)
    ((1, 5, 4), (1, 5, 4))
    """

    def __init__(
        self,
        image_shape: tuple = (512, 864),
        patch_size: int = 16,
        num_classes: int = 91,
        num_detection_tokens: int = 100,
        num_layers: int = 12,
        num_heads: int = 12,
        hidden_dim: int = 768,
        intermediate_dim: int | None = None,
        num_channels: int = 3,
        mid_position_embeddings: bool = True,
        include_top: bool = True,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        layer_norm_epsilon: float = 1e-12,
        activation: str = "gelu",
        class_names: list[str] | None = None,
        loss_settings: dict | None = None,
        **kwargs,
    ):
        check_arguments("YOLOS", locals(), optional=("intermediate_dim", "class_names"))
        kwargs.setdefault("name", "yolos")
        self._check_heads("YOLOS", hidden_dim, num_heads)
        _check_layout(image_shape, patch_size, loss_settings)
        super().__init__(**kwargs)
        self.image_shape, self.patch_size, self.num_classes = tuple(image_shape), patch_size, num_classes
        self.num_detection_tokens, self.num_layers, self.num_heads = num_detection_tokens, num_layers, num_heads
        self.hidden_dim, self.intermediate_dim = hidden_dim, intermediate_dim or 4 * hidden_dim
        self.num_channels, self.mid_position_embeddings = num_channels, mid_position_embeddings
        self.include_top, self.dropout, self.attention_dropout = include_top, dropout, attention_dropout
        self.layer_norm_epsilon, self.activation = layer_norm_epsilon, activation
        self.class_names = checked_class_names(class_names, num_classes, "YOLOS") if include_top else None
        self.loss_settings = dict(loss_settings or {})
        self.grid = (image_shape[0] // patch_size, image_shape[1] // patch_size)
        self._make_layers()
        if keras.backend.backend() == "tensorflow":  # the matching runs on the host: a graph, not XLA
            self.supports_jit = False
        self._compile_defaults()

    def _make_layers(self) -> None:
        policy = self.dtype_policy
        self.patch_embedding = PatchEmbedding(self.patch_size, self.hidden_dim, dtype=policy, name="patch_embedding")
        self.embedding_dropout = keras.layers.Dropout(self.dropout, dtype=policy, name="embedding_dropout")
        self.blocks = [
            EncoderBlock(
                self.num_heads,
                self.intermediate_dim,
                dropout=self.dropout,
                attention_dropout=self.attention_dropout,
                activation=self.activation,
                norm_first=True,
                layer_norm_epsilon=self.layer_norm_epsilon,
                dtype=policy,
                name=f"block_{i}",
            )  # fmt: skip
            for i in range(self.num_layers)
        ]
        self.final_norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=policy,
                                                          name="final_norm")  # fmt: skip
        self.head = DetectionHead(self.num_classes, dtype=policy, name="head") if self.include_top else None

    def default_loss(self) -> None:
        return None  # `compute_loss`: the set-prediction loss of `fit(images, objects)`

    def _compile_defaults(self) -> None:
        if self.include_top:
            self.compile()  # `fit` works at once, as for every model with a task

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        # the targets are objects, not one label per output: Keras' compiled metrics would pair them by name
        return self.get_metrics_result()

    def get_metrics_result(self) -> dict:
        """The loss's tracker and any metric that was updated (the compiled ones, which see no targets, are not)."""
        results = {}
        for metric in (metric for metric in self.metrics if getattr(metric, "built", True)):
            result = metric.result()
            results.update(result if isinstance(result, dict) else {metric.name: result})
        return results

    def build(self, images_shape=None):
        tokens = keras.initializers.TruncatedNormal(stddev=0.02)
        length = 1 + self.grid[0] * self.grid[1] + self.num_detection_tokens
        self.class_token = self.add_weight(name="class_token", shape=(1, 1, self.hidden_dim), initializer=tokens)
        self.detection_tokens = self.add_weight(name="detection_tokens", initializer=tokens,
                                                shape=(1, self.num_detection_tokens, self.hidden_dim))  # fmt: skip
        self.position_table = self.add_weight(name="position_embedding", shape=(length, self.hidden_dim),
                                              initializer=tokens)  # fmt: skip
        self.mid_position_table = (
            self.add_weight(name="mid_position_embedding", shape=(self.num_layers - 1, length, self.hidden_dim),
                            initializer=tokens) if self.mid_position_embeddings and self.num_layers > 1 else None
        )  # fmt: skip
        sides = (side // self.patch_size * self.patch_size for side in self.image_shape)  # the grid's pixels
        self.call(keras.KerasTensor((1, *sides, self.num_channels)))  # builds every layer, computes nothing
        self.built = True

    def positions(self, table, rows, cols):
        """A position table `(..., 1 + patches + detection tokens, dim)` for a grid of `rows` x `cols` patches:
        the patches' part resized bicubically (PyTorch's `align_corners=False`, no antialias), as YOLOS does."""
        detection = self.num_detection_tokens
        if isinstance(rows, int) and isinstance(cols, int) and (rows, cols) == self.grid:
            return table
        grid = ops.reshape(table[..., 1:-detection, :], (*ops.shape(table)[:-2], *self.grid, self.hidden_dim))
        row_matrix, col_matrix = (ops.cast(bicubic_resize_matrix(old, new), table.dtype)
                                  for old, new in zip(self.grid, (rows, cols)))  # fmt: skip
        grid = ops.einsum("rR,cC,...RCd->...rcd", row_matrix, col_matrix, grid)
        patches = ops.reshape(grid, (*ops.shape(table)[:-2], rows * cols, self.hidden_dim))
        return ops.concatenate([table[..., :1, :], patches, table[..., -detection:, :]], axis=-2)

    def call(self, images, training=None):
        tokens = self.encode(images, training)
        return self.head(tokens[:, -self.num_detection_tokens :]) if self.include_top else tokens

    def encode(self, images, training=None):
        """The normalized tokens `(batch, 1 + patches + detection tokens, hidden_dim)`: the class token, the
        patches in raster order, the detection tokens (transformers' `last_hidden_state`)."""
        shape = tuple(images.shape)
        if len(shape) != 4 or (shape[-1] is not None and shape[-1] != self.num_channels):
            raise InputError(f"YOLOS expects `images` of shape (batch, height, width, {self.num_channels}); "
                             f"received shape {shape}.")  # fmt: skip
        rows, cols = ops.shape(images)[1] // self.patch_size, ops.shape(images)[2] // self.patch_size
        patches = self.patch_embedding(images)
        batch, dtype = ops.shape(patches)[0], patches.dtype
        extra = [ops.broadcast_to(ops.cast(w, dtype), (batch, ops.shape(w)[1], self.hidden_dim))
                 for w in (self.class_token, self.detection_tokens)]  # fmt: skip
        x = ops.concatenate([extra[0], patches, extra[1]], axis=1)
        x = self.embedding_dropout(x + self.positions(ops.cast(self.position_table, dtype), rows, cols)[None],
                                   training=training)  # fmt: skip
        mid = None if self.mid_position_table is None else self.positions(ops.cast(self.mid_position_table, dtype),
                                                                           rows, cols)  # fmt: skip
        for index, block in enumerate(self.blocks):
            x = block(x, training=training)
            if mid is not None and index < self.num_layers - 1:
                x = x + mid[index][None]
        return self.final_norm(x)

    def check_targets(self, y, argument: str) -> None:
        """Refuses, naming `argument`, targets that are not `{"labels": (batch, objects) ints in [-1,
        num_classes), "boxes": (batch, objects, 4) in [0, 1]}`: compiled code would read a class past the logits
        silently (clamped on JAX)."""
        if not isinstance(y, dict) or not {"labels", "boxes"} <= set(y):
            raise InputError("expected targets {'labels': (batch, objects) int, -1 for padding, 'boxes': (batch, "
                             f"objects, 4)}}; received {type(y).__name__}.", argument, "YOLOS.fit")  # fmt: skip
        labels, boxes = (np.asarray(y[key]) if isinstance(y[key], (np.ndarray, list)) else None for key in
                         ("labels", "boxes"))  # fmt: skip
        if labels is not None and labels.size and (labels.min() < -1 or labels.max() >= self.num_classes):
            raise InputError(f"labels must be class ids in [0, num_classes={self.num_classes}), or -1 for padding; "
                             f"received values in [{labels.min()}, {labels.max()}].", argument, "YOLOS.fit")  # fmt: skip
        if labels is not None and boxes is not None and boxes.shape != (*labels.shape, 4):
            raise InputError(f"boxes must be (batch, objects, 4), one per label {labels.shape}; received shape "
                             f"{boxes.shape}.", argument, "YOLOS.fit")  # fmt: skip

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The loss of `fit(images, {"labels", "boxes"})`: `detection.set_prediction_losses`' total."""
        if not isinstance(y, dict) or not {"labels", "boxes"} <= set(y):
            raise InputError("expected targets {'labels': (batch, objects) int, -1 for padding, 'boxes': (batch, "
                             f"objects, 4)}}; received {type(y).__name__}.", "y", "YOLOS.fit")  # fmt: skip
        settings = {name: self.loss_settings[name] for name in LOSS_SETTINGS if name in self.loss_settings}
        return set_prediction_losses(y_pred["logits"], y_pred["pred_boxes"], y["labels"], y["boxes"],
                                     **settings)["loss"]  # fmt: skip


def _check_layout(image_shape, patch_size: int, loss_settings) -> None:
    if not (isinstance(image_shape, (list, tuple)) and len(image_shape) == 2 and all(
            is_integer(side) and side >= 1 for side in image_shape)):  # fmt: skip
        raise InputError(f"expected (height, width), two integers >= 1; received {image_shape!r}.", "image_shape",
                         "YOLOS")  # fmt: skip
    if loss_settings is not None and not (isinstance(loss_settings, dict) and set(loss_settings) <= set(LOSS_SETTINGS)):
        raise InputError(f"expected a dict of {', '.join(LOSS_SETTINGS)}; received {loss_settings!r}.",
                         "loss_settings", "YOLOS")  # fmt: skip


def _yolos(defaults: dict, overrides: dict) -> YOLOS:
    return YOLOS(**{**defaults, **overrides})


def yolos_tiny(**overrides) -> YOLOS:
    """YOLOS-Ti (`hustvl/yolos-tiny`): DeiT-Ti's encoder, 12 layers, 3 heads, 192 wide; trained at 800 x 1333."""
    tiny = dict(image_shape=(800, 1333), num_layers=12, num_heads=3, hidden_dim=192, intermediate_dim=768,
                mid_position_embeddings=False)  # fmt: skip
    return _yolos(tiny, overrides)


def yolos_small(**overrides) -> YOLOS:
    """YOLOS-S (`hustvl/yolos-small`): DeiT-S's encoder, 12 layers, 6 heads, 384 wide, mid positions."""
    return _yolos(dict(num_layers=12, num_heads=6, hidden_dim=384, intermediate_dim=1536), overrides)


def yolos_base(**overrides) -> YOLOS:
    """YOLOS-B (`hustvl/yolos-base`): 12 layers, 12 heads, 768 wide, mid positions."""
    return _yolos(dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072), overrides)
