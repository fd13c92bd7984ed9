"""`keras_tfm.generation.compiled`: what is kept of the programs it compiles."""

import gc
import os

import keras
import numpy as np
import pytest

from keras_tfm.generation import compiled


def test_compiled_programs_are_kept_where_asked_on_jax_only(tmp_path, monkeypatch):
    """JAX's directory of compiled programs becomes the one given, unless `$JAX_COMPILATION_CACHE_DIR` names one;
    the other backends keep none (JAX writes and reads the files: `benchmarks/warm_up.py` measures a restart)."""
    if keras.backend.backend() != "jax":
        assert compiled.keep_compiled_programs(str(tmp_path)) is None
        return
    import jax

    before = jax.config.jax_compilation_cache_dir
    try:
        assert compiled.keep_compiled_programs(str(tmp_path)) == os.environ["JAX_COMPILATION_CACHE_DIR"]  # the tests'
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
        assert compiled.keep_compiled_programs(str(tmp_path)) == str(tmp_path) == jax.config.jax_compilation_cache_dir
        assert compiled.keep_compiled_programs(None) is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_programs_by_shape_trace_each_shape_once_and_keep_no_trace():
    """JAX's programs, one a shape: each shape traced once and computed in float32, the donated argument
    spent, and none of a trace's equations kept (a `jax.jit` keeps every shape's)."""
    if keras.backend.backend() != "jax":
        pytest.skip("JAX's programs")
    import jax.numpy as jnp
    from jax.extend import core

    def live_equations():
        gc.collect()
        return sum(isinstance(item, core.JaxprEqn) for item in gc.get_objects())

    traced = []

    def fn(x, y):
        traced.append(x.shape)
        for _ in range(50):
            x = x * 2.0 + y
        return x

    expected = np.float32(1.0)
    for _ in range(50):
        expected = expected * np.float32(2.0) + np.float32(0.5)
    programs, before = compiled.programs_by_shape(fn, donated=(0,)), live_equations()
    for size in (2, 3, 4, 2, 3):
        donated = jnp.ones(size)
        np.testing.assert_array_equal(programs(donated, jnp.full(size, 0.5)), np.full(size, expected))
        assert donated.is_deleted()
    assert traced == [(2,), (3,), (4,)]
    assert live_equations() - before < 100  # one trace of `fn` is 100 equations


def test_decoding_functions_trace_without_operation_stacks_on_tensorflow():
    """A compiled function's operations carry no Python stack on TensorFlow (XLA keeps a frozen copy of each);
    those traced elsewhere still do, also after an error inside the switch."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorFlow's graphs")
    import tensorflow as tf

    spec = tf.TensorSpec((2,), tf.float32)
    function = compiled.compile_function(lambda x: x * 2.0 + 1.0, keras.Sequential())
    computed = ("Mul", "AddV2")  # the inputs and outputs are made outside `fn`
    graph = function.get_concrete_function(spec).graph
    assert [op.traceback for op in graph.get_operations() if op.type in computed] == [None, None]
    with pytest.raises(ValueError, match="inside"), compiled.op_stacks_unrecorded():
        raise ValueError("inside")
    elsewhere = tf.function(lambda x: x * 2.0 + 1.0).get_concrete_function(spec).graph
    assert all(op.traceback for op in elsewhere.get_operations() if op.type in computed)


def test_specialized_where_gives_the_shapes_it_wants_programs_of_their_own():
    """A wanted shape runs its Python once (XLA's trace, PyTorch's recording) and its results are each call's
    own (a replay writes none into an earlier one's); the other shapes run one program of any shape on
    TensorFlow (its Python once, sizes unknown), their Python at every call on PyTorch, and on JAX a program
    each."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    runs = []

    def fn(x):
        runs.append(tuple(x.shape))
        return model(x) * 2.0

    function = compiled.specialized_where(lambda x: keras.ops.shape(x)[0] == 1, fn, model)
    one = np.ones((1, 3), "float32")
    results = {x.tobytes(): function(keras.ops.convert_to_tensor(x)) for x in (one, 3 * one)}
    for rows in (2, 2, 5):
        results[np.full((rows, 3), rows, "float32").tobytes()] = function(np.full((rows, 3), rows, "float32"))
    for x, result in results.items():
        x = np.frombuffer(x, "float32").reshape(-1, 3)
        expected = keras.ops.convert_to_numpy(model(x)) * 2.0
        np.testing.assert_allclose(keras.ops.convert_to_numpy(result), expected, rtol=1e-6)
    others = {"jax": [(2, 3), (5, 3)], "tensorflow": [(None, None)], "torch": [(2, 3), (2, 3), (5, 3)]}
    assert runs == [(1, 3)] + others[keras.backend.backend()]
