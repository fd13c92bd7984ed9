"""The one backend-specific place of generation: how the decoding loop and the model step are
compiled on JAX, TensorFlow and PyTorch. Everything else in `generation/` is `keras.ops` only."""

from __future__ import annotations

from typing import Callable

import keras
from keras import ops, tree


def fast_step(step: Callable, model: keras.Model) -> Callable:
    """The one-token decoding step, made fast where the loop itself is not compiled.

    PyTorch runs the loop eagerly, and there Keras' per-layer call overhead costs ~10x the math of
    a small model's step. So the one-token step is recorded once per cache shape with
    `torch.jit.trace` (the cache index stays a tensor input, so one trace serves every position)
    and replayed without Python. `torch.compile` is not used: it recompiles at every Keras layer
    boundary. Other backends compile the whole loop and get `step` back unchanged."""
    if keras.backend.backend() != "torch":
        return step
    import torch

    class _Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model  # registers the weights as parameters, not frozen constants

        def forward(self, token_ids, cache, index):
            return step(token_ids, cache, index)

    traced: dict = {}

    def run(token_ids, cache, index):
        if token_ids.shape[1] != 1:  # the prefill runs once per call: eager is fine
            return step(token_ids, cache, index)
        index = ops.convert_to_tensor(index, "int32")
        key = (tuple(token_ids.shape), *((tuple(part.shape), str(part.dtype)) for part in tree.flatten(cache)))
        if key not in traced:
            traced[key] = torch.jit.trace(_Step(), (token_ids, cache, index), check_trace=False)
        return traced[key](token_ids, cache, index)

    return run


def compile_function(fn: Callable, model: keras.Model) -> Callable:
    """Compiles `fn` once for this backend: XLA through `jax.jit` (the model's variables passed in
    as state) or `tf.function(jit_compile=True)`. PyTorch runs the loop eagerly without autograd
    (see `fast_step` for its model step)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        @jax.jit
        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                return fn(*args)

        return lambda *args: stateless([v.value for v in model.variables], *args)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)  # one trace per batch shape, like jax.jit
    import torch

    def run_without_autograd(*args):
        with torch.no_grad():
            return fn(*args)

    return run_without_autograd
