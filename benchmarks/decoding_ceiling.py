"""Decoding beside the bound of its matrix products, on this machine: a SmolLM2-135M-shaped model (random
weights, float32), 1, 4 and 16 rows at once, each a 128-token prompt, then 128 new tokens, greedy; each
contender in its own process, and the decoding rate alone (new tokens of every row after the first / their
seconds, as llama.cpp counts its own):

- llama.cpp on the model written as an F32 GGUF file (`serving_llama_cpp`): `llama-server` with one slot for one
  row, `llama-batched-bench` (built beside it: `make llama-batched-bench`) for several;
- keras_tfm's `generate` on JAX and on PyTorch, the rows as one batch;
- the bound: only the model's matrix products, each weight read once per step (no attention, norms or cache),
  in JAX (one `jax.jit` loop, as `generate` compiles), in PyTorch (eager products, as its traced step runs
  them) and in NumPy (its BLAS's matrix-vector and matrix products).

Where the bound of a framework is below llama.cpp's rate, no decoding loop in that framework can reach it.

    python benchmarks/decoding_ceiling.py --llama-server PATH/llama-server [--rows 1 4 16]

Writes benchmarks/results/decoding_ceiling.json; its titles name the processor's vector flags.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, Timer, write_results  # noqa: E402

PROMPT, NEW, REPEATS = 128, 128, 3
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")


def rate(decode_seconds, rows: int) -> dict:
    """New tokens/s after the first: `decode_seconds(n)` decodes n new tokens in each of `rows` rows; the
    best of REPEATS of `rows * (NEW - 1) / (seconds(NEW) - seconds(1))`, after a call of each that compiles."""
    decode_seconds(1), decode_seconds(NEW)
    rates = [rows * (NEW - 1) / (decode_seconds(NEW) - decode_seconds(1)) for _ in range(REPEATS)]
    return {"value": max(rates), "windows": [round(r, 1) for r in rates]}


def keras_tfm_generate(rows: int) -> dict:
    from decoder_lm import CONFIG, smollm_shaped

    model = smollm_shaped(PROMPT + NEW)
    prompt = np.random.default_rng(rows).integers(0, CONFIG["vocabulary_size"], (rows, PROMPT)).astype("int32")

    def seconds(new: int) -> float:
        with Timer() as timer:
            model.generate(prompt, max_new_tokens=new)
        return timer.seconds

    return rate(seconds, rows)


def weights():
    """Each layer's seven projections and the tied token table, SmolLM2-135M's shapes, as NumPy float32."""
    from decoder_lm import CONFIG

    hidden, inner = CONFIG["hidden_dim"], CONFIG["intermediate_dim"]
    kv = hidden // CONFIG["num_heads"] * CONFIG["num_key_value_heads"]
    shapes = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden), (hidden, inner), (hidden, inner),
              (inner, hidden)]  # fmt: skip
    rng = np.random.default_rng(0)
    layers = [[rng.normal(size=s).astype("float32") * 0.02 for s in shapes] for _ in range(CONFIG["num_layers"])]
    return layers, rng.normal(size=(CONFIG["vocabulary_size"], hidden)).astype("float32") * 0.02


def products_only(framework: str, rows: int) -> dict:
    """The matrix products of `NEW` decoding steps of `rows` rows alone, in `framework` (jax, torch or numpy)."""
    layers, table = weights()
    hidden, kv = layers[0][0].shape[0], layers[0][1].shape[1]
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        layers, table = jax.device_put((layers, table))

        def step(h):
            for query, key, value, output, gate, up, down in layers:
                h = h + (h @ query + jnp.pad(h @ key + h @ value, ((0, 0), (0, hidden - kv)))) @ output
                h = h + (jax.nn.silu(h @ gate) * (h @ up)) @ down
            return h + (h @ table.T)[:, :hidden] * 1e-3

        compiled = {n: jax.jit(lambda h, n=n: jax.lax.fori_loop(0, n, lambda _, h: step(h), h)) for n in (1, NEW)}
        start = jnp.ones((rows, hidden), "float32")

        def seconds(new: int) -> float:
            with Timer() as timer:
                compiled[new](start).block_until_ready()
            return timer.seconds

        return rate(seconds, rows)
    matmul, silu, pad, start, context = _eager_operations(framework, (rows, hidden))
    if framework == "torch":
        import torch

        layers, table = [[torch.from_numpy(w) for w in layer] for layer in layers], torch.from_numpy(table)

    def seconds(new: int) -> float:
        h = start
        with Timer() as timer, context():
            for _ in range(new):
                for query, key, value, output, gate, up, down in layers:
                    attended = matmul(h, query) + pad(matmul(h, key) + matmul(h, value), hidden - kv)
                    h = h + matmul(attended, output)
                    h = h + matmul(silu(matmul(h, gate)) * matmul(h, up), down)
                h = h + matmul(h, table.T)[:, :hidden] * 1e-3
        return timer.seconds

    return rate(seconds, rows)


def _eager_operations(framework: str, shape: tuple[int, int]) -> tuple:
    """`(matmul, silu, pad, first input of `shape`, context)` of eager PyTorch (its float32 products on the
    kernel keras_tfm's decoding step runs them on: `compat.decoding_linear`) or NumPy."""
    if framework == "torch":
        import torch

        from keras_tfm.compat import decoding_linear

        onednn = decoding_linear()
        matmul = (lambda x, w: onednn(x, w.t())) if onednn is not None else torch.matmul
        pad = lambda x, width: torch.nn.functional.pad(x, (0, width))  # noqa: E731
        return matmul, torch.nn.functional.silu, pad, torch.ones(shape), torch.no_grad
    pad = lambda x, width: np.pad(x, ((0, 0), (0, width)))  # noqa: E731
    return np.matmul, lambda x: x / (1 + np.exp(-x)), pad, np.ones(shape, "float32"), contextlib.nullcontext


def llama_cpp(binary: str, path: str) -> dict:
    """llama-server with one slot: its own decoding rate (`timings.predicted_per_second`) of NEW greedy tokens
    after a PROMPT-token prompt, the best of REPEATS after one request that warms it."""
    import httpx
    from serving_llama_cpp import FIRST, SPECIAL, free_port, start

    port = free_port()
    command = [binary, "-m", path, "--port", str(port), "-np", "1", "-c", str(2 * (PROMPT + NEW)), "-t",
               str(os.cpu_count()), "--no-webui"]  # fmt: skip
    process, _, _ = start(command, port, {**os.environ, "LD_LIBRARY_PATH": os.path.dirname(binary)})
    try:
        ids = np.random.default_rng(0).integers(0, 49152 - len(SPECIAL), PROMPT - 1)  # the word-start mark is one
        body = {"prompt": "".join(chr(FIRST + i) for i in ids), "n_predict": NEW, "temperature": 0.0,
                "ignore_eos": True, "cache_prompt": False}  # fmt: skip
        rates = []
        for _ in range(REPEATS + 1):
            answer = httpx.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=600).json()
            assert answer["timings"]["predicted_n"] == NEW, answer["timings"]
            rates.append(answer["timings"]["predicted_per_second"])
        return {"value": max(rates[1:]), "windows": [round(r, 1) for r in rates[1:]]}
    finally:
        process.terminate()
        process.wait()


def llama_cpp_batched(binary: str, path: str, rows: int) -> dict:
    """llama-batched-bench: `rows` sequences of a PROMPT-token prompt, then NEW tokens each, decoded at once; its
    own decoding rate (`speed_tg`: every sequence's new tokens over the decoding's seconds), the best of REPEATS."""
    command = [binary, "-m", path, "-c", str(rows * (PROMPT + NEW)), "-npp", str(PROMPT), "-ntg", str(NEW),
               "-npl", str(rows), "-t", str(os.cpu_count()), "--output-format", "jsonl"]  # fmt: skip
    environment = {**os.environ, "LD_LIBRARY_PATH": os.path.dirname(binary)}
    rates = []
    for _ in range(REPEATS):
        done = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
        rates.append(json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])["speed_tg"])
    return {"value": max(rates), "windows": [round(r, 1) for r in rates]}


WORKERS = {"keras_tfm": keras_tfm_generate, "products": products_only, "llama_cpp": llama_cpp,
           "llama_cpp_batched": llama_cpp_batched}  # fmt: skip


def measured(name: str, task: str, contender: str, backend: str = "jax", **arguments) -> dict:
    """`WORKERS[contender](**arguments)` in a fresh process with `KERAS_BACKEND=backend`."""
    environment = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, __file__, "--worker", contender, json.dumps(arguments)]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{task}, {name}: {result['value']:.1f} new tokens/s {result['windows']}", flush=True)
    return {"contender": name, "task": task, "unit": "new tokens/s", **result}


def cpu_flags() -> list[str]:
    with open("/proc/cpuinfo") as file:
        flags = next(line.split(":", 1)[1].split() for line in file if line.startswith("flags"))
    return [flag for flag in FLAGS if flag in flags]


def task_of(rows: int) -> str:
    return "single_stream" if rows == 1 else f"rows_{rows}"


def contenders(rows: int, llama: dict) -> list[dict]:
    """Every contender's result at `rows` rows, llama.cpp's first (`llama`: its binary and the GGUF file), each
    compared with it."""
    task = task_of(rows)
    if rows == 1:
        results = [measured("llama.cpp llama-server, one slot", task, "llama_cpp", **llama)]
    else:
        results = [measured("llama.cpp llama-batched-bench", task, "llama_cpp_batched", **llama, rows=rows)]
    for backend in ("jax", "torch"):
        results.append(measured(f"keras_tfm generate ({backend})", task, "keras_tfm", backend, rows=rows))
    for framework in ("jax", "torch", "numpy"):
        results.append(
            measured(f"matrix products only ({framework})", task, "products", framework=framework, rows=rows)
        )
    for result in results:
        result["vs_llama_cpp"] = f"{result['value'] / results[0]['value']:.2f}x"
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", help="the llama-server binary (llama-batched-bench beside it for --rows > 1)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16], help="rows decoded at once")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker[0]](**json.loads(args.worker[1]))))
        return
    if not args.llama_server:
        parser.error("--llama-server is required")
    server = os.path.abspath(args.llama_server)
    batched = os.path.join(os.path.dirname(server), "llama-batched-bench")
    if any(rows > 1 for rows in args.rows) and not os.path.exists(batched):
        parser.error(f"--rows above 1 need {batched} (in llama.cpp's build folder: make llama-batched-bench)")
    from serving_llama_cpp import write_gguf

    flags, results, tasks = cpu_flags(), [], {}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "smollm2-135m-shape-f32.gguf")
        write_gguf(path)
        for rows in args.rows:
            results += contenders(rows, {"binary": server if rows == 1 else batched, "path": path})
            tasks[task_of(rows)] = (
                f"Decoding alone, SmolLM2-135M shape (float32), {rows} row{'s' * (rows > 1)} at once, each a "
                f"{PROMPT}-token prompt + {NEW} new tokens, greedy; CPU flags: {', '.join(flags) or 'none of ' + ', '.join(FLAGS)}"
            )
    write_results("decoding_ceiling", results, tasks=tasks)


if __name__ == "__main__":
    main()
