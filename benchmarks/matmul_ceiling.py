"""How fast could a training benchmark run at best on this machine? The speed of its matrix products.

    python benchmarks/matmul_ceiling.py [--model vit|translator]

Times, on each backend (one process each), the forward matrix products of the benchmark's model,
compiled as the backend trains (XLA on JAX and TensorFlow, eager PyTorch), and NumPy's for reference:
- `vit` (`vit.py`: 32 images of 65 tokens, 192 wide, MLP 768): (2080 x 192) @ (192 x 768),
  (2080 x 768) @ (768 x 192) and (2080 x 192) @ (192 x 192);
- `translator` (`translator.py`: 64 pairs of 24 + 24 tokens, 256 wide, FFN 512, vocabulary 8000):
  (1536 x 256) @ (256 x 8000), the logits, then (1536 x 256) @ (256 x 512), (1536 x 512) @ (512 x 256)
  and (1536 x 256) @ (256 x 256).
It counts the floating-point operations of one keras_tfm training step of that model (forward and
backward) with XLA's cost analysis (JAX); for the translator, also the matrix products' operations
of ours and of Hugging Face's `MarianMTModel`, with PyTorch's `FlopCounterMode`. It prints the
examples/s (images, or target tokens) that a step would reach if all of them ran at the backend's
fastest product: an upper bound, since the products are the fastest work in a step, up to the noise
of timing each product in a call of its own (whose dispatch counts) and the machine's drift between
measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_worker, write_results  # noqa: E402


def shapes(model: str) -> list[tuple[int, int, int]]:
    if model == "vit":
        from vit import BATCH, CONFIG

        tokens, width, hidden = (
            BATCH * ((CONFIG["image_size"] // CONFIG["patch_size"]) ** 2 + 1),
            CONFIG["hidden_dim"],
            CONFIG["intermediate_dim"],
        )
        return [(tokens, width, hidden), (tokens, hidden, width), (tokens, width, width)]
    from translator import BATCH, CONFIG, LENGTH, VOCABULARY

    tokens, width, hidden = BATCH * LENGTH, CONFIG["hidden_dim"], CONFIG["intermediate_dim"]
    return [(tokens, width, VOCABULARY), (tokens, width, hidden), (tokens, hidden, width), (tokens, width, width)]


def products(backend: str, model: str) -> list[float]:
    """GFLOP/s of each product in `shapes(model)`: the best of 5 windows of 50 (10 for the logits')."""
    import numpy as np

    rng = np.random.default_rng(0)
    rates = []
    for m, k, n in shapes(model):
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
        repeats = 10 if 2 * m * k * n > 2e9 else 50  # the logits' product takes 30-80 ms
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(repeats):
                result = multiply(a, b)
            wait(result)
            best = min(best, (time.perf_counter() - start) / repeats)
        rates.append(2 * m * k * n / best / 1e9)
    return rates


def step_gflop(model: str) -> tuple[float, int, str]:
    """XLA's count of the floating-point operations of one keras_tfm training step of `model` (JAX):
    (GFLOP, examples per step, what an example is)."""
    import jax
    import keras
    import numpy as np

    import keras_tfm

    if model == "vit":
        from vit import BATCH, CONFIG

        network = keras_tfm.ViT(**CONFIG)
        inputs = np.zeros((BATCH, CONFIG["image_size"], CONFIG["image_size"], 3), "float32")
        labels, examples, unit = np.zeros((BATCH,), "int32"), BATCH, "images"
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        from translator import BATCH, LENGTH, keras_tfm_model

        network = keras_tfm_model()
        ids = np.ones((BATCH, LENGTH), "int32")
        inputs, labels = {"source_ids": ids, "target_ids": ids}, ids
        examples, unit, loss = BATCH * LENGTH, "target tokens", keras_tfm.TokenCrossEntropy()
    network(inputs)
    trainable = [v.value for v in network.trainable_variables]
    others = [v.value for v in network.non_trainable_variables]

    def step_loss(trainable, inputs, labels):
        return loss(labels, network.stateless_call(trainable, others, inputs, training=True)[0])

    cost = jax.jit(jax.grad(step_loss)).lower(trainable, inputs, labels).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"] / 1e9, examples, unit


def torch_matmul_gflop() -> dict:
    """PyTorch's count (`FlopCounterMode`: matrix products only) of one training step's floating-point
    operations, forward and backward, of the translator benchmark's keras_tfm model (PyTorch backend)
    and of Hugging Face's `MarianMTModel`."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from translator import BATCH, VOCABULARY, data, hugging_face_model, keras_tfm_model

    import keras_tfm

    source, target_in, target_out = (torch.from_numpy(a[:BATCH]).long() for a in data())
    counts = {}
    ours, loss = keras_tfm_model(), keras_tfm.TokenCrossEntropy()
    ours({"source_ids": source, "target_ids": target_in})
    with FlopCounterMode(display=False) as counter:
        loss(target_out, ours({"source_ids": source, "target_ids": target_in}, training=True)).backward()
    counts["keras_tfm"] = counter.get_total_flops() / 1e9
    theirs = hugging_face_model()
    with FlopCounterMode(display=False) as counter:
        logits = theirs(input_ids=source, decoder_input_ids=target_in).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY), target_out.reshape(-1)).backward()
    counts["hugging_face"] = counter.get_total_flops() / 1e9
    return counts


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        _, backend, task, model = sys.argv[2:6]
        if task == "count":
            gflop, examples, unit = step_gflop(model)
            print(json.dumps({"gflop": gflop, "examples": examples, "unit": unit}), flush=True)
        elif task == "torch-count":
            print(json.dumps(torch_matmul_gflop()), flush=True)
        else:
            print(json.dumps({"rates": products(backend, model)}), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        choices=["vit", "translator"],
        default="vit",
        help="the training benchmark whose products to time (default: %(default)s)",
    )
    model = parser.parse_args().model
    counted = run_worker(__file__, "jax", ["-", "jax", "count", model])
    if "error" in counted:
        sys.exit(f"counting failed: {counted['error']}")
    per_example, unit = counted["gflop"] / counted["examples"], counted["unit"]
    print(
        f"\nOne keras_tfm {model} training step ({counted['examples']} {unit}, forward and backward): "
        f"{counted['gflop']:.2f} GFLOP (XLA's cost analysis), {per_example:.3g} GFLOP per {unit[:-1]}.\n"
    )
    if model == "translator":
        matmuls = run_worker(__file__, "torch", ["-", "torch", "torch-count", model])
        if "error" in matmuls:
            sys.exit(f"counting failed: {matmuls['error']}")
        print(
            f"Its matrix products, counted by PyTorch's FlopCounterMode: keras_tfm {matmuls['keras_tfm']:.2f} GFLOP, "
            f"Hugging Face's MarianMTModel {matmuls['hugging_face']:.2f} GFLOP.\n"
        )
    header = " | ".join(f"{m}x{k} @ {k}x{n}" for m, k, n in shapes(model))
    print(f"| backend | {header} (GFLOP/s) | {unit}/s at the fastest product |")
    print("|---|" + "---|" * (len(shapes(model)) + 1))
    rows = []
    for backend in ("numpy", "jax", "tensorflow", "torch"):
        result = run_worker(__file__, "jax" if backend == "numpy" else backend, ["-", backend, "products", model])
        if "error" in result:
            print(f"| {backend} | failed: {result['error'][0][:80]} |" + " |" * len(shapes(model)))
            continue
        rates = result["rates"]
        print(f"| {backend} | " + " | ".join(f"{rate:.0f}" for rate in rates) + f" | {max(rates) / per_example:,.0f} |")
        rows.append(
            {
                "contender": backend,
                "task": "ceiling",
                "unit": f"{unit}/s at the fastest product",
                "value": max(rates) / per_example,
                **{f"{m}x{k} @ {k}x{n} GFLOP/s": rate for (m, k, n), rate in zip(shapes(model), rates)},
            }
        )
    title = f"The {model} training step's bound: {counted['gflop']:.2f} GFLOP a step at its backend's fastest product"
    write_results(f"matmul_ceiling_{model}", rows, {"ceiling": title})


if __name__ == "__main__":
    main()
