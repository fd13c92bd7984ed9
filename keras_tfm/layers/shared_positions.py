"""What the attention layers of one decoding call compute alike from positions alone: the rotation of the
new tokens (`RotaryEmbedding.angles`) and which keys each query sees (`position_mask`).

Inside `computed_once()` the first layer that asks computes each, and the others reuse it. XLA and PyTorch's
trace simplification merge the repeats anyway, so this saves tracing, not arithmetic: a 30-layer decoding
step of SmolLM2's shape is a fifth fewer TensorFlow graph operations (7,206 to 5,814), and its trace takes
1.6 s instead of 2.1. The block must enclose one trace (one model call): a value kept past it would belong
to a graph that has ended.

Example:

>>> import numpy as np
>>> from keras_tfm.layers import shared_positions
>>> with shared_positions.computed_once():
...     first = shared_positions.shared(("positions",), (4,), lambda: np.arange(4))
...     again = shared_positions.shared(("positions",), (4,), lambda: np.arange(4))
>>> first is again
True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import numpy as np

_LOCAL = threading.local()  # a server traces on two threads at once, each its own model call


@contextlib.contextmanager
def computed_once():
    """Inside this block `shared` computes each value once; a block inside another shares the outer's."""
    outer = getattr(_LOCAL, "values", None)
    _LOCAL.values = {} if outer is None else outer
    try:
        yield
    finally:
        _LOCAL.values = outer


def shared(key: tuple, inputs: tuple, compute: Callable):
    """`compute()`; inside `computed_once`, the value computed earlier in the block for the same `key` (plain
    values) and the same `inputs` (numbers by value, tensors by identity)."""
    values = getattr(_LOCAL, "values", None)
    if values is None:
        return compute()
    full_key = key + tuple(_identity(value) for value in inputs)
    if full_key not in values:
        values[full_key] = (inputs, compute())  # the inputs kept alive: no other object takes their ids
    return values[full_key][1]


def _identity(value):
    if value is None or isinstance(value, (bool, int, float, str, np.integer)):
        return value
    return ("object", id(value))
