"""How fast could the ViT benchmark train at best on this machine? The speed of its matrix products.

    python benchmarks/matmul_ceiling.py

Times, on each backend (one process each), the three matrix products of the ViT benchmark's
blocks (`vit.py`: 32 images of 65 tokens, 192 wide, MLP 768): (2080 x 192) @ (192 x 768),
(2080 x 768) @ (768 x 192) and (2080 x 192) @ (192 x 192), compiled as the backend trains (XLA on
JAX and TensorFlow, eager PyTorch), and NumPy's for reference. It counts the floating-point
operations of one keras_tfm ViT training step (forward and backward, batch 32) with XLA's cost
analysis (JAX), and prints the images/s that a step would reach if all of them ran at the
backend's fastest product: no training step can be faster, since the products are the fastest work in it.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_worker  # noqa: E402
from vit import BATCH, CONFIG  # noqa: E402

TOKENS = BATCH * ((CONFIG["image_size"] // CONFIG["patch_size"]) ** 2 + 1)
SHAPES = [(TOKENS, CONFIG["hidden_dim"], CONFIG["intermediate_dim"]),
          (TOKENS, CONFIG["intermediate_dim"], CONFIG["hidden_dim"]),
          (TOKENS, CONFIG["hidden_dim"], CONFIG["hidden_dim"])]


def products(backend: str) -> list[float]:
    """GFLOP/s of each product in SHAPES: the best of 5 windows of 50."""
    import numpy as np

    rng = np.random.default_rng(0)
    rates = []
    for m, k, n in SHAPES:
        a, b = rng.standard_normal((m, k), dtype="float32"), rng.standard_normal((k, n), dtype="float32")
        if backend == "numpy":
            multiply, wait = np.matmul, lambda result: None
        elif backend == "jax":
            import jax

            a, b = jax.numpy.asarray(a), jax.numpy.asarray(b)
            multiply, wait = jax.jit(lambda x, y: x @ y), jax.block_until_ready
        elif backend == "tensorflow":
            import tensorflow as tf

            a, b = tf.constant(a), tf.constant(b)
            multiply, wait = tf.function(lambda x, y: x @ y, jit_compile=True), lambda result: result.numpy()
        else:
            import torch

            a, b = torch.from_numpy(a), torch.from_numpy(b)
            multiply, wait = torch.matmul, lambda result: None
        wait(multiply(a, b))
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(50):
                result = multiply(a, b)
            wait(result)
            best = min(best, (time.perf_counter() - start) / 50)
        rates.append(2 * m * k * n / best / 1e9)
    return rates


def step_gflop() -> float:
    """XLA's count of one keras_tfm ViT training step's floating-point operations (JAX)."""
    import jax
    import keras

    import keras_tfm

    model = keras_tfm.ViT(**CONFIG)
    model.build()
    trainable = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step_loss(trainable, images, labels):
        return loss(labels, model.stateless_call(trainable, others, images, training=True)[0])

    images = jax.numpy.zeros((BATCH, CONFIG["image_size"], CONFIG["image_size"], 3))
    labels = jax.numpy.zeros((BATCH,), "int32")
    cost = jax.jit(jax.grad(step_loss)).lower(trainable, images, labels).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"] / 1e9


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        _, backend, task = sys.argv[2:5]
        print(json.dumps({"gflop": step_gflop()} if task == "count" else {"rates": products(backend)}), flush=True)
        return
    counted = run_worker(__file__, "jax", ["-", "jax", "count"])
    if "error" in counted:
        sys.exit(f"counting failed: {counted['error']}")
    per_image = counted["gflop"] / BATCH
    print(f"\nOne keras_tfm ViT training step (batch {BATCH}, forward and backward): {counted['gflop']:.2f} GFLOP "
          f"(XLA's cost analysis), {per_image:.3f} GFLOP per image.\n")
    header = " | ".join(f"{m}x{k} @ {k}x{n}" for m, k, n in SHAPES)
    print(f"| backend | {header} (GFLOP/s) | images/s at the fastest product |")
    print("|---|" + "---|" * (len(SHAPES) + 1))
    for backend in ("numpy", "jax", "tensorflow", "torch"):
        result = run_worker(__file__, "jax" if backend == "numpy" else backend, ["-", backend, "products"])
        if "error" in result:
            print(f"| {backend} | failed: {result['error'][0][:80]} |" + " |" * len(SHAPES))
            continue
        rates = result["rates"]
        print(f"| {backend} | " + " | ".join(f"{rate:.0f}" for rate in rates) + f" | {max(rates) / per_image:.0f} |")


if __name__ == "__main__":
    main()
