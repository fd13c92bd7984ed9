"""One residual sub-layer of a block, pre- or post-norm, and the boundary that makes XLA compute the residual
stream once."""

from __future__ import annotations

import keras

from keras_tfm.compat import on_xla_cpu


def residual(x, sublayer, norm, dropout, norm_first: bool, training, normalized=None):
    """One residual sub-layer, pre- or post-norm. `sublayer` may return `(y, *extras)`. `normalized`:
    `norm(x)`, when the caller has it already (pre-norm)."""
    if norm_first:
        out = sublayer(norm(x) if normalized is None else normalized)
    else:
        out = sublayer(x)
    extras = ()
    if isinstance(out, tuple):
        out, *extras = out
    out = x + dropout(out, training=training)
    out = out if norm_first else norm(out)
    return (_computed_once(out) if training else out), tuple(extras)


def _computed_once(x):
    """`x` itself, which XLA (JAX, TensorFlow) must now compute once.

    Without this, XLA's CPU compiler keeps the residual stream as an expression (the sum of every
    earlier sub-layer's output) and fuses it into each consumer: LayerNorm statistics, the next residual
    add, and in the backward pass the transposed copies the weight gradients read. That recomputation
    grows with depth (in a 4-layer GPT's training step, a fifth of the time went to such fusions).
    `optimization_barrier` does not help on CPU (removed before fusion); a conditional is a boundary XLA
    does not fuse across, forward or backward. Both branches return `x` (as two different computations:
    JAX drops a conditional whose branches are the same). Training only: in the decoding loops the
    conditionals cost more than they save. Measured with `benchmarks/gpt.py` on XLA:CPU only, so
    only there (`compat.on_xla_cpu`): GPUs and TPUs, and PyTorch (eager), get the plain graph.
    """
    if not on_xla_cpu():
        return x
    first = keras.ops.reshape(x, (-1,))[0]
    return keras.ops.cond(keras.ops.isfinite(first), lambda: x, lambda: keras.ops.copy(x))
