"""Quantizing while loading: `from_huggingface(..., quantize="int8")` never holds the float model.

Inside `quantized_build(mode)` the layers `model.quantize(mode)` would quantize (Keras' `Dense` and
`Embedding` themselves, and a layer that defines its own `quantize`, as `TokenEmbedding` does) are
built quantized: int8 (or packed int4) weights and their scales from the start, no float kernel. Each
checkpoint array then goes through a float copy of its one layer, which Keras' own `quantize` turns into
the quantized weights, copied into the model's layer: the same values as loading in float and calling
`model.quantize(mode)`, with the float weights of one layer at a time in memory.
"""

from __future__ import annotations

import contextlib
import functools
import gc

import keras
import numpy as np

from keras_tfm.convert import variables

MODES = ("int8", "int4")
_COLLECT: list = []  # gc.collect itself, while `quantized_build` makes Keras' calls to it no-ops
_POLICIES: dict[tuple, str] = {}  # (layer kind, mode, float dtype) -> the policy Keras' quantize gives


def quantizable(layer) -> bool:
    """Whether `model.quantize(...)` quantizes `layer`: it skips subclasses of Keras' layers unless they
    define their own `quantize`."""
    if layer._layers:
        return False
    return type(layer) in (keras.layers.Dense, keras.layers.Embedding) or (
        isinstance(layer, (keras.layers.Dense, keras.layers.Embedding)) and "quantize" in vars(type(layer))
    )


@contextlib.contextmanager
def quantized_build(mode: str | None):
    """Layers that `quantizable` names, built in this block, are built quantized to `mode` (None: as usual)."""
    if mode is None:
        yield
        return
    classes = (keras.layers.Dense, keras.layers.Embedding, keras.layers.ReversibleEmbedding)  # each its own build
    builds = {cls: vars(cls)["build"] for cls in classes}

    def quantized(original):
        @functools.wraps(original)  # Keras names the shapes it passes after build's own arguments
        def build(layer, *args, **kwargs):
            if quantizable(layer) and layer.quantization_mode is None and not getattr(layer, "_probe", False):
                layer.dtype_policy = _quantized_policy(layer, mode)
            return original(layer, *args, **kwargs)

        return build

    for kind in (keras.layers.Dense, keras.layers.Embedding):  # the model's own policy, known before the freeze
        _policy_of(kind, mode, keras.config.dtype_policy())
    for cls in classes:
        cls.build = quantized(builds[cls])
    try:
        with _one_collection_per_layer() as collect:
            _COLLECT.append(collect)
            yield
    finally:
        _COLLECT.clear()
        for cls in classes:
            cls.build = builds[cls]


def _quantized_policy(layer, mode: str) -> str:
    """The dtype policy `layer.quantize(mode)` would give it."""
    kind = keras.layers.Embedding if isinstance(layer, keras.layers.Embedding) else keras.layers.Dense
    return _policy_of(kind, mode, layer.dtype_policy)


def _policy_of(kind, mode: str, source) -> str:
    """The dtype policy Keras' `quantize(mode)` gives a layer of `kind` with policy `source`, read off a
    small one (which also imports what quantizing needs, before `gc.freeze`)."""
    key = (kind, mode, keras.dtype_policies.get(source).name)
    if key not in _POLICIES:
        probe = kind(2, 2, dtype=source) if kind is keras.layers.Embedding else kind(2, dtype=source)
        probe._probe = True  # built float, then quantized as Keras does
        probe.build((None, 2))
        probe.quantize(mode)
        _POLICIES[key] = probe.dtype_policy.name
    return _POLICIES[key]


def assign_quantized(layer, arrays: list, check=lambda index, array, needed: None) -> None:
    """Sets quantized `layer` from the checkpoint's float `arrays` (in the order of the float layer's
    weights): a float copy of the layer takes them and Keras quantizes it; its weights go to `layer`.
    `check(index, array, needed shape)` refuses an array of another shape than its float weight."""
    source = layer.dtype_policy.get_config()["source_name"]  # the float policy it was quantized from
    float_layer = type(layer).from_config({**layer.get_config(), "dtype": source})
    float_layer._probe = True  # built float in `quantized_build`'s block
    if isinstance(layer, keras.layers.Embedding):
        float_layer.build()
    else:
        float_layer.build((None, np.shape(arrays[0])[0]))
    for index, (variable, array) in enumerate(zip(float_layer.weights, arrays)):
        check(index, array, tuple(variable.shape))
        variables.assign(variable, array)
    float_layer.quantize(layer.quantization_mode, type_check=False)
    layer.quantization_config = float_layer.quantization_config  # int4's block size and quantizers
    if hasattr(float_layer, "inputs_quantizer"):  # Keras sets it when building quantized, not in `quantize`
        layer.inputs_quantizer = float_layer.inputs_quantizer
    quantized = {variable.name: variable for variable in float_layer.weights}
    for variable in layer.weights:
        variables.assign(variable, quantized[variable.name].value)
    del float_layer, quantized
    _COLLECT[-1]()  # the float layer lives in reference cycles: freed now, before the next layer's
    if keras.backend.backend() == "jax":  # it computes asynchronously: one layer at a time
        for variable in layer.weights:
            variable.value.block_until_ready()
    variables.return_freed_memory()  # what the C library keeps of the freed buffers


@contextlib.contextmanager
def _one_collection_per_layer():
    """Keras' `__delattr__` runs a full `gc.collect()` for each variable it deletes (0.3 s in a process
    holding a model): quantizing a layer collects once, after it; objects older than the load are frozen
    out of the collections meanwhile (`gc.freeze`), so that each looks at the new ones only."""
    collect = gc.collect
    gc.freeze()
    gc.collect = lambda generation=2: 0
    try:
        yield collect
    finally:
        gc.collect = collect
        gc.unfreeze()
