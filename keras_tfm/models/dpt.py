"""DPT (Ranftl et al. 2021) and Depth Anything (Yang et al. 2024): dense prediction from a plain ViT.

image -> ViT backbone -> token sequences after blocks `backbone_layers` (final-normed with `normalize_features`)
      -> patch tokens as grids (and the class token) -> DPTNeck: reassembled at 4x, 2x, 1x, 1/2x, fused
      -> head on the finest fused map: DepthHead (depths) or ConvSegmentationHead (class logits)
The backbone, neck and head are constructor arguments, each its own layer with its own config: DINOv2 with
Depth Anything's neck, or a ViT with DPT's. Everything is channels-last: segmentation logits are
`(batch, height, width, num_classes)` (transformers': channels first); depths `(batch, height, width)`.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments, is_integer
from keras_tfm.layers.conv_segmentation_head import ConvSegmentationHead
from keras_tfm.layers.depth_head import DepthHead
from keras_tfm.layers.dpt_neck import DPTNeck
from keras_tfm.losses import AffineInvariantDepthLoss, SegmentationCrossEntropy
from keras_tfm.metrics import MeanIoU
from keras_tfm.models.base import ZooModel
from keras_tfm.models.depth_tasks import DepthTasks
from keras_tfm.models.inputs import checked_class_names
from keras_tfm.models.segmentation_tasks import SegmentationTasks
from keras_tfm.models.vit import ViT, dinov2_base, dinov2_large, dinov2_small, vit_large

HEAD_RESOLUTIONS = ("double", "image")


@keras.saving.register_keras_serializable(package="keras_tfm")
class DPT(DepthTasks, SegmentationTasks, ZooModel):
    """A ViT backbone, DPT's neck and a dense head: depth estimation or semantic segmentation.

    Args:
        backbone: a `ViT` (DINOv2, DeiT, ...) whose `hidden_states` the neck reads.
        neck: a `DPTNeck` with one reassemble width per backbone layer read.
        head: a `DepthHead` (depths) or a `ConvSegmentationHead` (logits).
        backbone_layers: which of the backbone's `hidden_states` the neck reads (0 the embeddings, `i` block `i`'s
            output): DPT-Large's 6, 12, 18, 24; Depth Anything V2 small's 3, 6, 9, 12.
        normalize_features: the backbone's final LayerNorm on each (Depth Anything's DINOv2 backbone), or not (DPT).
        head_resolution: the head's output size: "double" the finest fused map's (DPT's), or "image" the patch grid
            times the patch size (Depth Anything's).
        class_names: a segmentation head's classes' names (a checkpoint's `id2label`).

    Call arguments:
        images: `(batch, height, width, channels)`, sides multiples of the backbone's patch size.

    Example:
    >>> backbone = keras_tfm.ViT(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
    ...                          include_top=False)
    >>> neck = DPTNeck(reassemble_widths=(8, 16), reassemble_factors=(2, 1), fusion_dim=8, readout="ignore")
    >>> model = DPT(backbone, neck, DepthHead(head_dim=4), backbone_layers=(1, 2))
    >>> tuple(model(np.zeros((1, 32, 32, 3), "float32")).shape)
    (1, 32, 32)
    """

    def __init__(self, backbone: ViT, neck: DPTNeck, head: keras.layers.Layer, backbone_layers: tuple = (6, 12, 18, 24),
                 normalize_features: bool = False, head_resolution: str = "double",
                 class_names: list[str] | None = None, **kwargs):  # fmt: skip
        kwargs.setdefault("name", "dpt")
        check_arguments("DPT", {"normalize_features": normalize_features})
        _check_parts(backbone, neck, head, backbone_layers, head_resolution)
        super().__init__(**kwargs)
        self.backbone, self.neck, self.head = backbone, neck, head
        self.backbone_layers, self.normalize_features = list(backbone_layers), normalize_features
        self.head_resolution = head_resolution
        # DPT's neck reads the blocks' outputs as they are: the backbone's final norm is kept (checkpoints hold it)
        # but computes nothing, so it is not trained
        backbone.final_norm.trainable = self.normalize_features
        segmenting = isinstance(head, ConvSegmentationHead)
        if class_names is not None and not segmenting:
            raise InputError(f"a DepthHead has no classes to name; received class_names={class_names!r}.",
                             "class_names", "DPT")  # fmt: skip
        self.class_names = checked_class_names(class_names, head.num_classes, "DPT") if segmenting else None
        self._compile_defaults()

    @property
    def include_top(self) -> bool:
        """Whether the head classifies pixels (what `segment` needs)."""
        return isinstance(self.head, ConvSegmentationHead)

    @property
    def num_classes(self) -> int | None:
        return self.head.num_classes if self.include_top else None

    def default_loss(self) -> keras.losses.Loss:
        """Cross-entropy for a segmentation head; MiDaS's scale-and-shift-invariant loss for relative depths (which
        a relative head's disparity is known up to); the mean absolute error for metric depths."""
        if self.include_top:
            return SegmentationCrossEntropy()
        return AffineInvariantDepthLoss() if self.head.depth_type == "relative" else keras.losses.MeanAbsoluteError()

    def default_metrics(self) -> list:
        return [MeanIoU(self.num_classes)] if self.include_top else []

    def _label_range(self) -> tuple[int, str] | None:
        return (self.num_classes, "num_classes") if self.include_top else None

    def build(self, images_shape=None):
        side = self.backbone.image_size
        self.call(keras.KerasTensor((1, side, side, self.backbone.num_channels)))
        self.built = True

    def call(self, images, training=None):
        patch = self.backbone.patch_size
        rows, cols = ops.shape(images)[1] // patch, ops.shape(images)[2] // patch
        fused = self.neck(*self.backbone_maps(images, training), training=training)[-1]
        if self.head_resolution == "image":
            size = (rows * patch, cols * patch)
        else:
            size = (2 * ops.shape(fused)[1], 2 * ops.shape(fused)[2])
        return self.head(fused, output_size=size, training=training)

    def backbone_maps(self, images, training=None) -> tuple[list, list]:
        """The neck's inputs: the patch tokens of each of `backbone_layers` as a grid `(batch, rows, cols, dim)`, and
        the class tokens `(batch, dim)`."""
        states = self.backbone.hidden_states(images, self.backbone_layers, training=training)
        patch, leading = self.backbone.patch_size, self.backbone.num_leading_tokens
        rows, cols = ops.shape(images)[1] // patch, ops.shape(images)[2] // patch
        maps, class_tokens = [], []
        for layer in self.backbone_layers:
            tokens = self.backbone.final_norm(states[layer]) if self.normalize_features else states[layer]
            maps.append(ops.reshape(tokens[:, leading:], (-1, rows, cols, self.backbone.hidden_dim)))
            class_tokens.append(tokens[:, 0])
        return maps, class_tokens

    def segment(self, images, batch_size: int = 8):
        if not self.include_top:
            raise InputError("this model estimates depth (a DepthHead): use estimate_depth.", caller="segment")
        return super().segment(images, batch_size)


def _check_parts(backbone, neck, head, backbone_layers, head_resolution: str) -> None:
    """Refuses parts of another kind, layers the backbone has not, and a neck with another number of inputs."""
    for name, value, kind in (("backbone", backbone, ViT), ("neck", neck, DPTNeck),
                              ("head", head, (DepthHead, ConvSegmentationHead))):  # fmt: skip
        if not isinstance(value, kind):
            kinds = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise InputError(f"expected a {kinds}; received {value!r}.", name, "DPT")
    layers = list(backbone_layers) if isinstance(backbone_layers, (list, tuple)) else None
    if not layers or not all(is_integer(i) and 0 <= i <= backbone.num_layers for i in layers):
        raise InputError(f"expected a list of layer numbers in [0, {backbone.num_layers}] (the backbone's "
                         f"hidden_states); received {backbone_layers!r}.", "backbone_layers", "DPT")  # fmt: skip
    if len(layers) != len(neck.reassemble_widths):
        raise InputError(f"the neck reassembles {len(neck.reassemble_widths)} maps; received {len(layers)} "
                         f"backbone_layers {layers}.", "backbone_layers", "DPT")  # fmt: skip
    if head_resolution not in HEAD_RESOLUTIONS:
        raise InputError(f"expected one of {HEAD_RESOLUTIONS}; received {head_resolution!r}.", "head_resolution",
                         "DPT")  # fmt: skip


def dpt_large(num_classes: int = 150, **overrides) -> DPT:
    """DPT-Large for segmentation (`Intel/dpt-large-ade`): ViT-L/16 at 384, layers 6/12/18/24, reassembled to
    256/512/1024/1024, fused at 256, ADE20k's 150 classes."""
    backbone = vit_large(image_size=384, include_top=False, layer_norm_epsilon=1e-12, position_interpolation="bilinear")
    neck = DPTNeck((256, 512, 1024, 1024), (4, 2, 1, 0.5), 256, readout="project")
    return DPT(backbone, neck, ConvSegmentationHead(num_classes), **overrides)


def _depth_anything(backbone: ViT, widths: tuple, fusion_dim: int, layers: tuple, overrides: dict) -> DPT:
    neck = DPTNeck(widths, (4, 2, 1, 0.5), fusion_dim, readout="ignore", fusion_upsampling="next_map")
    return DPT(backbone, neck, DepthHead(32), layers, normalize_features=True, head_resolution="image", **overrides)


def depth_anything_v2_small(**overrides) -> DPT:
    """Depth Anything V2 small (relative depth): DINOv2-S/14, layers 3/6/9/12, neck 48/96/192/384, fused at 64."""
    return _depth_anything(dinov2_small(), (48, 96, 192, 384), 64, (3, 6, 9, 12), overrides)


def depth_anything_v2_base(**overrides) -> DPT:
    """Depth Anything V2 base: DINOv2-B/14, layers 3/6/9/12, neck 96/192/384/768, fused at 128."""
    return _depth_anything(dinov2_base(), (96, 192, 384, 768), 128, (3, 6, 9, 12), overrides)


def depth_anything_v2_large(**overrides) -> DPT:
    """Depth Anything V2 large: DINOv2-L/14, layers 5/12/18/24, neck 256/512/1024/1024, fused at 256."""
    return _depth_anything(dinov2_large(), (256, 512, 1024, 1024), 256, (5, 12, 18, 24), overrides)
