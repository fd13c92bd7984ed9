"""Building a model whose weights a checkpoint is about to replace, without paying for its initial values.

Keras runs every variable's initializer when a model is built: for an 8B model, 8 billion random numbers
(most of the load time on JAX) drawn in float32 before the cast to bfloat16 (a peak of twice the weights).
Inside `checkpoint_values()` variables start as zeros; those the converter never assigns (a new
classifier head, a seed generator's state) get their own initializer's values when the block ends, so the
model is the same as one built normally and then loaded. Keras has no public switch for this: the block
wraps Keras' variable class for the process while it is open (`compat.variables_made_as_zeros`).

`assign(variable, array)` sets a variable from a NumPy array without the copies Keras' `assign` makes
(a bfloat16 array goes through float32 on PyTorch and TensorFlow: three times the tensor at once).
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import warnings

import keras
import numpy as np

from keras_tfm import compat

_PENDING: list[dict] = []  # per open `checkpoint_values` block: id -> (variable, initializer) not yet assigned


@contextlib.contextmanager
def checkpoint_values():
    """Variables made in this block start as zeros; at its end, those never assigned take their
    initializer's values (nothing is initialized when the block raises: its model is thrown away).
    Process-wide while open (`compat.variables_made_as_zeros`)."""
    with compat.variables_made_as_zeros() as pending:
        _PENDING.append(pending)
        try:
            yield
        finally:
            _PENDING.remove(pending)
    for variable, initializer in pending.values():
        variable.assign(initializer(variable.shape, dtype=variable.dtype))


def assign(variable, array: np.ndarray) -> None:
    """`variable.assign(array)` without the copies Keras' `assign` makes of a large array (it converts twice
    on JAX; a bfloat16 array goes through float32 on PyTorch and TensorFlow): on PyTorch copied straight
    into the variable's storage, on TensorFlow a slice at a time into it, on JAX one copy to the device."""
    backend = keras.backend.backend()
    if not isinstance(array, np.ndarray) or backend not in ("jax", "tensorflow", "torch"):
        variable.assign(array)
        return
    if tuple(array.shape) != tuple(variable.shape):
        raise ValueError(f"cannot assign an array of shape {array.shape} to {variable.path} of {variable.shape}")
    if backend == "jax":
        _assign_jax(variable, array)
    else:
        (_assign_torch if backend == "torch" else _assign_tensorflow)(variable.value, array)
        _assigned(variable)


def _assign_jax(variable, array: np.ndarray) -> None:
    import jax

    variable.assign(jax.device_put(array))  # Keras' own conversion of the array copies it twice
    if array.nbytes > 1 << 20:  # one array at a time, and its freed buffers back from the C library
        variable.value.block_until_ready()
        return_freed_memory()


def _assign_torch(tensor, array: np.ndarray) -> None:
    import torch

    with warnings.catch_warnings():  # a read-only array (a memory-mapped file's) is only read here
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        if array.dtype.name == "bfloat16":  # PyTorch reads no NumPy bfloat16: its bits, viewed as one
            source = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            source = torch.from_numpy(array)
    with torch.no_grad():
        tensor.copy_(source)


def _assign_tensorflow(tf_variable, array: np.ndarray, slice_bytes: int = 1 << 22) -> None:
    if array.ndim == 0 or array.nbytes <= slice_bytes:
        tf_variable.assign(_tensorflow_tensor(array, tf_variable.dtype))
        return
    import tensorflow as tf

    rows = max(1, slice_bytes * len(array) // array.nbytes)
    for start in range(0, len(array), rows):  # rows scattered in place: a slice's assign copied the variable
        part = _tensorflow_tensor(array[start : start + rows], tf_variable.dtype)
        tf_variable.scatter_update(tf.IndexedSlices(part, tf.range(start, start + part.shape[0])))


def _tensorflow_tensor(array: np.ndarray, dtype):
    """`array` as a TensorFlow tensor of `dtype`: TensorFlow reads NumPy's bfloat16 through float32, its bits
    it takes as they are."""
    import tensorflow as tf

    if array.dtype.name == "bfloat16":
        return tf.cast(tf.bitcast(tf.convert_to_tensor(array.view(np.uint16)), tf.bfloat16), dtype)
    return tf.cast(tf.convert_to_tensor(array), dtype)


def assign_part(variable, index: tuple, array: np.ndarray) -> bool:
    """`variable[index] = array` in the variable's own storage, on PyTorch and TensorFlow; False on JAX,
    whose arrays cannot change in place (assign the whole value there)."""
    backend = keras.backend.backend()
    if backend == "torch":
        _assign_torch(variable.value[index], array)
    elif backend == "tensorflow":
        variable.value[index].assign(_tensorflow_tensor(array, variable.value.dtype))
    else:
        return False
    _assigned(variable)
    return True


def _assigned(variable) -> None:
    """`variable` holds the checkpoint's values: `checkpoint_values` leaves it as it is."""
    for pending in _PENDING:
        pending.pop(id(variable), None)


def return_freed_memory() -> None:
    """Hands memory freed while loading back to the system: glibc keeps freed blocks of a few MB in its
    arenas (JAX's process grew by each replaced kernel, 1.6x the weights at the end of a load)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # another C library
            pass
