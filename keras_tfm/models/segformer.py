"""SegFormer (Xie et al. 2021): semantic segmentation with a hierarchical transformer and an all-MLP decoder.

image -> 4 stages, each: OverlappingPatchEmbedding (stride 4, then 2) -> MixTransformerBlock x depth -> LayerNorm
      -> feature maps at 1/4, 1/8, 1/16, 1/32 of the image -> AllMLPDecoder -> logits at 1/4 of the image
Everything is channels-last: the logits are `(batch, height / 4, width / 4, num_classes)`, where transformers'
are `(batch, num_classes, height / 4, width / 4)`.
"""

from __future__ import annotations

import math

import keras

from keras_tfm.errors import InputError
from keras_tfm.layers.all_mlp_decoder import AllMLPDecoder
from keras_tfm.layers.arguments import check_arguments, is_integer, is_number
from keras_tfm.layers.mix_transformer_block import MixTransformerBlock
from keras_tfm.layers.overlapping_patch_embedding import OverlappingPatchEmbedding
from keras_tfm.losses import SegmentationCrossEntropy
from keras_tfm.metrics import MeanIoU
from keras_tfm.models.base import ZooModel
from keras_tfm.models.inputs import checked_class_names
from keras_tfm.models.segmentation_tasks import SegmentationTasks

STAGE_ARGUMENTS = ("stage_widths", "stage_depths", "stage_heads", "stage_reduction_ratios", "stage_patch_sizes",
                   "stage_strides", "stage_mlp_ratios")  # fmt: skip


@keras.saving.register_keras_serializable(package="keras_tfm")
class SegFormer(SegmentationTasks, ZooModel):
    """SegFormer: a Mix Transformer encoder (MiT) and its all-MLP decoder, for semantic segmentation.

    Args:
        num_classes: the classes of the decoder's logits (ADE20k's 150 by default).
        stage_widths, stage_depths, stage_heads: each stage's channels, blocks and attention heads.
        stage_reduction_ratios: each stage's spatial reduction of the attention's keys and values (8, 4, 2, 1).
        stage_patch_sizes, stage_strides: each stage's overlapping patch embedding (7 with stride 4, then 3
            with stride 2).
        stage_mlp_ratios: each stage's Mix-FFN width as a multiple of its channels.
        decoder_dim: the decoder's width (256 for B0 and B1, 768 above).
        num_channels: of the input images.
        include_top: False has no decoder: the model gives the last stage's map `(batch, height / 32, width / 32,
            stage_widths[-1])` (transformers' `SegformerModel`), and `feature_maps` gives every stage's.
        dropout, attention_dropout: in the blocks; classifier_dropout: the decoder's, before its classifier.
        drop_path_rate: stochastic depth, rising linearly over all blocks from 0 to this rate.
        layer_norm_epsilon: of every LayerNorm; activation: the Mix-FFN's.
        class_names: the classes' names (default LABEL_0, ...), a checkpoint's `id2label`.

    Call arguments:
        images: `(batch, height, width, num_channels)`, any size.

    Example:
    >>> model = segformer_b0(num_classes=3)
    >>> tuple(model(np.zeros((1, 64, 96, 3), "float32")).shape)
    (1, 16, 24, 3)
    """

    def __init__(
        self,
        num_classes: int = 150,
        stage_widths: tuple = (32, 64, 160, 256),
        stage_depths: tuple = (2, 2, 2, 2),
        stage_heads: tuple = (1, 2, 5, 8),
        stage_reduction_ratios: tuple = (8, 4, 2, 1),
        stage_patch_sizes: tuple = (7, 3, 3, 3),
        stage_strides: tuple = (4, 2, 2, 2),
        stage_mlp_ratios: tuple = (4, 4, 4, 4),
        decoder_dim: int = 256,
        num_channels: int = 3,
        include_top: bool = True,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        classifier_dropout: float = 0.1,
        drop_path_rate: float = 0.1,
        layer_norm_epsilon: float = 1e-5,
        activation: str = "gelu",
        class_names: list[str] | None = None,
        **kwargs,
    ):
        check_arguments("SegFormer", locals(), optional=("class_names",))
        kwargs.setdefault("name", "segformer")
        arguments = locals()
        stages = {name: _stage_list(name, arguments[name]) for name in STAGE_ARGUMENTS}
        _check_stages(stages)
        super().__init__(**kwargs)
        for name, values in stages.items():
            setattr(self, name, values)
        self.num_classes, self.decoder_dim, self.num_channels = num_classes, decoder_dim, num_channels
        self.include_top, self.dropout, self.attention_dropout = include_top, dropout, attention_dropout
        self.classifier_dropout, self.drop_path_rate = classifier_dropout, drop_path_rate
        self.layer_norm_epsilon, self.activation = layer_norm_epsilon, activation
        self.class_names = checked_class_names(class_names, num_classes, "SegFormer") if include_top else None
        self._make_layers()
        self._compile_defaults()

    def _make_layers(self) -> None:
        policy, epsilon = self.dtype_policy, self.layer_norm_epsilon
        total = sum(self.stage_depths)
        self.patch_embeddings, self.blocks, self.stage_norms = [], [], []
        for stage, width in enumerate(self.stage_widths):
            self.patch_embeddings.append(OverlappingPatchEmbedding(
                self.stage_patch_sizes[stage], self.stage_strides[stage], width, epsilon, dtype=policy,
                name=f"patch_embedding_{stage}"))  # fmt: skip
            for _ in range(self.stage_depths[stage]):
                self.blocks.append(MixTransformerBlock(
                    self.stage_heads[stage], int(width * self.stage_mlp_ratios[stage]),
                    self.stage_reduction_ratios[stage], self.activation, self.dropout, self.attention_dropout,
                    self.drop_path_rate * len(self.blocks) / max(total - 1, 1), epsilon, dtype=policy,
                    name=f"block_{len(self.blocks)}"))  # fmt: skip
            self.stage_norms.append(keras.layers.LayerNormalization(epsilon=epsilon, dtype=policy,
                                                                    name=f"stage_norm_{stage}"))  # fmt: skip
        self.decoder = (
            AllMLPDecoder(self.decoder_dim, self.num_classes, self.classifier_dropout, dtype=policy, name="decoder")
            if self.include_top
            else None
        )

    def default_loss(self) -> keras.losses.Loss | None:
        return SegmentationCrossEntropy() if self.include_top else None

    def default_metrics(self) -> list:
        return [MeanIoU(self.num_classes)]

    def _label_range(self) -> tuple[int, str] | None:
        return (self.num_classes, "num_classes") if self.include_top else None

    def build(self, images_shape=None):
        # a symbolic call builds every layer and computes nothing; the side lets each reduction fit its stage
        side = math.prod(self.stage_strides) * max(self.stage_reduction_ratios)
        self.call(keras.KerasTensor((1, side, side, self.num_channels)))
        self.built = True

    def call(self, images, training=None):
        maps = self._feature_maps(images, training)
        return self.decoder(maps, training=training) if self.include_top else maps[-1]

    def feature_maps(self, images, training=None) -> list:
        """Each stage's normalized map `(batch, height / stride, width / stride, width)`, finest first:
        transformers' `hidden_states`, channels-last; what a neck or a dense probe reads."""
        self._build_on_demand()
        return self._feature_maps(images, training)

    def _feature_maps(self, images, training=None) -> list:
        shape = tuple(images.shape)
        if len(shape) != 4 or (shape[-1] is not None and shape[-1] != self.num_channels):
            raise InputError(f"SegFormer expects `images` of shape (batch, height, width, {self.num_channels}); "
                             f"received shape {shape}.")  # fmt: skip
        x, maps, blocks = images, [], iter(self.blocks)
        for stage, depth in enumerate(self.stage_depths):
            x = self.patch_embeddings[stage](x)
            for _ in range(depth):
                x = next(blocks)(x, training=training)
            x = self.stage_norms[stage](x)
            maps.append(x)
        return maps


def _stage_list(name: str, values) -> list:
    if not isinstance(values, (list, tuple)) or not values:
        raise InputError(f"{name} must be a non-empty list with a value per stage; received {values!r}.",
                         caller="SegFormer")  # fmt: skip
    return list(values)


def _check_stages(stages: dict) -> None:
    """Refuses stage lists of different lengths, a value that is not a positive integer (a positive number for
    the MLP ratios), and channels the heads do not divide."""
    lengths = [len(values) for values in stages.values()]
    count = max(set(lengths), key=lengths.count)  # the stages most lists agree on
    for name, values in stages.items():
        if len(values) != count:
            raise InputError(f"{name} must have one value per stage, as the other stage lists ({count}); received "
                             f"{values!r}.", caller="SegFormer")  # fmt: skip
    for name, values in stages.items():
        number = name == "stage_mlp_ratios"
        if not all(_positive(value, number) for value in values):
            expected = "positive numbers" if number else "integers >= 1"
            raise InputError(f"{name} must hold {expected}; received {values!r}.", caller="SegFormer")
    for stage, (width, heads) in enumerate(zip(stages["stage_widths"], stages["stage_heads"])):
        if width % heads:
            raise InputError(f"stage {stage}: stage_widths must be multiples of stage_heads; received width {width} "
                             f"with {heads} heads.", caller="SegFormer")  # fmt: skip


def _positive(value, number: bool) -> bool:
    return (is_number(value) if number else is_integer(value)) and value > 0


# SegFormer's MiT sizes (transformers' `nvidia/mit-b*` and `segformer-b*` checkpoints): channels, depths, decoder
B0_B1 = dict(stage_heads=(1, 2, 5, 8), decoder_dim=256)
WIDE = dict(stage_widths=(64, 128, 320, 512), stage_heads=(1, 2, 5, 8), decoder_dim=768)


def _segformer(defaults: dict, overrides: dict) -> SegFormer:
    return SegFormer(**{**defaults, **overrides})


def segformer_b0(**overrides) -> SegFormer:
    """SegFormer-B0 (MiT-b0): stages 32/64/160/256 wide, 2 blocks each, decoder 256; 3.7M parameters."""
    return _segformer(B0_B1 | dict(stage_widths=(32, 64, 160, 256), stage_depths=(2, 2, 2, 2)), overrides)


def segformer_b1(**overrides) -> SegFormer:
    """SegFormer-B1 (MiT-b1): stages 64/128/320/512 wide, 2 blocks each, decoder 256."""
    return _segformer(B0_B1 | dict(stage_widths=(64, 128, 320, 512), stage_depths=(2, 2, 2, 2)), overrides)


def segformer_b2(**overrides) -> SegFormer:
    """SegFormer-B2 (MiT-b2): 3/4/6/3 blocks, decoder 768."""
    return _segformer(WIDE | dict(stage_depths=(3, 4, 6, 3)), overrides)


def segformer_b3(**overrides) -> SegFormer:
    """SegFormer-B3 (MiT-b3): 3/4/18/3 blocks, decoder 768."""
    return _segformer(WIDE | dict(stage_depths=(3, 4, 18, 3)), overrides)


def segformer_b4(**overrides) -> SegFormer:
    """SegFormer-B4 (MiT-b4): 3/8/27/3 blocks, decoder 768."""
    return _segformer(WIDE | dict(stage_depths=(3, 8, 27, 3)), overrides)


def segformer_b5(**overrides) -> SegFormer:
    """SegFormer-B5 (MiT-b5): 3/6/40/3 blocks, decoder 768."""
    return _segformer(WIDE | dict(stage_depths=(3, 6, 40, 3)), overrides)
