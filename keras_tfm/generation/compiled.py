"""The one backend-specific place of generation: how the decoding loop and the model step are
compiled on JAX, TensorFlow and PyTorch. Everything else in `generation/` is `keras.ops` only."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from collections.abc import Callable

import keras
import numpy as np
from keras import ops, tree

from keras_tfm import compat
from keras_tfm.layers.kv_cache import cache_writer


class CompiledFunctions:
    """A model's compiled decoding functions by setting. Not a dict: Keras and TensorFlow track a dict
    attribute of a model, and a SavedModel of a model that has generated would then try to save them."""

    def __init__(self):
        self._functions: dict = {}
        self._variables: list = []

    def of(self, model: keras.Model) -> CompiledFunctions:
        """These functions, emptied first if `model`'s variables are not those they were made with: a
        compiled function holds the variables it saw, and `quantize` or `enable_lora` replace or add some."""
        variables = list(model.variables)
        if len(variables) != len(self._variables) or any(a is not b for a, b in zip(variables, self._variables)):
            self._functions, self._variables = {}, variables
        return self

    def __contains__(self, key) -> bool:
        return key in self._functions

    def __len__(self) -> int:
        return len(self._functions)

    def __getitem__(self, key):
        return self._functions[key]

    def __setitem__(self, key, value) -> None:
        self._functions[key] = value


def keep_compiled_programs(directory: str | None) -> str | None:
    """On JAX, every program XLA compiles from here on is written to `directory` and read back by a later
    process that compiles the same program (model, shapes, versions): a server started again compiles
    nothing it compiled before (the SmolLM2 shape: 3.1 to 1.0 s a decoding chunk, the rest tracing).
    `$JAX_COMPILATION_CACHE_DIR`, where set, is kept. Returns the directory in use (None: none, or
    another backend: TensorFlow reads its cache's flag only as it starts, and PyTorch traces in Python)."""
    if keras.backend.backend() != "jax":
        return None
    import jax

    directory = os.environ.get("JAX_COMPILATION_CACHE_DIR") or directory
    if directory:
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # a prefill's second counts too
    return directory or None


def decoding_functions(step: Callable, model: keras.Model) -> tuple[Callable, Callable]:
    """`(step, while_loop)` for a decoding loop over `model`'s one-token `step`.

    JAX and TensorFlow compile the whole loop (`compile_function`) and get `step` and
    `ops.while_loop` back unchanged. PyTorch runs the loop in Python, and there Keras' per-op
    dispatch costs more than the math of a small model. So the whole body (model step, token choice,
    buffer update) is recorded once per input shape with `torch.jit.trace` and replayed; every per-call
    value (the row seeds included) must then be a loop variable, never a closure constant.
    `torch.compile` is not used: it recompiles at every Keras layer boundary."""
    if keras.backend.backend() != "torch":
        return step, ops.while_loop
    return step, traced_while_loop(model)


def takes_branches() -> bool:
    """Whether a compiled loop runs `ops.cond` as a branch taken per call: XLA's conditional (JAX,
    TensorFlow). PyTorch's traced loop replays the branch its trace took, so it computes both."""
    return keras.backend.backend() != "torch"


def _module(fn: Callable, model: keras.Model):
    import torch

    class _Traced(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model  # registers the weights as parameters, not frozen constants

        def forward(self, *args):
            return fn(*args)

    return _Traced()


def _shape_key(values) -> tuple:
    return tuple((tuple(part.shape), str(part.dtype)) for part in tree.flatten(values))


def traced_while_loop(model: keras.Model) -> Callable:
    """`ops.while_loop(cond, body, loop_vars)` for PyTorch with `body` traced once per loop-variable
    shape (the condition stays eager: one small op per step). `body` must depend on nothing but its
    loop variables, `model`'s weights and values fixed for the life of this function."""
    traced: dict = {}

    def while_loop(cond: Callable, body: Callable, loop_vars):
        loop_vars = tuple(loop_vars)
        key = _shape_key(loop_vars)
        if key not in traced:
            structure = loop_vars

            def flat_body(*flat):
                return tuple(tree.flatten(body(*tree.pack_sequence_as(structure, list(flat)))))

            traced[key] = torch_trace(flat_body, model, tuple(tree.flatten(loop_vars)))
        run = traced[key]
        with _plain_replay():
            while bool(cond(*loop_vars)):
                loop_vars = tree.pack_sequence_as(loop_vars, list(run(*tree.flatten(loop_vars))))
        return loop_vars

    return while_loop


def _plain_replay():
    """Replays traces without TorchScript's profiling optimizer, which slows the first thousand or so
    replays of a decoding body many times over."""
    import torch

    return torch.jit.optimized_execution(False)


def specialized_where(wanted: Callable[..., bool], fn: Callable, model: keras.Model) -> Callable:
    """`fn` with a program of its own for each input shape `wanted(*args)` accepts, where the fixed cost of a
    call is most of its time (a prefill of one prompt), and one program for every other shape, where the math is
    (a prefill of several): JAX compiles every shape (`compile_function`); TensorFlow compiles a wanted shape
    with XLA and runs the others as one graph of unknown sizes (SmolLM2-135M's shape, 16 x 128 positions: 1.97 s
    either way, about 100 MB less for each shape); PyTorch records a wanted shape on its first call (`torch_trace`)
    and replays it (one prompt 16 wide: 84 against 213 ms eagerly), and runs the others eagerly.

    Every tensor `fn` returns must be computed from its inputs: PyTorch's trace writes caches in place, and folds
    one made of constants alone (`ops.zeros` returned unwritten) into one tensor that every call would share."""
    if keras.backend.backend() == "jax":
        return compile_function(fn, model)
    specialized, general = _program_per_shape(fn, model), _general_program(fn, model)

    def call(*args):
        return (specialized if wanted(*args) else general)(*args)

    return call


def _program_per_shape(fn: Callable, model: keras.Model) -> Callable:
    """TensorFlow's XLA program of each shape (`compile_function`), or PyTorch's trace of each, recorded at
    its first call and replayed without autograd."""
    if keras.backend.backend() != "torch":
        return compile_function(fn, model)
    import torch

    compat.mend_torch_products()  # as `compile_function` does
    compat.int8_kernels_by_column(model)
    traces: dict = {}

    def replayed(*args):
        key = _shape_key(args)
        with torch.no_grad():
            if key not in traces:
                traces[key] = torch_trace(fn, model, args)
            with _plain_replay():
                return traces[key](*args)

    return replayed


def _general_program(fn: Callable, model: keras.Model) -> Callable:
    """`fn` for inputs of any shape: TensorFlow's graph traced once with every size unknown (no XLA), or
    PyTorch's eager operations without autograd."""
    if keras.backend.backend() != "tensorflow":
        return compile_function(fn, model)
    import tensorflow as tf

    graphs, lock = [], threading.Lock()

    def run(*args):
        with lock:  # traced at the first call with each size unknown: one trace serves every shape
            if not graphs:
                specs = [tf.TensorSpec([None] * len(arg.shape), arg.dtype) for arg in tree.flatten(args)]
                graphs.append(tf.function(lambda *flat: _unrecorded(fn, args, flat), input_signature=specs))
        return graphs[0](*tree.flatten(args))

    return run


def _unrecorded(fn: Callable, structure, flat: tuple):
    with op_stacks_unrecorded():
        return fn(*tree.pack_sequence_as(structure, list(flat)))


def torch_trace(fn: Callable, model: keras.Model, example_args: tuple):
    """`fn` recorded with `torch.jit.trace`, writing the key/value cache in place (`_write_in_place`): a
    decoding loop passes each step's cache on and never reads the old one again."""
    import torch

    # The trace records Python values (shapes, the cache's size) as constants on purpose: one trace is
    # made per shape. TorchScript warns of each, in words that read like a fault.
    with warnings.catch_warnings(), cache_writer(_write_in_place):
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # `_store_inputs=False`: by default the trace keeps its example inputs (a whole cache per shape)
        traced = torch.jit.trace(_module(fn, model), example_args, check_trace=False, _store_inputs=False)
    _specialize(traced.graph, traced)
    return traced


def _specialize(graph, module) -> None:
    """Simplifies a trace that will only ever replay the shapes it was made with. Keras reads shapes
    as tensors and converts every input, so a SmolLM2-shaped step records ~24,000 nodes, most of them
    shape arithmetic and `aten::to`s that change nothing; each costs the interpreter a dispatch. With
    every size a constant, that arithmetic folds away, and what is left repeated in each layer (the
    positions' rotation angles, the mask) is computed once: ~3,000 nodes, the same values."""
    import torch

    torch._C._jit_pass_inline(graph)  # the scripted products (`compat.mend_torch_products`), called inline
    _type_weights(graph, module)
    for node in list(graph.nodes()):
        if node.kind() != "aten::size":
            continue
        tensor, *dim = node.inputs()
        sizes = tensor.type().sizes() if isinstance(tensor.type(), torch._C.TensorType) else None
        if sizes is None or None in sizes or (dim and dim[0].toIValue() is None):
            continue
        with graph.insert_point_guard(node):
            size = graph.insertConstant(sizes[dim[0].toIValue()] if dim else list(sizes))
        node.output().replaceAllUsesWith(size)
        node.destroy()
    torch._C._jit_pass_constant_propagation(graph)
    for node in list(graph.nodes()):
        if node.kind() == "aten::to" and _changes_nothing(node):
            node.output().replaceAllUsesWith(next(node.inputs()))
            node.destroy()
    torch._C._jit_pass_cse(graph)
    torch._C._jit_pass_dce(graph)


def _type_weights(graph, module) -> None:
    """Gives each weight the trace reads (a `prim::GetAttr` chain from the traced `module`) the type of its
    tensor, which the trace leaves unknown: Keras converts every weight it reads, and with both types
    known, `_changes_nothing` can tell that the conversion changes nothing."""
    import torch

    objects = {next(graph.inputs()).unique(): module}
    for node in graph.nodes():
        if node.kind() != "prim::GetAttr" or next(node.inputs()).unique() not in objects:
            continue
        value = getattr(objects[next(node.inputs()).unique()], node.s("name"), None)
        if isinstance(value, torch.Tensor):
            node.output().setType(torch._C.TensorType.create_from_tensor(value))
        elif value is not None:
            objects[node.output().unique()] = value


def _changes_nothing(node) -> bool:
    """Whether an `aten::to` node's output is its input: same dtype and device, known from the trace."""
    import torch

    source, target = next(node.inputs()).type(), node.output().type()
    if not (isinstance(source, torch._C.TensorType) and isinstance(target, torch._C.TensorType)):
        return False
    return source.scalarType() is not None and (source.scalarType(), source.device()) == (
        target.scalarType(),
        target.device(),
    )


def _write_in_place(cache, start: tuple, entries):
    """`ops.slice_update(cache, start, entries)` for a cache written along its positions (axis 3), in
    `cache` itself: Keras' update copies the whole cache, in every layer at every step (the tracing run
    writes the first step's entries, which its first replay writes again, the same)."""
    import torch

    if len(getattr(start[3], "shape", ())) == 1:  # each row at its own position (one new position each)
        # a copy of the positions: an index of an in-place write may be written, for all the trace knows, so
        # nothing read from it could be computed once for every layer
        cache[torch.arange(cache.shape[0], device=cache.device), :, :, start[3].clone()] = entries[:, :, :, 0]
        return cache
    positions = torch.arange(entries.shape[3], device=cache.device) + start[3]
    return cache.index_copy_(3, positions, entries)


def rows_replaced_in_place(layer, filled, sources, indices):
    """PyTorch's `continuous._rows_written`, written into `layer` itself: its rows `indices` `(k, 1)` become
    rows `sources` `(k,)` of a prefilled layer, zeros past its positions. Copying a written layer back
    (`written_in_place`) copied each whole layer twice."""
    rows, width = indices[:, 0], filled.shape[3]
    layer[rows, :, :, :width] = ops.take(ops.convert_to_tensor(filled, layer.dtype), sources, axis=0)
    layer[rows, :, :, width:] = 0
    return layer


@functools.cache
def written_in_place(fn: Callable) -> Callable:
    """`fn(array, *rest)`, which returns `array` with some entries changed, writing them into `array`'s
    own buffer (the caller goes on with the result only): on JAX compiled with `array` donated, on
    PyTorch copied back into it. A cache's rows written a layer at a time this way never hold a second
    whole cache beside the first. On TensorFlow `fn` runs as a graph (a function per shape), which writes
    a new array: op by op, SmolLM2's 30 layers took 1.5x as long."""
    backend = keras.backend.backend()
    if backend == "jax":
        return programs_by_shape(fn, donated=(0,))
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)

    def copied_back(array, *rest):
        return array.copy_(fn(array, *rest))

    return copied_back


def compile_function(fn: Callable, model: keras.Model, donated: tuple[int, ...] = ()) -> Callable:
    """Compiles `fn` once for this backend: XLA ahead of time for each shape (`programs_by_shape`, the
    model's variables passed in as state) or `tf.function(jit_compile=True)` traced without operation
    stacks (`op_stacks_unrecorded`). PyTorch runs the loop in Python without autograd
    (see `decoding_functions` for what it traces), its int8 products on the CPU's int8 kernel and its
    float32 ones on oneDNN's off Intel processors (`compat.mend_torch_products`).

    `donated`: the positions of arguments the caller never reads again (a cache it replaces by the
    one returned). JAX then writes the result into their buffers, rather than copying them into
    new ones: a chunk of the SmolLM2 shape at 16 rows x 128 positions holds one cache (94 MB) less."""
    backend = keras.backend.backend()
    if backend == "jax":

        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                return fn(*args)

        programs = programs_by_shape(stateless, donated=tuple(position + 1 for position in donated))
        return lambda *args: programs([v.value for v in model.variables], *args)
    if backend == "tensorflow":
        import tensorflow as tf

        def traced(*args):  # runs only while TensorFlow traces a new shape
            with op_stacks_unrecorded():
                return fn(*args)

        return tf.function(traced, jit_compile=True)  # one trace per batch shape, like jax.jit
    import torch

    compat.mend_torch_products()
    compat.int8_kernels_by_column(model)

    def run_without_autograd(*args):
        with torch.no_grad():
            return fn(*args)

    return run_without_autograd


def programs_by_shape(fn: Callable, donated: tuple[int, ...] = ()) -> Callable:
    """`jax.jit(fn, donate_argnums=donated)` that keeps each shape's compiled program and nothing of its
    trace: a `jax.jit` keeps every shape's jaxpr and lowered module for as long as it lives, 10-15 MB of
    a 30-layer decoding loop beside its 30-50 MB program. Each shape is traced from a function of its
    own, which JAX's weakly keyed caches forget once it is compiled ahead of time."""
    import jax

    programs = {}

    def call(*args):
        leaves, structure = jax.tree.flatten(args)
        key = (
            structure,
            *((type(x), np.shape(x), getattr(x, "dtype", None), getattr(x, "weak_type", None)) for x in leaves),
        )
        program = programs.get(key)
        if program is None:
            traced = functools.wraps(fn)(lambda *inputs: fn(*inputs))
            program = programs[key] = jax.jit(traced, donate_argnums=donated).lower(*args).compile()
        return program(*args)

    return call


_UNRECORDED = {"lock": threading.Lock(), "depth": 0, "record": None}


@contextlib.contextmanager
def op_stacks_unrecorded():
    """TensorFlow's graph operations made inside, on any thread, without the Python stack each records:
    XLA's compiler keeps a frozen copy of every operation's stack, 90 MB of a 30-layer decoding loop's
    220 MB and 70 of a prefill's 140 (SmolLM2's shape). An error then shows "stack traces unavailable"
    where the line that made the operation was; TensorFlow has no public switch, so this swaps the
    function its graph builder calls (and does nothing where that moved)."""
    from tensorflow.python.framework import ops as graph_ops

    c_api = getattr(graph_ops, "pywrap_tf_session", None)
    if not hasattr(c_api, "TF_SetOpStackTrace"):
        yield
        return
    with _UNRECORDED["lock"]:
        if _UNRECORDED["depth"] == 0:
            _UNRECORDED["record"] = c_api.TF_SetOpStackTrace
            c_api.TF_SetOpStackTrace = _not_recorded
        _UNRECORDED["depth"] += 1
    try:
        yield
    finally:
        with _UNRECORDED["lock"]:
            _UNRECORDED["depth"] -= 1
            if _UNRECORDED["depth"] == 0:
                c_api.TF_SetOpStackTrace = _UNRECORDED["record"]


def _not_recorded(operation, stack) -> None:
    del operation, stack
