"""Rematerialization: a layer's activations recomputed in the backward pass instead of stored.

A block with `remat=True` keeps only its inputs for the backward pass and runs its forward pass
again there: one more forward pass of the block (0.7-0.9x the training speed on TensorFlow and PyTorch,
`benchmarks/remat.py`) for the memory of every activation inside it (attention weights, the
feed-forward network's wide hidden layer), which lets a longer context or a larger batch fit.
On JAX, XLA's CPU compiler drops `jax.checkpoint`'s optimization barriers and merges the
recomputation back into the forward pass, so there it changes nothing on a CPU; XLA on GPUs keeps it.

Keras' own `keras.RematScope` is not enough for these blocks: on TensorFlow it refuses any call
with keyword arguments under `jit_compile` ("custom_gradient ... keywords arguments only when eager
execution is enabled"), on JAX it fails on Python arguments and on dropout ("'str' object has no
attribute '_error_repr'", escaped tracers), and on PyTorch a seeded `Dropout` draws a new mask when
it is recomputed (it advances its seed each time it runs: measured, the weights after one step differ
from those trained without rematerialization). Here every Python argument is closed over, only
tensors go through `keras.remat`, and the dropout seeds are read before the block runs and given to
both passes, so that the recomputation is the same computation and the gradients are exact.
"""

from __future__ import annotations

import functools

import keras

from keras_tfm.compat import get_keras_mask, get_stateless_scope, set_keras_mask

_SEED_STATE = "seed_generator_state"  # the variable name of every `keras.random.SeedGenerator`'s state


def rematerializable(call):
    """Decorates a layer's `call`: when `layer.remat` is true and the layer is training, the call is
    rematerialized (`keras.remat`) with the same dropout masks in both passes."""

    @functools.wraps(call)
    def maybe_rematerialized(layer, *args, **kwargs):
        if not (layer.remat and kwargs.get("training") is True):
            return call(layer, *args, **kwargs)
        return rematerialized_call(layer, functools.partial(call, layer), args, kwargs)

    return maybe_rematerialized


def rematerialized_call(layer: keras.layers.Layer, call, args: tuple, kwargs: dict):
    """`call(*args, **kwargs)` through `keras.remat`, for `layer`'s `call` in training."""
    leaves = keras.tree.flatten((args, kwargs))
    is_input = [keras.ops.is_tensor(leaf) for leaf in leaves]
    tensors = [leaf for leaf, tensor in zip(leaves, is_input) if tensor]
    if any(isinstance(tensor, keras.KerasTensor) for tensor in tensors):
        return call(*args, **kwargs)  # a symbolic call: nothing to store
    masks = [get_keras_mask(tensor) for tensor in tensors]
    masked = [i for i, mask in enumerate(masks) if mask is not None]

    # The seeds the block's dropout layers will draw from, as values: both passes start from them.
    # A copy, because PyTorch assigns variables in place.
    seed_states = [v for v in layer.non_trainable_variables if v.name == _SEED_STATE]
    seeds = [keras.ops.copy(v.value) for v in seed_states]
    # In a stateless training step (JAX), the layer's weights are values of the enclosing scope.
    outer_scope = get_stateless_scope()
    outer_values = (
        []
        if outer_scope is None
        else [
            (v, outer_scope.get_current_value(v))
            for v in layer.variables
            if v.name != _SEED_STATE and outer_scope.get_current_value(v) is not None
        ]
    )
    num_tensors, num_seeds = len(tensors), len(seeds)
    traced = {}  # what the forward pass returned: its structure, and the positions of masked outputs

    def forward(*inputs):
        inputs = [_from_transport(x, dtype) for x, dtype in zip(inputs, input_dtypes)]
        inner_tensors = list(inputs[:num_tensors])
        for i, mask in zip(masked, inputs[num_tensors + num_seeds :]):
            set_keras_mask(inner_tensors[i], mask)
        inner = iter(inner_tensors)
        a, k = keras.tree.pack_sequence_as(
            (args, kwargs), [next(inner) if tensor else leaf for leaf, tensor in zip(leaves, is_input)]
        )
        # The seed updates stay in this scope; the caller applies them once, after the call.
        with keras.StatelessScope(
            outer_values + list(zip(seed_states, inputs[num_tensors : num_tensors + num_seeds]))
        ) as scope:
            outputs = call(*a, **k)
        flat_outputs = keras.tree.flatten(outputs)
        traced["structure"] = outputs
        traced["masked"] = [i for i, x in enumerate(flat_outputs) if get_keras_mask(x) is not None]
        new_seeds = [scope.get_current_value(v) for v in seed_states]
        traced["dtypes"] = [x.dtype for x in flat_outputs]
        output_masks = [get_keras_mask(flat_outputs[i]) for i in traced["masked"]]
        traced["mask_dtypes"] = [x.dtype for x in output_masks]
        return ([_to_transport(x) for x in flat_outputs], new_seeds, [_to_transport(x) for x in output_masks])

    inputs = [*tensors, *seeds, *(masks[i] for i in masked)]
    input_dtypes = [x.dtype for x in inputs]
    flat_outputs, new_seeds, flat_masks = keras.remat(forward)(*(_to_transport(x) for x in inputs))
    flat_outputs = [_from_transport(x, dtype) for x, dtype in zip(flat_outputs, traced["dtypes"])]
    flat_masks = [_from_transport(x, dtype) for x, dtype in zip(flat_masks, traced["mask_dtypes"])]
    for variable, value in zip(seed_states, new_seeds):
        variable.assign(value)
    for i, mask in zip(traced["masked"], flat_masks):
        set_keras_mask(flat_outputs[i], mask)
    return keras.tree.pack_sequence_as(traced["structure"], flat_outputs)


def _is_bool(dtype) -> bool:
    return keras.backend.standardize_dtype(dtype) == "bool"


def _to_transport(x):
    # Masks cross the boundary as uint8: TensorFlow's `recompute_grad` takes the gradient of every
    # input and output, which fails for bool.
    return keras.ops.cast(x, "uint8") if _is_bool(x.dtype) else x


def _from_transport(x, dtype):
    return keras.ops.cast(x, "bool") if _is_bool(dtype) else x
