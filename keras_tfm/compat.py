"""Every use of a private Keras or keras-hub API, and every platform-specific workaround, in one place.

Each shim names what it relies on; `tests/test_compat.py` checks each against the installed
versions, so that an upstream change fails one named test instead of a model somewhere.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import threading

import keras
import numpy as np

# Keras masks travel as an attribute of a tensor; keras-hub reads and writes them the same way.
# There is no public accessor yet (Keras 3.15).
from keras.src.backend import get_keras_mask, get_stateless_scope, set_keras_mask

# `compute_output_spec` (shape inference, and TensorFlow's symbolic build under a distribution) calls a
# model on placeholders whose dtype need not be the data's: there is no public flag for it (Keras 3.15).
from keras.src.backend.common.symbolic_scope import in_symbolic_scope

from keras_tfm import processor

__all__ = [
    "BuildBeforeQuantizeCheck",
    "build_before_distributed_fit",
    "builds_wrapped",
    "collections_of_new_objects",
    "configs_without_tensorflow",
    "jax_coordination_client",
    "child_layers",
    "concrete_values",
    "decoding_linear",
    "get_keras_mask",
    "get_stateless_scope",
    "host_call",
    "in_symbolic_scope",
    "int8_kernels_by_column",
    "mend_torch_products",
    "on_xla_cpu",
    "one_garbage_collection",
    "optimizer_averages_kept_apart",
    "patch_tf2onnx",
    "set_keras_mask",
    "torch_parallel_here",
    "torch_server_process",
    "torch_serial_here",
    "saved_model_weights_once",
    "sublayers",
    "track_variables_again",
    "variables_made_as_zeros",
]


def sublayers(layer: keras.layers.Layer) -> list:
    """Every layer below `layer`, each once, without `layer` itself (Keras' `_flatten_layers`)."""
    return list(layer._flatten_layers(include_self=False))


def track_variables_again(model: keras.layers.Layer) -> None:
    """On PyTorch, Keras registers each layer's variables as its module's parameters when it builds, and
    again after `Model.quantize` (`_post_quantize`); variables added later (LoRA's pairs) are missing from
    the model's own registry, and `torch.jit.trace` refuses them as constants. Registers them, as
    `quantize` does."""
    if keras.backend.backend() == "torch":
        for layer in model._flatten_layers():
            layer._track_variables()


def child_layers(layer: keras.layers.Layer) -> list:
    """The layers `layer` holds directly, in the order they were set (Keras' `_layers`)."""
    return list(layer._layers)


class BuildBeforeQuantizeCheck:
    """For models whose weights are made on first use: Keras checks that a layer is built before its
    `quantize` runs (in `_check_quantize_args`, called by the wrapper Keras puts around `quantize`),
    so such a model builds itself at that point."""

    def _check_quantize_args(self, mode, compute_dtype) -> None:
        self._build_on_demand()
        super()._check_quantize_args(mode, compute_dtype)


@contextlib.contextmanager
def one_garbage_collection():
    """Keras' `Layer.__delattr__` runs a full `gc.collect()` for every variable it deletes, so that
    the device frees its buffer at once; quantization deletes each float kernel it replaces, and most
    of its time went to those collections (docs/performance.md). Here the variables are freed by one
    collection at the end instead.
    For that time `gc.collect` is a no-op in every thread of the process."""
    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


@functools.cache
def on_xla_cpu() -> bool:
    """Whether the backend compiles with XLA for a CPU (JAX or TensorFlow with no accelerator).

    Workarounds measured on XLA's CPU compiler are kept behind this check, so that GPUs and TPUs get
    the plain graph."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if backend == "tensorflow":
        import tensorflow as tf

        return not (tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))
    return False


def concrete_values(value):
    """The values of a backend tensor that holds them now (an eager tensor) as a NumPy array; None for
    anything else: a tracer of `jax.jit`, a symbolic tensor of `tf.function`, a PyTorch tensor being traced
    or on the meta device, or no backend tensor at all. Each backend's test is its own, public where it has one."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
            return keras.ops.convert_to_numpy(value)
    elif backend == "tensorflow":
        import tensorflow as tf

        if isinstance(value, tf.Tensor) and not tf.is_symbolic_tensor(value) and hasattr(value, "numpy"):
            return value.numpy()
    elif backend == "torch":
        import torch

        tracing = torch.jit.is_tracing() or torch.compiler.is_compiling()
        if isinstance(value, torch.Tensor) and not tracing and value.device.type != "meta":
            return value.detach().cpu().numpy()
    return None


_MENDED_TORCH: list = []
_MENDING = threading.Lock()


def mend_torch_products() -> None:
    """Mends, for the process, four faults of Keras' PyTorch backend (Keras 3.15) that slow decoding on
    a CPU. With autograd on, every product stays Keras' own.

    - `ops.custom_gradient`, around every int8 layer's product, always runs as a
      `torch.autograd.Function`, which `torch.jit.trace` records as a call back into Python: each
      product of a traced decoding step would run eagerly. With autograd off there is no gradient to
      define, so the function runs as itself and is traced like any other op.
    - `ops.matmul` of int8 by int8 off CUDA casts both to int32 for a generic product.
      `torch._int_mm` gives the same int32 sums with the CPU's int8 kernel (VNNI on x86).
    - `ops.matmul` of float32 by a float32 matrix runs MKL's product, which on processors not made by Intel
      (AMD's) takes a generic path: 1.6-2.3x slower than oneDNN's (`_onednn_linear`) at the decoding
      steps' shapes, and 3x on the output head. With autograd off, on such an x86 CPU, oneDNN computes it
      (float32 sums in another order: differences of a few float32 ulps). On Intel's, MKL's own is faster
      (a SmolLM2-135M step of one row: 28 against 37 ms on a 2-core Xeon) and stays.
    - `ops.dot_product_attention` copies its keys and values (`.contiguous()`) before PyTorch's fused
      attention, which reads strided tensors as they are. A decoding step's keys and values are a slice
      of the cache: every layer copied the whole cache at every step, 60% of a 16-row step's time.
      With autograd off, on the CPU, `_attention_of_views` skips the copies."""
    with _MENDING:
        if not _MENDED_TORCH and keras.backend.backend() == "torch":
            _MENDED_TORCH.append(_mend_torch_products())


def _mend_torch_products() -> tuple:
    import torch
    from keras.src.backend.torch import core, nn, numpy

    class custom_gradient(core.custom_gradient):
        def __call__(self, *args, **kwargs):
            if torch.is_grad_enabled():
                return super().__call__(*args, **kwargs)
            output, _ = self.forward_fn(*args, **kwargs)
            return output

    core.custom_gradient = custom_gradient
    numpy.matmul = _float_matmul(numpy.matmul, decoding_linear())
    nn.dot_product_attention = _attention_of_views(nn.dot_product_attention)
    return custom_gradient, numpy.matmul, nn.dot_product_attention


def _float_matmul(keras_matmul, onednn):
    """Keras' PyTorch `matmul`, with int8 products on `torch._int_mm` and, where `onednn` is given,
    float32 ones without autograd on that kernel."""
    import torch
    from keras.src.backend.torch import numpy

    def matmul(x1, x2):
        x1, x2 = numpy.convert_to_tensor(x1), numpy.convert_to_tensor(x2)
        if x1.ndim < 2 or x2.ndim != 2 or x1.device.type != "cpu":
            return keras_matmul(x1, x2)
        if x1.dtype == x2.dtype == torch.int8:
            product = torch._int_mm(x1.reshape(-1, x1.shape[-1]), x2)
            return product.reshape(*x1.shape[:-1], x2.shape[1])
        if onednn is not None and x1.dtype == x2.dtype == torch.float32 and not torch.is_grad_enabled():
            return onednn(x1, x2.t())  # the weights as they lie: oneDNN reads the transposed view
        return keras_matmul(x1, x2)

    return matmul


def _attention_of_views(keras_attention):
    """Keras' PyTorch `dot_product_attention` without its copies of the inputs, where autograd is off
    and every input lies on the CPU; Keras' own otherwise, and for a bias, a soft cap or a mask with
    `is_causal`."""
    import torch
    from keras.src.backend.torch import nn
    from keras.src.backend.torch.core import convert_to_tensor

    def attention(query, key, value, bias=None, mask=None, scale=None, is_causal=False, **options):
        query, key, value = (convert_to_tensor(x) for x in (query, key, value))
        mask = None if mask is None else convert_to_tensor(mask, dtype="bool")
        plain = bias is None and not any(options.values()) and not (mask is not None and is_causal)
        same = len({x.dtype for x in (query, key, value)}) == 1 and all(x.ndim == 4 for x in (query, key, value))
        on_cpu = all(x.device.type == "cpu" for x in (query, key, value, *([mask] if mask is not None else [])))
        if torch.is_grad_enabled() or not (plain and same and on_cpu):
            return keras_attention(query, key, value, bias, mask, scale, is_causal, **options)
        if mask is not None:
            mask = torch.where(mask, 0.0, nn._get_large_negative(query.dtype))
        query, key, value = (torch.transpose(x, 1, 2) for x in (query, key, value))
        groups = query.shape[1] // key.shape[1]
        if groups > 1:
            key, value = (torch.repeat_interleave(x, groups, dim=1) for x in (key, value))
        attended = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=is_causal, scale=scale
        )
        return torch.transpose(attended, 1, 2)

    return attention


def decoding_linear():
    """oneDNN's float32 product (`_onednn_linear`) where PyTorch's decoding takes it, an x86 CPU not made by
    Intel; None elsewhere, where MKL's (Keras' `matmul`) is the faster."""
    return None if processor.made_by_intel() else _onednn_linear()


def _onednn_linear():
    """`(x, weights (outputs, inputs)) -> x @ weights.T` by oneDNN, PyTorch's inference kernel for
    `torch.compile` (`mkldnn::_linear_pointwise`), or None off x86 or without oneDNN. Scripted because
    `torch.jit.trace` cannot record the op's empty list of arguments; a trace calls the script."""
    import torch

    usable = processor.is_x86() and torch.backends.mkldnn.is_available()
    if not usable or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return None

    def linear(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, weights, None, "none", [], None)

    return torch.jit.script(linear)


def int8_products_are_fast() -> bool:
    """Whether PyTorch's int8 products (`torch._int_mm`) are fast on this machine: an x86 CPU with VNNI
    (`avx512_vnni` or `avx_vnni`), any CPU that is not x86 or whose flags are unknown, or a GPU."""
    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            return True
    if not processor.is_x86() or not processor.cpu_fields():
        return True
    return bool({"avx512_vnni", "avx_vnni"} & processor.cpu_flags())


_TORCH_THREADS: list = []  # the process's PyTorch intra-op threads, once one thread gave them up
_NO_SOURCE_LOCATIONS: list = []  # the tracer's hook that records none (kept alive: PyTorch calls it)


def torch_serial_here() -> None:
    """Runs PyTorch's operators on the calling thread without a team of OpenMP threads, keeping the
    process's thread count for `torch_parallel_here`.

    GNU OpenMP's workers spin for new work only while the process's OpenMP threads fit in its cores;
    once two threads have teams (the main thread that loaded a model, a server's engine that decodes),
    every worker sleeps between parallel regions and is woken by a system call, and a decoding step has
    hundreds of regions: 1.6x slower at one row, 1.2x at 16 (SmolLM2 shape, 2 cores). So a server's
    other threads run serially, and its engine alone in parallel."""
    if keras.backend.backend() != "torch":
        return
    import torch

    with _MENDING:
        if not _TORCH_THREADS:
            _TORCH_THREADS.append(torch.get_num_threads())
    torch.set_num_threads(1)


def torch_server_process() -> None:
    """Sets up PyTorch for a process that serves a model (the command-line server): its calling (main)
    thread runs serially (`torch_serial_here`), and `torch.jit.trace` records no source locations.

    The tracer stores the whole Python stack of every operation it records (about 2 kB each, through
    Keras' layers), and a decoding trace records ~24,000 before `generation.compiled` simplifies it: the
    strings and what they fragment held about half of every trace's memory (~17 of ~35 MB for each shape
    of the SmolLM2 shape). The locations only name lines in a trace's error messages. There is no
    public switch, so the tracer's hook (`torch::jit::tracer::setRecordSourceLocation`) is given a
    function that records none, for the rest of the process, where PyTorch exports it."""
    if keras.backend.backend() != "torch":
        return
    torch_serial_here()
    import ctypes

    import torch

    with _MENDING:
        if _NO_SOURCE_LOCATIONS:
            return
        library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        setter = getattr(library, "_ZN5torch3jit6tracer23setRecordSourceLocationEPFvPNS0_4NodeEE", None)
        if setter is not None:
            _NO_SOURCE_LOCATIONS.append(ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda node: None))
            setter(_NO_SOURCE_LOCATIONS[0])


def torch_parallel_here() -> None:
    """Gives the calling thread the intra-op threads the process had before `torch_serial_here`; a
    no-op if no thread gave them up."""
    if keras.backend.backend() == "torch" and _TORCH_THREADS:
        import torch

        torch.set_num_threads(_TORCH_THREADS[0])


def int8_kernels_by_column(model: keras.layers.Layer) -> None:
    """Stores each int8 `Dense` kernel of `model` (PyTorch, CPU) with every output channel's weights
    contiguous: the same `(input, output)` tensor and values, in the layout of `torch._int_mm`'s fast
    path (2-5x faster at batch 1 than the row-major one). Assigning to the variable keeps the layout."""
    if keras.backend.backend() != "torch":
        return
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.Dense) and layer.quantization_mode == "int8":
            kernel = layer._kernel.value  # the variable's own `torch.nn.Parameter`
            if kernel.device.type == "cpu" and kernel.ndim == 2 and kernel.stride(0) != 1:
                kernel.data = kernel.data.t().contiguous().t()


def build_before_distributed_fit(model: keras.Model, batch: tuple, multi_worker: bool) -> None:
    """Works around two faults of Keras' TensorFlow trainer under a `tf.distribute` strategy (Keras 3.15).
    `fit` takes a batch from its data for a symbolic build (`_maybe_symbolic_build`) and cannot rewind a
    generator, so one training batch was lost at every `fit`: build here (`_symbolic_build`) on a batch the
    caller keeps, and skip fit's. Under `MultiWorkerMirroredStrategy` (`multi_worker`) it averages each
    step's scalar logs over axis 0, which scalars lack: the steps' logs get that axis."""
    model._symbolic_build(data_batch=batch)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
    if not multi_worker:
        return
    for name in ("train_step", "test_step"):
        step = getattr(model, name)

        def with_axis(data, step=step):
            return {key: keras.ops.reshape(value, (1,)) for key, value in step(data).items()}

        setattr(model, name, with_axis)


def jax_coordination_client():
    """jaxlib's client of a `jax.distributed` run's coordination service (`get_live_nodes`,
    `wait_at_barrier`): `jax._src.distributed.global_state.client`, no public accessor in JAX 0.10."""
    from jax._src import distributed

    return distributed.global_state.client


def patch_tf2onnx() -> None:
    """Keras' fix of tf2onnx for NumPy 2 (tf2onnx reads `np.object`, `np.bool`, ...), which Keras applies
    before its own ONNX export; a model's own function exported with tf2onnx needs it too."""
    from keras.src.export.tf2onnx_lib import patch_tf2onnx as patch

    patch()


@contextlib.contextmanager
def variables_made_as_zeros():
    """Process-wide while open (every thread): a Keras variable made in this block starts as zeros, not
    its initializer's values; yields `{id: (variable, initializer)}` of those made and not yet assigned
    (`Variable.assign` takes one out; code that writes a variable's storage itself pops it). Wraps
    `Variable._initialize_with_initializer` and `Variable.assign`, which every backend's variable goes
    through (Keras 3.15); with another Keras, variables are initialized as usual and nothing is yielded
    back as pending."""
    variable_class = keras.Variable
    pending: dict[int, tuple] = {}
    if not hasattr(variable_class, "_initialize_with_initializer"):
        yield pending
        return
    initialize, assign_value = variable_class._initialize_with_initializer, variable_class.assign

    def start_as_zeros(variable, initializer):
        pending[id(variable)] = (variable, initializer)
        initialize(variable, keras.initializers.Zeros())

    def assigned(variable, value):
        pending.pop(id(variable), None)
        return assign_value(variable, value)

    variable_class._initialize_with_initializer, variable_class.assign = start_as_zeros, assigned
    try:
        yield pending
    finally:
        variable_class._initialize_with_initializer, variable_class.assign = initialize, assign_value


@contextlib.contextmanager
def builds_wrapped(classes: tuple, wrap):
    """Process-wide while open: `cls.build` of each of `classes` is `wrap(original build)` (each class
    must define its own `build`: a subclass that inherits one is wrapped through its parent). The
    wrapper keeps the original's signature (`functools.wraps`): Keras names the shapes it passes by it."""
    builds = {cls: vars(cls)["build"] for cls in classes}
    for cls in classes:
        cls.build = functools.wraps(builds[cls])(wrap(builds[cls]))
    try:
        yield
    finally:
        for cls in classes:
            cls.build = builds[cls]


@contextlib.contextmanager
def collections_of_new_objects():
    """Process-wide while open: `gc.collect()` does nothing (Keras' `Layer.__delattr__` runs one for
    every variable it deletes: 0.3 s each in a process holding a model); yields `collect()`, which
    collects the objects made since its last call and freezes the survivors (`gc.freeze`), so that
    each collection looks at the new objects only."""
    collect = gc.collect

    def collect_new() -> None:
        collect()
        gc.freeze()

    gc.freeze()
    gc.collect = lambda generation=2: 0
    try:
        yield collect_new
    finally:
        gc.collect = collect
        gc.unfreeze()


@contextlib.contextmanager
def configs_without_tensorflow():
    """Process-wide while open, where TensorFlow is installed but not imported: Keras' `get_config`
    imports TensorFlow to ask whether values are TensorFlow objects (+460 MB on JAX and PyTorch); here
    Keras' lazy module (`keras.src.utils.module_utils.tensorflow`) answers that it is missing, which is
    true of every value while it is not imported (checked in a fresh process by
    `tests/test_fresh_process.py`)."""
    import sys

    from keras.src.utils import module_utils

    tensorflow = getattr(module_utils, "tensorflow", None)
    if "tensorflow" in sys.modules or getattr(tensorflow, "_available", True) is not None:
        yield  # imported, known to be missing, or another Keras
        return
    tensorflow._available = False
    try:
        yield
    finally:
        tensorflow._available = None


@contextlib.contextmanager
def optimizer_averages_kept_apart(optimizer: keras.optimizers.Optimizer):
    """`fit` ends by writing the optimizer's moving averages (`use_ema`) over the weights, through its
    `finalize_variable_values` (Keras 3.15); in this block (for this optimizer only) it does not."""
    optimizer.finalize_variable_values = lambda variables: None
    try:
        yield
    finally:
        del optimizer.finalize_variable_values


def saved_model_weights_once(archive) -> None:
    """On TensorFlow, a Keras `ExportArchive` tracks Keras' variable wrappers and, apart, the tf.Variables
    its endpoints read: the SavedModel would hold every weight twice. Tracking the tf.Variables alone
    (in the archive's private `_tf_trackable`, Keras 3.15) writes each once."""
    trackable = archive._tf_trackable
    for name in ("variables", "trainable_variables", "non_trainable_variables"):
        setattr(trackable, name, [variable.value for variable in getattr(trackable, name)])


def host_call(function, arrays: list, shape: tuple, dtype: str):
    """`function(*numpy_arrays)` as a tensor, on the host inside a compiled step, without gradient: JAX's
    `pure_callback`, TensorFlow's `numpy_function` (not under XLA), PyTorch eagerly. Keras has none (3.15)."""

    run = lambda *values: np.asarray(function(*(np.asarray(value) for value in values)), dtype)  # noqa: E731
    if keras.backend.backend() == "jax":
        import jax

        return jax.pure_callback(run, jax.ShapeDtypeStruct(shape, dtype), *arrays)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.ensure_shape(tf.numpy_function(run, list(arrays), dtype, stateful=False), shape)
    return keras.ops.convert_to_tensor(run(*(keras.ops.convert_to_numpy(keras.ops.stop_gradient(a)) for a in arrays)))
