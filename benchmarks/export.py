"""What `model.export` writes and how fast each artifact runs: the SmolLM2-135M shape (random float32
weights), exported as a SavedModel (with its `generate` endpoint) from TensorFlow and JAX, and as LiteRT
and ONNX from TensorFlow. Per artifact: its size and the export's time; the logits of one 128-token
prompt in each runtime (TensorFlow's SavedModel loader, LiteRT's interpreter, onnxruntime) against
Keras' `predict_on_batch`; greedy decoding (32-token prompt, 64 new tokens) by the SavedModel's
`generate` against `model.generate`, and by the cached step (`export(..., cache_length=256)`) in LiteRT's
interpreter and onnxruntime, called from a Python loop (a prefill, then a call per token). One process
per backend and format, whose peak resident memory is the export's; each timing is the best of five.

    python benchmarks/export.py [--backends tensorflow jax]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import report, write_results  # noqa: E402

PROMPT, NEW_TOKENS, FORWARD, CACHE = 32, 64, 128, 256
STEPS = {"litert_step": "litert", "onnx_step": "onnx"}  # the cached step's workers and their formats


def best_of(run, times: int = 5) -> float:
    run()  # compiles
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def size_mb(path: str) -> float:
    if os.path.isfile(path):
        return os.path.getsize(path) / 1e6
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 1e6


def runner(format: str, path: str):
    """A function of the prompt ids that runs the artifact in its own runtime."""
    if format == "tf_saved_model":
        import tensorflow as tf

        served = tf.saved_model.load(path)
        return lambda ids: served.serve(ids).numpy(), served
    if format == "onnx":
        import onnxruntime

        inference = onnxruntime.InferenceSession(path)
        return lambda ids: inference.run(None, {"token_ids": ids})[0], inference
    from ai_edge_litert.interpreter import Interpreter

    run = Interpreter(model_path=path).get_signature_runner()
    return lambda ids: run(token_ids=ids)["output_0"], run


def step_runner(format: str, path: str):
    """The cached step `(ids, position, cache) -> (logits, cache)` in its runtime."""
    if format == "onnx":
        import onnxruntime

        inference = onnxruntime.InferenceSession(path)
        names = [output.name for output in inference.get_outputs()]

        def run(ids, position, cache):
            return tuple(inference.run(names, {"token_ids": ids, "position": position, "cache": cache}))

        return run
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path).get_signature_runner("decode")

    def run(ids, position, cache):
        outputs = runner(token_ids=ids, position=position, cache=cache)
        return outputs["logits"], outputs["updated_cache"]

    return run


def step_worker(model, worker: str, rng) -> None:
    """Exports the cached step to LiteRT or ONNX and decodes with it greedily, against `model.generate`."""
    import resource

    format = STEPS[worker]
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "step.tflite" if format == "litert" else "step.onnx")
        start = time.perf_counter()
        model.export(path, format=format, verbose=False, cache_length=CACHE)
        export_s = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
        row = {
            "task": "artifacts",
            "backend": "tensorflow",
            "format": f"{format}, cached step",
            "mb": round(size_mb(path)),
        }
        report(
            {
                **row,
                "weights_mb": round(model.count_params() * 4 / 1e6),
                "export_s": round(export_s, 1),
                "peak_rss_mb": round(peak),
            }
        )
        step = step_runner(format, path)
        attention = model.blocks[0].self_attention
        empty = np.zeros((len(model.blocks), 1, 2, attention.num_key_value_heads, CACHE, attention.key_dim), "float32")
        prompt = rng.integers(0, 49152, (1, PROMPT)).astype("int32")

        def greedy() -> np.ndarray:
            logits, cache = step(prompt, np.array(0, "int32"), empty)
            tokens = []
            for position in range(PROMPT, PROMPT + NEW_TOKENS):
                tokens.append(logits[:, -1].argmax(-1).astype("int32"))
                logits, cache = step(tokens[-1][:, None], np.array(position, "int32"), cache)
            return np.stack(tokens, axis=1)

        same = bool(np.array_equal(greedy(), model.generate(prompt, NEW_TOKENS, stop_token_ids=())[:, PROMPT:]))
        seconds = best_of(greedy, 3)
        runs = f"{'LiteRT' if format == 'litert' else 'onnxruntime'} cached step, a Python loop"
        report(
            {
                "task": "decoding",
                "backend": "tensorflow",
                "runs": runs,
                "new_tokens_per_s": round(NEW_TOKENS / seconds, 1),
                "same_tokens": same,
            }
        )


def worker(format: str) -> None:
    """Exports to `format` and runs the artifact, in a process of its own: its peak memory is the export's."""
    import resource

    import keras

    import keras_tfm

    backend = keras.backend.backend()
    rng = np.random.default_rng(0)
    model = keras_tfm.smollm2_135m(max_length=256)
    model.build()
    if format in STEPS:
        return step_worker(model, format, rng)
    ids = rng.integers(0, 49152, (1, FORWARD)).astype("int32")
    expected = model.predict_on_batch(ids)
    if format == "tf_saved_model":
        seconds = best_of(lambda: model.predict_on_batch(ids))
        report({"task": "forward", "backend": backend, "runs": "Keras predict_on_batch", "ms": round(seconds * 1e3, 1)})
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, {"tf_saved_model": "served", "litert": "m.tflite", "onnx": "m.onnx"}[format])
        start = time.perf_counter()
        settings = {"max_new_tokens": NEW_TOKENS} if format == "tf_saved_model" else {}
        model.export(path, format=format, verbose=False, **settings)
        export_s = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
        weights = model.count_params() * 4 / 1e6
        row = {"task": "artifacts", "backend": backend, "format": format, "mb": round(size_mb(path))}
        report({**row, "weights_mb": round(weights), "export_s": round(export_s, 1), "peak_rss_mb": round(peak)})
        run, served = runner(format, path)
        difference = float(np.abs(run(ids) - expected).max())
        seconds = best_of(lambda: run(ids))
        row = {"task": "forward", "backend": backend, "runs": format, "ms": round(seconds * 1e3, 1)}
        report({**row, "max_abs_difference": f"{difference:.1e}"})
        if format == "tf_saved_model":
            decoding(model, served, backend, rng)


def decoding(model, served, backend: str, rng) -> None:
    prompt = rng.integers(0, 49152, (1, PROMPT)).astype("int32")
    arguments = dict(lengths=np.array([PROMPT], "int32"), max_new_tokens=np.int32(NEW_TOKENS), seed=np.int32(0))
    exported = served.generate(token_ids=prompt, **arguments)["token_ids"].numpy()
    expected = model.generate(prompt, NEW_TOKENS, stop_token_ids=())
    same = bool(np.array_equal(exported, expected))
    for runs, run in (
        ("model.generate", lambda: model.generate(prompt, NEW_TOKENS, stop_token_ids=())),
        ("SavedModel generate", lambda: served.generate(token_ids=prompt, **arguments)["token_ids"].numpy()),
    ):
        seconds = best_of(run, 3)
        report(
            {
                "task": "decoding",
                "backend": backend,
                "runs": runs,
                "new_tokens_per_s": round(NEW_TOKENS / seconds, 1),
                "same_tokens": same,
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax"])
    parser.add_argument("--worker", choices=["tf_saved_model", "litert", "onnx", *STEPS])
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    import json
    import subprocess

    results = []
    for backend in args.backends:
        for format in ["tf_saved_model", "litert", "onnx", *STEPS] if backend == "tensorflow" else ["tf_saved_model"]:
            env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
            command = [sys.executable, __file__, "--worker", format]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3000)
            rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            for row in rows:
                print(row, flush=True)
            if done.returncode != 0:
                print(f"{backend} {format} failed ({done.returncode}):", done.stderr[-2000:])
            results += rows
    tasks = {
        "artifacts": "SmolLM2-135M shape (float32): each artifact's size, export time and peak memory",
        "forward": f"logits of one {FORWARD}-token prompt, in each runtime",
        "decoding": f"greedy decoding, {PROMPT}-token prompt + {NEW_TOKENS} new tokens, batch 1",
    }
    write_results("export", sorted(results, key=lambda row: list(tasks).index(row["task"])), tasks=tasks)


if __name__ == "__main__":
    main()
