"""Which converter reads, and which exporter writes, each kind of checkpoint: each model type's module
(`gpt2.py`, ...) registers its pair here."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from keras_tfm.compat import sublayers
from keras_tfm.convert.quantized_loading import quantized_build
from keras_tfm.convert.variables import checkpoint_values
from keras_tfm.convert.weights import WeightReader
from keras_tfm.errors import CheckpointError, InputError

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


def exporter(model_class: type | tuple[type, type]):
    """Registers a function `(model, w: WeightWriter) -> config dict` that writes a `model_class`
    model as a checkpoint: its converter's inverse. A classifier's config gives `num_labels`, which
    `save_huggingface` turns into transformers' class names. `model_class` may be a pair (a task model's
    class, its encoder's class): a task over any encoder (`SequenceClassifier(Bert(...), ...)`)."""

    def register(fn):
        _EXPORTERS[model_class] = fn
        return fn

    return register


def exporter_of(model) -> Callable | None:
    """The exporter registered for `model`'s own class (not a subclass's), or for its class over its
    encoder's class, or None."""
    found = _EXPORTERS.get(type(model))
    return found or _EXPORTERS.get((type(model), type(getattr(model, "encoder", None))))


def exported_classes() -> list[str]:
    return [
        f"{key[0].__name__} over {key[1].__name__}" if isinstance(key, tuple) else key.__name__ for key in _EXPORTERS
    ]


def check_head(model, architecture: str, **expected) -> None:
    """Refuses a task model whose head `architecture` cannot hold: each of `expected` is a value of the head
    (`pooling`, `dropout`, `transform`) or of its transform (`activation`, `use_bias`, `norm_epsilon`,
    `norm_center`)."""
    head = model.head
    transform = head.transform_arguments
    for field, want in expected.items():
        if hasattr(head, field) and field != "transform":
            got = getattr(head, field)
        elif field == "transform":
            got = transform
        else:
            got = None if transform is None else head.transform.get_config()[field]
        if got != want:
            raise InputError(f"{architecture}'s head has {field}={want!r}; received {field}={got!r} (of the model's "
                             f"{type(head).__name__}).", "model", caller="save_huggingface")  # fmt: skip


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
