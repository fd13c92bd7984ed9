"""DPT's neck (Ranftl et al. 2021), also Depth Anything's: a plain ViT's token maps from several depths become a
pyramid of feature maps (reassembled), which are fused from the coarsest to the finest by residual convolution
units. A neck over any backbone that gives same-size maps from several layers."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments, is_integer, is_number
from keras_tfm.layers.resizing import resize_maps

READOUTS = ("ignore", "add", "project")
FUSION_UPSAMPLINGS = ("double", "next_map")


@keras.saving.register_keras_serializable(package="keras_tfm")
class DPTNeck(keras.layers.Layer):
    """Maps `[(batch, rows, cols, dim)] * n` (a backbone's patch tokens at `n` depths, as grids) -> `n` fused maps
    `(batch, h_i, w_i, fusion_dim)`, the coarsest first; a head reads the last, the finest.

    Reassembly: each map takes the class token in as `readout` says, is projected to `reassemble_widths[i]`
    channels and resized by `reassemble_factors[i]` (a transposed convolution up, a strided 3x3 convolution down),
    then a 3x3 convolution brings it to `fusion_dim`. Fusion: from the coarsest, each map passes a residual
    convolution unit (ReLU, 3x3, ReLU, 3x3, plus its input) and is added to the map fused so far, which passes a
    second unit, is upsampled bilinearly (aligned corners) and projected (1x1).

    Args:
        reassemble_widths: the channels of each reassembled map (transformers' `neck_hidden_sizes`).
        reassemble_factors: each map's resize (4, 2, 1, 0.5: DPT's and Depth Anything's).
        fusion_dim: the fused maps' channels (`fusion_hidden_size`).
        readout: how the class token joins the patches: "ignore" (Depth Anything), "add", or "project" (DPT's:
            concatenated to each patch, then a Dense layer with `activation`).
        fusion_upsampling: "double" (DPT: every fused map upsampled 2x), or "next_map" (Depth Anything: to the
            next map's size, the last 2x).
        activation: the readout projection's.

    Call arguments:
        maps: the list of `(batch, rows, cols, dim)` grids.
        class_tokens: the list of `(batch, dim)` class tokens at the same depths (readout "add" and "project").

    Example:
    >>> neck = DPTNeck(reassemble_widths=(4, 8), reassemble_factors=(2, 1), fusion_dim=8, readout="ignore")
    >>> fused = neck([np.zeros((1, 3, 3, 16), "float32")] * 2)
    >>> len(fused), tuple(fused[-1].shape)  # the coarsest first, each doubled
    (2, (1, 12, 12, 8))
    """

    def __init__(self, reassemble_widths: tuple = (256, 512, 1024, 1024), reassemble_factors: tuple = (4, 2, 1, 0.5),
                 fusion_dim: int = 256, readout: str = "project", fusion_upsampling: str = "double",
                 activation: str = "gelu", **kwargs):  # fmt: skip
        check_arguments("DPTNeck", {"fusion_dim": fusion_dim, "activation": activation})
        _check_neck(list(reassemble_widths), list(reassemble_factors), readout, fusion_upsampling)
        super().__init__(**kwargs)
        self.reassemble_widths, self.reassemble_factors = list(reassemble_widths), list(reassemble_factors)
        self.fusion_dim, self.readout, self.fusion_upsampling = fusion_dim, readout, fusion_upsampling
        self.activation = activation

    def build(self, maps_shape, class_tokens_shape=None):
        if not isinstance(maps_shape, (list, tuple)) or len(maps_shape) != len(self.reassemble_widths):
            raise InputError(f"expected a list of {len(self.reassemble_widths)} maps (one per reassemble width); "
                             f"received shapes {maps_shape!r}.", "maps", "DPTNeck")  # fmt: skip
        dim = maps_shape[0][-1]
        self.readouts, self.projections, self.resizes, self.convolutions = [], [], [], []
        for i, (width, factor) in enumerate(zip(self.reassemble_widths, self.reassemble_factors)):
            if self.readout == "project":
                self.readouts.append(self._built(self._dense(f"readout_{i}", dim, self.activation), 2 * dim))
            self.projections.append(self._built(self._dense(f"projection_{i}", width), dim))
            self.resizes.append(self._resize_layer(i, width, factor))
            self.convolutions.append(self._built(self._convolution(f"convolution_{i}", use_bias=False), width))
        # fusion layer i: units a and b (two 3x3 convolutions each) and a 1x1 projection; the first layer has no
        # map fused before it, so its unit a is never used: kept, frozen, as the checkpoints hold it
        self.fusion_units = [[self._built(self._convolution(f"fusion_{i}_unit_{unit}_{k}", trainable=i > 0 or
                                                            unit == "b"), self.fusion_dim) for k in (0, 1)]
                             for i in range(len(self.reassemble_widths)) for unit in "ab"]  # fmt: skip
        self.fusion_projections = [self._built(self._dense(f"fusion_{i}_projection", self.fusion_dim), self.fusion_dim)
                                   for i in range(len(self.reassemble_widths))]  # fmt: skip
        self.built = True

    def _built(self, layer, channels: int):
        layer.build((None, None, None, channels))
        return layer

    def _dense(self, name: str, units: int, activation=None):
        return keras.layers.Dense(units, activation=activation, dtype=self.dtype_policy, name=name)

    def _convolution(self, name: str, use_bias: bool = True, trainable: bool = True):
        return keras.layers.Conv2D(self.fusion_dim, 3, padding="same", use_bias=use_bias, trainable=trainable,
                                   dtype=self.dtype_policy, name=name)  # fmt: skip

    def _resize_layer(self, i: int, width: int, factor):
        if factor > 1:
            return self._built(keras.layers.Conv2DTranspose(width, int(factor), strides=int(factor),
                                                            dtype=self.dtype_policy, name=f"resize_{i}"), width)  # fmt: skip
        if factor < 1:  # PyTorch's padding=1 on every side, which "same" is not at stride 2
            return self._built(keras.layers.Conv2D(width, 3, strides=round(1 / factor), dtype=self.dtype_policy,
                                                   name=f"resize_{i}"), width)  # fmt: skip
        return None

    def call(self, maps, class_tokens=None):
        if self.readout != "ignore" and class_tokens is None:
            raise InputError(f"readout {self.readout!r} needs the class tokens.", "class_tokens", "DPTNeck")
        reassembled = [self._reassembled(i, x, None if class_tokens is None else class_tokens[i])
                       for i, x in enumerate(maps)]  # fmt: skip
        return self._fused(reassembled[::-1])

    def _reassembled(self, i: int, x, class_token):
        if self.readout == "project":
            token = ops.broadcast_to(class_token[:, None, None, :], ops.shape(x))
            x = self.readouts[i](ops.concatenate([x, ops.cast(token, x.dtype)], axis=-1))
        elif self.readout == "add":
            x = x + ops.cast(class_token[:, None, None, :], x.dtype)
        x = self.projections[i](x)
        if self.reassemble_factors[i] < 1:
            x = ops.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        x = x if self.resizes[i] is None else self.resizes[i](x)
        return self.convolutions[i](x)

    def _fused(self, maps: list) -> list:
        fused, outputs = None, []
        for i, x in enumerate(maps):
            if fused is None:
                fused = x
            else:
                if tuple(x.shape[1:3]) != tuple(fused.shape[1:3]) or None in x.shape[1:3]:
                    x = resize_maps(x, ops.shape(fused)[1:3], "bilinear")
                fused = fused + self._unit(self.fusion_units[2 * i], x)
            fused = self._unit(self.fusion_units[2 * i + 1], fused)
            last = i == len(maps) - 1
            size = ops.shape(maps[i + 1])[1:3] if self.fusion_upsampling == "next_map" and not last else None
            size = size if size is not None else (2 * ops.shape(fused)[1], 2 * ops.shape(fused)[2])
            fused = self.fusion_projections[i](resize_maps(fused, size))
            outputs.append(fused)
        return outputs

    @staticmethod
    def _unit(convolutions: list, x):
        """The pre-activation residual convolution unit."""
        return x + convolutions[1](ops.relu(convolutions[0](ops.relu(x))))

    def get_config(self) -> dict:
        return {**super().get_config(), "reassemble_widths": self.reassemble_widths,
                "reassemble_factors": self.reassemble_factors, "fusion_dim": self.fusion_dim, "readout": self.readout,
                "fusion_upsampling": self.fusion_upsampling, "activation": self.activation}  # fmt: skip


def _check_neck(widths: list, factors: list, readout: str, fusion_upsampling: str) -> None:
    """Refuses widths and factors that are not one per map, and a readout or upsampling the neck has not."""
    if not widths or not all(is_integer(w) and w > 0 for w in widths):
        raise InputError(f"expected a non-empty list of integers >= 1; received {widths!r}.", "reassemble_widths",
                         "DPTNeck")  # fmt: skip
    valid = all(is_number(f) and (f >= 1 and float(f).is_integer() or 0 < f < 1 and (1 / f).is_integer())
                for f in factors)  # fmt: skip
    if len(factors) != len(widths) or not valid:
        raise InputError(f"expected {len(widths)} factors (one per reassemble width), each an integer >= 1 or "
                         f"1/k; received {factors!r}.", "reassemble_factors", "DPTNeck")  # fmt: skip
    for name, value, allowed in (("readout", readout, READOUTS),
                                 ("fusion_upsampling", fusion_upsampling, FUSION_UPSAMPLINGS)):  # fmt: skip
        if value not in allowed:
            raise InputError(f"expected one of {allowed}; received {value!r}.", name, "DPTNeck")
