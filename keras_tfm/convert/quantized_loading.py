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

import keras
import numpy as np

from keras_tfm import compat
from keras_tfm.convert import variables
from keras_tfm.errors import InputError

MODES = ("int8", "int4")
BLOCK_BYTES = 32 << 20  # float32 bytes of the part of a layer quantized at once: bounds Keras' temporaries
_COLLECT: list = []  # `collect()` of the open `quantized_build` block
_POLICIES: dict[tuple, str] = {}  # (layer kind, mode, float dtype) -> the policy Keras' quantize gives


def check_mode(quantize, caller: str) -> None:
    """Refuses a `quantize` argument that is neither None nor one of MODES, naming it."""
    if quantize is not None and quantize not in MODES:
        raise InputError(
            f"expected None or one of {', '.join(MODES)}; received {quantize!r}.", "quantize", caller=caller
        )


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
    """Layers that `quantizable` names, built in this block, are built quantized to `mode` (None: as usual).
    Process-wide while open: Keras' layer classes build so in every thread (`compat.builds_wrapped`)."""
    if mode is None:
        yield
        return
    classes = (keras.layers.Dense, keras.layers.Embedding, keras.layers.ReversibleEmbedding)  # each its own build

    def quantized(original):
        def build(layer, *args, **kwargs):
            if quantizable(layer) and layer.quantization_mode is None and not getattr(layer, "_probe", False):
                layer.dtype_policy = _quantized_policy(layer, mode)
            return original(layer, *args, **kwargs)

        return build

    for kind in (keras.layers.Dense, keras.layers.Embedding):  # the model's own policy, known before the freeze
        _policy_of(kind, mode, keras.config.dtype_policy())
    try:
        with (
            compat.builds_wrapped(classes, quantized),
            compat.collections_of_new_objects() as collect,
            compat.configs_without_tensorflow(),
        ):
            _COLLECT.append(collect)
            yield
    finally:
        _COLLECT.clear()


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
    weights). A float copy of the layer takes them and Keras quantizes it; its weights go to `layer`. A
    large layer goes a block of output channels (a `Dense`'s columns, an embedding's rows) at a time:
    Keras' int8 and int4 scales are per channel, so the blocks' values are the whole layer's, while
    Keras' float32 temporaries stay near `BLOCK_BYTES`. `check(index, array, needed shape)` refuses an
    array of another shape than its float weight."""
    config = layer.get_config()
    size_key = next(key for key in ("units", "vocabulary_size", "input_dim") if key in config)
    size = config[size_key]
    float32_bytes = 4 * sum(int(np.size(array)) for array in arrays) // size  # of one channel
    block = min(size, max(2, BLOCK_BYTES // max(float32_bytes, 1) // 2 * 2))  # int4 packs channels in pairs
    values, offsets = {}, {}
    for start in range(0, size, block):
        part = _float_copy(layer, config, size_key, min(block, size - start))
        for index, (variable, array) in enumerate(zip(part.weights, arrays)):
            axis = _channel_axis(layer, variable)
            if start == 0:
                check(index, array, tuple(variable.shape[:axis]) + (size,) + tuple(variable.shape[axis + 1 :]))
            channels = array[(slice(None),) * axis + (slice(start, start + block),)]
            variables.assign(variable, np.ascontiguousarray(channels))
        part.quantize(layer.quantization_mode, type_check=False)
        layer.quantization_config = part.quantization_config  # int4's block size and quantizers
        if hasattr(part, "inputs_quantizer"):  # Keras sets it when building quantized, not in `quantize`
            layer.inputs_quantizer = part.inputs_quantizer
        for variable in part.weights:
            _place(values, offsets, variable, layer)
        del part, variable
        _COLLECT[-1]()  # the float copy lives in reference cycles: freed before the next
    for variable in layer.weights:
        if variable.name in values:
            variables.assign(variable, values.pop(variable.name))
    if keras.backend.backend() == "jax":  # it computes asynchronously: one layer at a time
        for variable in layer.weights:
            variable.value.block_until_ready()
    variables.return_freed_memory()  # what the C library keeps of the freed buffers


def _channel_axis(layer, variable) -> int:
    """The axis of `variable`'s output channels, float or quantized: a `Dense`'s last (kernels (in, out),
    scales (out,) or (groups, out)), an embedding's rows, which its untied reverse projection has last."""
    if isinstance(layer, keras.layers.Dense) or variable.name.startswith("reverse_"):
        return len(variable.shape) - 1
    return 0


def _float_copy(layer, config: dict, size_key: str, channels: int):
    """A built float copy of quantized `layer` (`config`: its config) with `channels` output channels."""
    source = layer.dtype_policy.get_config()["source_name"]  # the float policy it was quantized from
    copy = type(layer).from_config({**config, "dtype": source, size_key: channels})
    copy._probe = True  # built float in `quantized_build`'s block
    if isinstance(copy, keras.layers.Embedding):
        copy.build()
    else:
        copy.build((None, layer._kernel.shape[0]))  # int8 and packed int4 kernels keep the input axis
    return copy


def _place(values: dict, offsets: dict, variable, layer) -> None:
    """Puts a block's quantized `variable` into the layer's, after the channels placed so far: in place
    where the backend allows it, else into `values[variable.name]`, the whole value (a block of every
    channel is the whole value)."""
    part, axis = variable.value, _channel_axis(layer, variable)
    target = next(weight for weight in layer.weights if weight.name == variable.name)
    if tuple(part.shape) == tuple(target.shape):
        values[variable.name] = part
        return
    part = keras.ops.convert_to_numpy(part)
    start = offsets.get(variable.name, 0)
    index = (slice(None),) * axis + (slice(start, start + part.shape[axis]),)
    offsets[variable.name] = start + part.shape[axis]
    if variables.assign_part(target, index, part):
        return
    if start == 0:
        values[variable.name] = np.empty(tuple(target.shape), part.dtype)
    values[variable.name][index] = part
