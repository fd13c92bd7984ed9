"""Single-stream decoding beside the bound of its matrix products, on this machine: a SmolLM2-135M-shaped model
(random weights, float32), batch 1, a 128-token prompt, then 128 new tokens, greedy; each contender in its own
process, and the decoding rate alone (new tokens after the first / their seconds, as llama.cpp's
`timings.predicted_per_second` counts them):

- llama.cpp: `llama-server` with one slot on the model written as an F32 GGUF file (`serving_llama_cpp`);
- keras_tfm's `generate` on JAX and on PyTorch;
- the bound: only the model's matrix products, each weight read once per new token (no attention, norms or
  cache), in JAX (one `jax.jit` loop, as `generate` compiles), in PyTorch (eager products, as its traced step
  runs them) and in NumPy (its BLAS's matrix-vector products).

Where the bound of a framework is below llama.cpp's rate, no decoding loop in that framework can reach it.

    python benchmarks/decoding_ceiling.py --llama-server PATH/llama-server

Writes benchmarks/results/decoding_ceiling.json; its title names the processor's vector flags.
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


def rate(decode_seconds) -> dict:
    """New tokens/s after the first: `decode_seconds(n)` decodes n new tokens; the best of REPEATS of
    `(NEW - 1) / (seconds(NEW) - seconds(1))`, after a call of each that compiles."""
    decode_seconds(1), decode_seconds(NEW)
    rates = [(NEW - 1) / (decode_seconds(NEW) - decode_seconds(1)) for _ in range(REPEATS)]
    return {"value": max(rates), "windows": [round(r, 1) for r in rates]}


def keras_tfm_generate() -> dict:
    from decoder_lm import prompt_ids, smollm_shaped

    model = smollm_shaped(PROMPT + NEW)
    prompt = prompt_ids().astype("int32")[:, :PROMPT]

    def seconds(new: int) -> float:
        with Timer() as timer:
            model.generate(prompt, max_new_tokens=new)
        return timer.seconds

    return rate(seconds)


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


def products_only(framework: str) -> dict:
    """The matrix products of `NEW` decoding steps alone, in `framework` (jax, torch or numpy)."""
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
        start = jnp.ones((1, hidden), "float32")

        def seconds(new: int) -> float:
            with Timer() as timer:
                compiled[new](start).block_until_ready()
            return timer.seconds

        return rate(seconds)
    matmul, silu, pad, start, context = _eager_operations(framework, hidden)
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

    return rate(seconds)


def _eager_operations(framework: str, hidden: int) -> tuple:
    """`(matmul, silu, pad, first input, context)` of eager PyTorch (its float32 products on the kernel
    keras_tfm's decoding step runs them on: `compat.decoding_linear`) or NumPy."""
    if framework == "torch":
        import torch

        from keras_tfm.compat import decoding_linear

        onednn = decoding_linear()
        matmul = (lambda x, w: onednn(x, w.t())) if onednn is not None else torch.matmul
        pad = lambda x, width: torch.nn.functional.pad(x, (0, width))  # noqa: E731
        return matmul, torch.nn.functional.silu, pad, torch.ones((1, hidden)), torch.no_grad
    pad = lambda x, width: np.pad(x, ((0, 0), (0, width)))  # noqa: E731
    return np.matmul, lambda x: x / (1 + np.exp(-x)), pad, np.ones((1, hidden), "float32"), contextlib.nullcontext


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


def worker(contender: str, argument: str) -> dict:
    if contender == "keras_tfm":
        return keras_tfm_generate()
    if contender == "products":
        return products_only(argument)
    return llama_cpp(*argument.split(os.pathsep))


def measured(name: str, contender: str, argument: str, backend: str = "jax") -> dict:
    """`worker(contender, argument)` in a fresh process with `KERAS_BACKEND=backend`."""
    environment = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, __file__, "--worker", contender, argument], env=environment,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{name}: {result['value']:.1f} new tokens/s {result['windows']}", flush=True)
    return {"contender": name, "task": "single_stream", "unit": "new tokens/s", **result}


def cpu_flags() -> list[str]:
    with open("/proc/cpuinfo") as file:
        flags = next(line.split(":", 1)[1].split() for line in file if line.startswith("flags"))
    return [flag for flag in FLAGS if flag in flags]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", help="the llama-server binary")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    if not args.llama_server:
        parser.error("--llama-server is required")
    from serving_llama_cpp import write_gguf

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "smollm2-135m-shape-f32.gguf")
        write_gguf(path)
        binary = os.path.abspath(args.llama_server)
        results = [measured("llama.cpp llama-server, one slot", "llama_cpp", os.pathsep.join([binary, path]))]
    for backend in ("jax", "torch"):
        results.append(measured(f"keras_tfm generate ({backend})", "keras_tfm", "", backend))
    for framework in ("jax", "torch", "numpy"):
        results.append(measured(f"matrix products only ({framework})", "products", framework))
    llama, flags = results[0]["value"], cpu_flags()
    for result in results:
        result["vs_llama_cpp"] = f"{result['value'] / llama:.2f}x"
    title = (f"Decoding alone, SmolLM2-135M shape (float32), batch 1, {PROMPT}-token prompt + {NEW} new tokens, "
             f"greedy; CPU flags: {', '.join(flags) or 'none of ' + ', '.join(FLAGS)}")  # fmt: skip
    write_results("decoding_ceiling", results, tasks={"single_stream": title})


if __name__ == "__main__":
    main()
