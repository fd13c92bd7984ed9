"""Which converter reads, and which exporter writes, each kind of checkpoint: each model type's module
(`gpt2.py`, ...) registers its pair here."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from keras_tfm.compat import sublayers
from keras_tfm.convert.quantized_loading import quantized_build
from keras_tfm.convert.variables import checkpoint_values
from keras_tfm.convert.weights import WeightReader
from keras_tfm.errors import CheckpointError

_CONVERTERS: dict[str, tuple] = {}
_EXPORTERS: dict[type, Callable] = {}


def converter(*model_types: str, prefixes: tuple[str, ...] = (), rename: Callable[[str], str] = lambda name: name):
    """Registers a function `(config: dict, w: WeightReader, num_classes: int | None) -> keras model`.
    `prefixes`: what task models put before the base model's weight names ("bert." in
    `BertForMaskedLM`); `rename`: maps every weight name first (older checkpoints' names)."""

    def register(fn):
        for model_type in model_types:
            _CONVERTERS[model_type] = (fn, prefixes, rename)
        return fn

    return register


def exporter(model_class: type):
    """Registers a function `(model, w: WeightWriter) -> config dict` that writes a `model_class`
    model as a checkpoint: its converter's inverse. A classifier's config gives `num_labels`, which
    `save_huggingface` turns into transformers' class names."""

    def register(fn):
        _EXPORTERS[model_class] = fn
        return fn

    return register


def exporter_of(model) -> Callable | None:
    """The exporter registered for `model`'s own class (not a subclass's), or None."""
    return _EXPORTERS.get(type(model))


def exported_classes() -> list[str]:
    return [model_class.__name__ for model_class in _EXPORTERS]


def check_model_type(config: dict) -> None:
    if config.get("model_type") not in _CONVERTERS:
        raise CheckpointError(
            f"unsupported model_type {config.get('model_type')!r}; supported: {sorted(_CONVERTERS)}.",
            caller="from_huggingface",
        )


def convert_checkpoint(
    config: dict, weights: dict, num_classes: int | None = None, allow_nan: bool = False, quantize: str | None = None
):
    """(model, the WeightReader that filled it) for a checkpoint's config and weights: the reader
    records which layers each linear module became. `allow_nan`: load weights that hold NaN;
    `quantize`: "int8" or "int4", the layers `model.quantize` quantizes built quantized and set a layer
    at a time (`quantized_loading`)."""
    check_model_type(config)
    convert, prefixes, rename = _CONVERTERS[config["model_type"]]
    w = WeightReader(RenamedWeights(weights, rename), prefixes, config, allow_nan)
    with checkpoint_values(), quantized_build(quantize):
        model = convert(config, w, num_classes)
        unset = [
            layer.path for layer in sublayers(model) if layer.quantization_mode and id(layer) not in w.quantized_layers
        ]
        if unset:  # its initializer's values, quantized, would stand in for weights: refuse instead
            raise CheckpointError(
                f"quantize={quantize!r}: the checkpoint has no weights for {', '.join(unset[:3])}; load it without "
                "`quantize`, then call `model.quantize(...)`.",
                "quantize",
                caller="from_huggingface",
            )
    return model, w


class RenamedWeights(Mapping):
    """`weights` under the names `rename` gives them, each value read only when looked up (a checkpoint's
    weights may be read from disk one at a time)."""

    def __init__(self, weights: Mapping, rename):
        self.weights = weights
        self.names = {rename(name): name for name in weights}

    def __getitem__(self, name: str):
        return self.weights[self.names[name]]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
