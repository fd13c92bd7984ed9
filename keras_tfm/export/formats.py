"""The formats `model.export` writes: Keras' (a TensorFlow SavedModel, LiteRT, ONNX), refused by name
before anything is traced where a backend cannot write one or a package is missing; a SavedModel also
serves the model's endpoints (a decoding loop, `export.decoding`), and a LiteRT or ONNX file may hold one
endpoint alone (a causal LM's cached step)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import NamedTuple

import keras

from keras_tfm import compat
from keras_tfm.errors import InputError
from keras_tfm.export import onnx_ops

# Each format and what the backends that cannot write it lack (checked with every family at dynamic
# batch and length, each artifact run in its own runtime).
CANNOT = {
    "tf_saved_model": {"torch": "torch.export rejects the models' dynamic shapes"},
    "onnx": {
        "jax": "Keras' jax2onnx route cannot trace the models at a length that is not fixed",
        "torch": "torch.onnx cannot export Keras' layer normalization at a dynamic batch and length",
    },
    "litert": {
        "jax": "Keras converts to LiteRT from TensorFlow graphs",
        "torch": "Keras' litert-torch route is not checked with these models",
    },
}
# The packages a format needs beyond the backend (the `export` extra).
PACKAGES = {"tf_saved_model": ("tensorflow",), "litert": ("tensorflow",), "onnx": ("tensorflow", "tf2onnx", "onnx")}


class Endpoint(NamedTuple):
    """One more function of a SavedModel: its `name`, the traced `function` and its `input_signature`;
    `jax2tf_kwargs`: the symbolic shapes of its inputs on JAX, where inputs share an unknown dimension
    or one is bounded (Keras names each unknown dimension apart: JAX cannot tell two batches are one)."""

    name: str
    function: Callable
    input_signature: list
    jax2tf_kwargs: dict | None = None


def write(model, filepath, format: str, verbose, input_signature, endpoints: tuple = (), jax_shapes=None, **kwargs):
    """Writes built `model` in `format` serving `input_signature`; a SavedModel also serves each of
    `endpoints`. `jax_shapes`: the signature's symbolic shapes on JAX (`jax2tf_kwargs`), unless given."""
    check_format(format, f"{type(model).__name__}.export")
    if format == "onnx":
        onnx_ops.teach_tf2onnx()
    if format != "tf_saved_model":
        keras.Model.export(
            model, filepath, format=format, verbose=bool(verbose), input_signature=input_signature, **kwargs
        )
        _say_written(format, filepath, ["serve"], verbose)
        return
    from keras.export import ExportArchive

    if keras.backend.backend() == "jax" and jax_shapes is not None and "jax2tf_kwargs" not in kwargs:
        kwargs["jax2tf_kwargs"] = jax_shapes  # inputs that share their batch and length
    archive = ExportArchive()
    archive.track_and_add_endpoint("serve", model, input_signature, **kwargs)
    for endpoint in endpoints:
        _add_endpoint(archive, endpoint)
    if keras.backend.backend() == "tensorflow":
        compat.saved_model_weights_once(archive)
    archive.write_out(filepath, verbose=bool(verbose))  # True: Keras' listing of every endpoint's specs
    _say_written(format, filepath, ["serve", *(endpoint.name for endpoint in endpoints)], verbose)


def write_endpoints(model, filepath, endpoints: list[Endpoint], verbose) -> None:
    """Writes a SavedModel of `endpoints` alone, without the forward pass (an image-text model's towers)."""
    from keras.export import ExportArchive

    check_format("tf_saved_model", f"{type(model).__name__}.export")
    archive = ExportArchive()
    archive.track(model)
    for endpoint in endpoints:
        _add_endpoint(archive, endpoint)
    if keras.backend.backend() == "tensorflow":
        compat.saved_model_weights_once(archive)
    archive.write_out(filepath, verbose=bool(verbose))
    _say_written("tf_saved_model", filepath, [endpoint.name for endpoint in endpoints], verbose)


def _say_written(format: str, filepath, endpoints: list[str], verbose) -> None:
    """One line per artifact written, unless `verbose=False`."""
    if verbose is not False:
        kind = {"tf_saved_model": "a SavedModel", "litert": "a LiteRT model", "onnx": "an ONNX model"}[format]
        print(f"Saved {kind} ({', '.join(endpoints)}) to {filepath}")


def write_function(model, filepath, format: str, endpoint: Endpoint, verbose) -> None:
    """Writes `endpoint` alone as a LiteRT model (one signature, named as the endpoint) or an ONNX graph,
    from TensorFlow: what a model exports in place of its forward pass (a causal LM's cached step)."""
    import tensorflow as tf

    check_format(format, f"{type(model).__name__}.export")
    specs = [tf.TensorSpec(spec.shape, spec.dtype, name=spec.name) for spec in endpoint.input_signature]
    function = tf.function(endpoint.function, input_signature=specs, autograph=False)
    if format == "onnx":
        import tf2onnx

        compat.patch_tf2onnx()
        onnx_ops.teach_tf2onnx()
        tf2onnx.convert.from_function(function, specs, output_path=str(filepath))
        _say_written(format, filepath, [endpoint.name], verbose)
        return
    import tempfile

    from keras.export import ExportArchive

    with tempfile.TemporaryDirectory() as saved:
        archive = ExportArchive()
        archive.track(model)
        archive.add_endpoint(endpoint.name, function)
        archive.write_out(saved, verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(saved, signature_keys=[endpoint.name])
        # builtin operations only: the LiteRT runtime of pip and phones has no TensorFlow kernels
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        flat = converter.convert()
    with open(filepath, "wb") as file:
        file.write(flat)
    _say_written(format, filepath, [endpoint.name], verbose)


def _add_endpoint(archive, endpoint: Endpoint) -> None:
    """On TensorFlow the endpoint is compiled with XLA, as `generate` runs it: the same random draws for
    a seed, and a decoding loop of fused steps (JAX's jax2tf export is XLA already)."""
    if keras.backend.backend() != "tensorflow":
        archive.add_endpoint(
            endpoint.name,
            endpoint.function,
            input_signature=endpoint.input_signature,
            jax2tf_kwargs=endpoint.jax2tf_kwargs or {},
        )
        return
    import tensorflow as tf

    specs = [tf.TensorSpec(spec.shape, spec.dtype, name=spec.name) for spec in endpoint.input_signature]
    function = tf.function(endpoint.function, input_signature=specs, jit_compile=True, autograph=False)
    function.get_concrete_function()
    archive.add_endpoint(endpoint.name, function)


def check_decoding_settings(format: str, owner: str, **settings) -> None:
    """Refuses decoding settings given (not None) for a format that holds no decoding loop: only a
    SavedModel does, so they would be dropped without a word."""
    given = [name for name, value in settings.items() if value is not None]
    if format != "tf_saved_model" and given:
        raise InputError(
            f"only a SavedModel holds the decoding loop; format={format!r} writes the model's forward pass. "
            f"Leave out {', '.join(given)}, or export format='tf_saved_model'.",
            given[0],
            caller=owner,
        )


def check_format(format: str, owner: str) -> None:
    """Refuses a format Keras does not know, one this backend cannot write, or one whose packages are
    missing, naming what would work."""
    if format not in CANNOT:
        raise InputError(f"must be one of {sorted(CANNOT)}; received format={format!r}.", "format", caller=owner)
    backend = keras.backend.backend()
    if backend in CANNOT[format]:
        able = " or ".join(b for b in ("tensorflow", "jax") if b not in CANNOT[format])
        raise InputError(
            f"cannot write format={format!r} from the {backend} backend: {CANNOT[format][backend]}. Save the "
            f"model (`model.save('model.keras')`), load it with KERAS_BACKEND={able} and export it there.",
            "format",
            caller=owner,
        )
    missing = [name for name in PACKAGES[format] if importlib.util.find_spec(name) is None]
    if missing:
        raise InputError(
            f"format={format!r} needs {', '.join(missing)}, which this install lacks: pip install 'keras_tfm[export]'.",
            "format",
            caller=owner,
        )
