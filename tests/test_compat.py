"""One test per shim of `keras_tfm.compat`: each fails, naming the shim, when Keras or keras-hub
changes what it relies on."""

import contextlib
import gc
import os

import keras
import numpy as np
import pytest

from keras_tfm import compat, processor


def test_keras_masks_are_read_and_written_on_tensors():
    x = keras.ops.ones((2, 3))
    mask = keras.ops.convert_to_tensor(np.array([[True, True, False], [True, False, False]]))
    assert compat.get_keras_mask(x) is None
    compat.set_keras_mask(x, mask)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(compat.get_keras_mask(x)), keras.ops.convert_to_numpy(mask)
    )
    # Keras itself propagates a mask so: an Embedding with mask_zero leaves it on its output
    embedded = keras.layers.Embedding(5, 2, mask_zero=True)(np.array([[1, 0]]))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(compat.get_keras_mask(embedded)), [[True, False]])


def test_the_stateless_scope_is_found_inside_and_not_outside():
    assert compat.get_stateless_scope() is None
    with keras.StatelessScope() as scope:
        assert compat.get_stateless_scope() is scope


def test_sublayers_and_child_layers():
    class Pair(keras.layers.Layer):
        def __init__(self, first, second, **kwargs):
            super().__init__(**kwargs)
            self.first, self.second = first, second

    inner = Pair(keras.layers.Dense(2, name="a"), keras.layers.Dense(2, name="b"), name="inner")
    outer = Pair(inner, keras.layers.Dense(1, name="c"), name="outer")
    assert [layer.name for layer in compat.child_layers(outer)] == ["inner", "c"]
    assert sorted(layer.name for layer in compat.sublayers(outer)) == ["a", "b", "c", "inner"]


def test_keras_checks_quantize_arguments_where_an_unbuilt_model_builds_itself():
    """Keras calls `_check_quantize_args` before `quantize`, and refuses an unbuilt layer there."""

    class Lazy(compat.BuildBeforeQuantizeCheck, keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(4)

        def _build_on_demand(self):
            if not self.built:
                self(np.zeros((1, 4), "float32"))

        def call(self, x):
            return self.dense(x)

    with pytest.raises(ValueError, match="isn't yet built"):
        keras.layers.Dense(4).quantize("int8")  # what the shim answers
    model = Lazy()
    model.quantize("int8")
    assert model.dense.quantization_mode == "int8"


def test_keras_collects_garbage_per_deleted_variable_and_the_shim_defers_it(monkeypatch):
    calls = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda generation=2: calls.append(generation) or collect(generation))
    counting = gc.collect
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    layer._tracker.unlock()
    del layer._kernel  # Keras' Layer.__delattr__, as quantize deletes a float kernel
    assert calls, "Keras no longer collects per deleted variable: compat.one_garbage_collection may go"
    calls.clear()
    with compat.one_garbage_collection():
        assert gc.collect() == 0 and not calls
    assert len(calls) == 1  # one collection at the end
    assert gc.collect is counting  # put back


def test_on_xla_cpu_is_true_on_this_machine_for_xla_backends():
    assert compat.on_xla_cpu() == (keras.backend.backend() in ("jax", "tensorflow"))


def test_the_symbolic_scope_is_found_inside_shape_inference_only():
    from keras_tfm.compat import in_symbolic_scope

    seen = []
    layer = keras.layers.Lambda(lambda x: (seen.append(in_symbolic_scope()), x)[1])
    keras.ops.convert_to_numpy(layer(keras.ops.ones((2, 3))))
    layer(keras.KerasTensor((2, 3)))  # a symbolic call: its output shape inferred
    assert seen == [False, True]


def test_keras_fits_under_a_strategy_after_the_build_the_shim_makes():
    """`build_before_distributed_fit` builds with Keras' `_symbolic_build` and replaces the TensorFlow
    trainer's `_maybe_symbolic_build`, which took (and lost) a batch of the data."""
    import numpy as np

    from keras_tfm.compat import build_before_distributed_fit

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse", metrics=["mae"])
    if keras.backend.backend() == "tensorflow":
        assert callable(model._maybe_symbolic_build)
    build_before_distributed_fit(model, (np.ones((4, 3), "float32"), np.zeros((4, 2), "float32")), multi_worker=True)
    assert model._compile_metrics.built and model.optimizer.built
    assert model._maybe_symbolic_build() is None
    if keras.backend.backend() == "tensorflow":  # the multi-worker strategy's reduction wants an axis
        logs = model.train_step((np.ones((4, 3), "float32"), np.zeros((4, 2), "float32")))
        assert all(tuple(value.shape) == (1,) for value in logs.values())


def test_jaxlib_client_reports_live_processes():
    if keras.backend.backend() != "jax":
        pytest.skip("jax.distributed")
    from jax._src import distributed
    from jax._src.lib import _jax

    assert hasattr(distributed.global_state, "client")
    assert "get_live_nodes" in dir(_jax.DistributedRuntimeClient)


@pytest.mark.backend_independent
def test_keras_patches_tf2onnx_for_numpy_2():
    pytest.importorskip("tf2onnx")
    from tf2onnx import tf_utils

    compat.patch_tf2onnx()
    assert hasattr(np, "object")  # tf2onnx reads it; NumPy 2 removed it
    assert tf_utils.__name__ == "tf2onnx.tf_utils"


def int8_dense(rng, units: int = 24) -> keras.layers.Dense:
    dense = keras.layers.Dense(units)
    dense.build((None, 40))
    dense.set_weights([rng.normal(size=(40, units)).astype("float32"), np.zeros(units, "float32")])
    dense.quantize("int8")
    return dense


def test_torch_int8_products_are_keras_own_and_traceable(rng):
    """Keras' int8 `Dense` on PyTorch: the product on the CPU's int8 kernel gives Keras' int32 sums; with
    autograd off, `torch.jit.trace` records it as ops (no call back into Python); with autograd on,
    Keras' custom gradient (through the dequantized kernel) still applies."""
    if keras.backend.backend() != "torch":
        pytest.skip("a fault of Keras' PyTorch backend")
    import torch

    dense = int8_dense(rng)
    x = rng.normal(size=(2, 3, 40)).astype("float32")
    quantized, scale = keras.quantizers.abs_max_quantize(x, axis=-1)
    kernel, kernel_scale = (keras.ops.convert_to_numpy(v) for v in (dense._kernel, dense.kernel_scale))
    sums = keras.ops.convert_to_numpy(quantized).astype("int64") @ kernel.astype("int64")
    expected = sums.astype("float32") / (kernel_scale * keras.ops.convert_to_numpy(scale))
    compat.mend_torch_products()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(dense(x)), expected, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        traced = torch.jit.trace(dense, (torch.tensor(x),), check_trace=False)
    kinds = {node.kind() for node in traced.inlined_graph.nodes()}
    assert "aten::_int_mm" in kinds and "prim::PythonOp" not in kinds
    inputs = torch.tensor(x, requires_grad=True)
    dense(inputs).sum().backward()
    float_kernel = kernel.astype("float32") / kernel_scale
    np.testing.assert_allclose(inputs.grad.numpy(), np.broadcast_to(float_kernel.sum(1), x.shape), rtol=1e-5)


def test_torch_float_products_go_to_onednn_without_autograd(rng):
    """A float32 product with autograd off, on oneDNN's kernel (as decoding runs it on an x86 CPU not made
    by Intel), is recorded as that op by `torch.jit.trace` (through its script) and gives NumPy's product;
    with autograd on, Keras' own with its gradient. Its weights are read as they lie: a transposed view, as
    a tied output head passes them. Keras' `matmul` takes the kernel only where `decoding_linear` gives it."""
    if keras.backend.backend() != "torch":
        pytest.skip("a fault of Keras' PyTorch backend")
    import torch
    from keras.src.backend.torch import numpy

    compat.mend_torch_products()
    onednn = compat._onednn_linear()
    if onednn is None:
        pytest.skip("oneDNN's product is used on x86 CPUs only")
    matmul = compat._float_matmul(numpy.matmul, onednn)
    x, weights = rng.normal(size=(2, 3, 40)).astype("float32"), rng.normal(size=(24, 40)).astype("float32")
    expected = x @ weights.T
    with torch.no_grad():
        product = matmul(torch.tensor(x), keras.ops.transpose(torch.tensor(weights)))
        np.testing.assert_allclose(product.numpy(), expected, rtol=1e-5, atol=1e-5)
        traced = torch.jit.trace(lambda v: matmul(v, torch.tensor(weights).T), (torch.tensor(x),))
        mended = torch.jit.trace(lambda v: keras.ops.matmul(v, torch.tensor(weights).T), (torch.tensor(x),))
    kinds = {node.kind() for node in traced.inlined_graph.nodes()}
    assert "mkldnn::_linear_pointwise" in kinds and "aten::matmul" not in kinds
    np.testing.assert_allclose(traced(torch.tensor(x)).numpy(), expected, rtol=1e-5, atol=1e-5)
    mended_kinds = {node.kind() for node in mended.inlined_graph.nodes()}
    assert ("mkldnn::_linear_pointwise" in mended_kinds) == (compat.decoding_linear() is not None)
    inputs = torch.tensor(x, requires_grad=True)
    matmul(inputs, torch.tensor(weights).T).sum().backward()
    np.testing.assert_allclose(inputs.grad.numpy(), np.broadcast_to(weights.sum(0), x.shape), rtol=1e-5)


def test_torch_attention_reads_strided_keys_and_values_without_copies(rng):
    """`ops.dot_product_attention` with autograd off, of keys and values that are a slice of a joint
    cache (as a decoding step's), gives Keras' own result (grouped heads, a mask) without copying them."""
    if keras.backend.backend() != "torch":
        pytest.skip("a fault of Keras' PyTorch backend")
    import torch

    compat.mend_torch_products()
    cache = torch.tensor(rng.normal(size=(3, 2, 2, 5, 8)).astype("float32"))  # (batch, 2, heads, length, dim)
    key, value = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)
    mask = torch.tensor(rng.random((3, 1, 2, 5)) > 0.3)
    mask[..., 0] = True
    for heads in (2, 6):  # one query head per key/value head, and three
        query = torch.tensor(rng.normal(size=(3, 2, heads, 8)).astype("float32"))
        with torch.enable_grad():  # Keras' own path
            expected = keras.ops.dot_product_attention(query, key, value, mask=mask, scale=0.3).detach()
        with torch.no_grad(), torch.profiler.profile() as profile:
            attended = keras.ops.dot_product_attention(query, key, value, mask=mask, scale=0.3)
        np.testing.assert_allclose(attended.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
    copies = [e.name for e in profile.events() if e.name in ("aten::contiguous", "aten::clone")]
    assert copies == ["aten::clone"] * 2  # the grouped keys' and values' repetition, not the cache
    with torch.no_grad(), torch.profiler.profile() as profile:
        keras.ops.dot_product_attention(query[:, :, :2], key, value, mask=mask)
    assert not [e.name for e in profile.events() if e.name in ("aten::contiguous", "aten::clone")]


def test_one_thread_of_a_server_runs_torch_in_parallel(monkeypatch):
    """`torch_serial_here` leaves the calling thread one intra-op thread and keeps the process's count,
    which `torch_parallel_here` gives to another thread (a server's engine)."""
    if keras.backend.backend() != "torch":
        pytest.skip("PyTorch's threads")
    import threading

    import torch

    monkeypatch.setattr(compat, "_TORCH_THREADS", [])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []
    try:
        compat.torch_serial_here()
        assert torch.get_num_threads() == 1
        worker = threading.Thread(target=lambda: (compat.torch_parallel_here(), seen.append(torch.get_num_threads())))
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(before)
    assert seen == [2]


def test_a_server_process_traces_without_source_locations(monkeypatch):
    """After `torch_server_process`, `torch.jit.trace` records the same operations without the Python
    stack of each, and the calling thread runs serially."""
    if keras.backend.backend() != "torch":
        pytest.skip("PyTorch's tracer")
    import torch

    monkeypatch.setattr(compat, "_TORCH_THREADS", [])
    before = torch.get_num_threads()
    try:
        compat.torch_server_process()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    x = torch.arange(4.0)
    traced = torch.jit.trace(lambda v: keras.ops.tanh(v * 2.0) + 1.0, (x,))
    kinds = [node.kind() for node in traced.graph.nodes()]
    assert "aten::tanh" in kinds and not [node.sourceRange() for node in traced.graph.nodes() if node.sourceRange()]
    np.testing.assert_allclose(traced(x).numpy(), np.tanh(np.arange(4.0) * 2) + 1, rtol=1e-6)


def test_int8_kernels_laid_by_column_keep_their_values(rng):
    if keras.backend.backend() != "torch":
        pytest.skip("PyTorch's int8 kernel")
    dense = int8_dense(rng)
    before = keras.ops.convert_to_numpy(dense._kernel)
    compat.int8_kernels_by_column(dense)
    assert dense._kernel.value.stride() == (1, 40)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(dense._kernel), before)
    dense._kernel.assign(before[::-1].copy())  # a load writes into the variable: the layout stays
    assert dense._kernel.value.stride() == (1, 40)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(dense._kernel), before[::-1])


def test_variables_added_after_build_are_tracked_again():
    if keras.backend.backend() != "torch":
        pytest.skip("PyTorch's module parameters")
    model = keras.Sequential([keras.layers.Dense(4)])
    model.build((None, 3))
    model.layers[0].enable_lora(2)
    compat.track_variables_again(model)
    assert len(list(model.parameters())) == len(model.variables) == 4


def test_variables_made_as_zeros_skip_the_initializer_until_assigned_and_only_inside():
    with compat.variables_made_as_zeros() as pending:
        kept = keras.Variable(initializer="ones", shape=(2,))
        replaced = keras.Variable(initializer="ones", shape=(2,))
        assert not keras.ops.convert_to_numpy(kept).any() and len(pending) == 2
        replaced.assign(np.full(2, 3.0, "float32"))
        assert [variable for variable, _ in pending.values()] == [kept]  # `assign` takes it out
    assert keras.ops.convert_to_numpy(keras.Variable(initializer="ones", shape=(2,))).all()  # restored


def test_builds_wrapped_wraps_each_class_build_inside_only():
    built = []

    def wrap(original):
        def build(layer, *args, **kwargs):
            built.append(layer.name)
            return original(layer, *args, **kwargs)

        return build

    with compat.builds_wrapped((keras.layers.Dense,), wrap):
        keras.layers.Dense(2, name="inside").build((None, 3))
    keras.layers.Dense(2, name="outside").build((None, 3))
    assert built == ["inside"]


def test_collections_of_new_objects_collect_only_when_asked():
    class Cycle:
        pass

    with compat.collections_of_new_objects() as collect:
        cycle = Cycle()
        cycle.me = cycle
        del cycle
        assert gc.collect() == 0  # what Keras' deletions call: nothing
        assert any(type(o) is Cycle for o in gc.get_objects())
        collect()
        assert not any(type(o) is Cycle for o in gc.get_objects())
    assert gc.get_freeze_count() == 0 and gc.collect is not None and gc.collect() >= 0


def test_optimizer_averages_kept_apart_leave_weights_raw():
    """Fitted in the block, an optimizer with moving averages leaves the raw weights: those of the same
    fit without averages, and not those of the same fit outside the block (the averages)."""
    x, y = np.arange(8, dtype="float32").reshape(4, 2) / 8, np.ones((4, 1), "float32")

    def fitted(use_ema: bool, kept_apart: bool) -> np.ndarray:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
        model.compile(keras.optimizers.SGD(0.1, use_ema=use_ema, ema_momentum=0.5), "mse")
        with compat.optimizer_averages_kept_apart(model.optimizer) if kept_apart else contextlib.nullcontext():
            model.fit(x, y, epochs=3, batch_size=2, shuffle=False, verbose=0)
        assert "finalize_variable_values" not in vars(model.optimizer)  # the optimizer's own again
        return keras.ops.convert_to_numpy(model.weights[0])

    raw = fitted(use_ema=False, kept_apart=False)
    np.testing.assert_allclose(fitted(use_ema=True, kept_apart=True), raw, rtol=1e-6)
    assert not np.allclose(fitted(use_ema=True, kept_apart=False), raw, rtol=1e-3)


def test_a_saved_model_holds_each_weight_once_with_the_shim(tmp_path):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the shim is TensorFlow's (JAX's archive holds its own arrays)")
    import tensorflow as tf
    from keras.export import ExportArchive

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(20_000)])  # 240 kB of kernel
    sizes = []
    for shim in (False, True):
        archive = ExportArchive()
        archive.track_and_add_endpoint("serve", model, [keras.InputSpec(shape=(None, 3), dtype="float32")])
        if shim:
            compat.saved_model_weights_once(archive)
        archive.write_out(str(tmp_path / str(shim)), verbose=False)
        loaded = tf.saved_model.load(str(tmp_path / str(shim)))
        data = (tmp_path / str(shim) / "variables").glob("variables.data-*")
        sizes.append(round(sum(path.stat().st_size for path in data) / 240_000))  # in kernels
        np.testing.assert_allclose(loaded.serve(np.ones((1, 3), "float32")), model(np.ones((1, 3))), rtol=1e-6)
    assert sizes[0] >= 2 and sizes[1] == 1, f"the SavedModel's weights without and with the shim, in kernels: {sizes}"


def test_int8_products_are_fast_where_an_x86_cpu_has_vnni():
    if not os.path.isfile("/proc/cpuinfo") or not processor.is_x86():
        assert compat.int8_products_are_fast()
        return
    flags = next(line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags"))
    on_gpu = keras.backend.backend() == "torch" and __import__("torch").cuda.is_available()
    assert compat.int8_products_are_fast() == (on_gpu or "avx512_vnni" in flags or "avx_vnni" in flags)
