"""Decoding speed on a GPU: greedy new tokens/s of a Llama-3.2-1B-shaped model (16 layers, 32 query and
8 key/value heads, 2048 wide, SwiGLU 8192, vocabulary 128256, tied output; random weights) in bfloat16,
128-token prompts, 128 new tokens, batch 1 and 16: keras_tfm's `DecoderLM.generate` on each Keras backend
installed beside a GPU build of its framework, against transformers' `generate` on the same GPU (its
default dynamic cache, and its static cache, which transformers compiles with `torch.compile`). Each
row also gives the GPU memory the process peaked at.

    python benchmarks/gpu_decoding.py [--backends jax torch] [--quantization] [--check]

`--quantization`: what `model.quantize("int8")` does to decoding speed on the GPU: keras_tfm alone, the
SmolLM2-135M shape, batch 1, float32 and bfloat16 weights, each also quantized to int8.
`--check` runs a 2-layer model of the same layout on whatever device there is, to try the script.
Writes benchmarks/results/gpu_decoding.json or gpu_quantization.json (with --check: ..._check.json).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Timer, print_table, report, run_worker, write_results  # noqa: E402
from decoder_lm import CONFIG as SMOLLM2  # noqa: E402
from decoder_lm import hugging_face_llama, smollm_shaped  # noqa: E402

CONFIG = dict(
    vocabulary_size=128256,
    num_layers=16,
    num_heads=32,
    num_key_value_heads=8,
    hidden_dim=2048,
    intermediate_dim=8192,
    rope_theta=500000.0,
    layer_norm_epsilon=1e-5,
)
CHECK = dict(CONFIG, vocabulary_size=1024, num_layers=2, hidden_dim=256, intermediate_dim=512, num_heads=8)
PROMPT, NEW_TOKENS, REPEATS, BATCHES = 128, 128, 3, (1, 16)
CONTENDERS = [  # (row name, contender, backend); transformers' static cache compiles last: the slowest start
    ("keras_tfm (torch)", "keras_tfm", "torch"),
    ("keras_tfm (jax)", "keras_tfm", "jax"),
    ("keras_tfm (tensorflow)", "keras_tfm", "tensorflow"),
    ("hugging_face (torch)", "hugging_face", "torch"),
    ("hugging_face static cache (torch)", "hugging_face_static", "torch"),
]
# --quantization: keras_tfm:DTYPE:QUANTIZE of the SmolLM2-135M shape (decoder_lm.py's), batch 1
QUANTIZATION = [
    (f"keras_tfm {dtype}{' int8' if quantize else ''} ({backend})", f"keras_tfm:{dtype}:{quantize}", backend)
    for backend in ("jax", "torch", "tensorflow")
    for dtype in ("float32", "bfloat16")
    for quantize in ("", "int8")
]


def prompts(batch: int, vocabulary_size: int):
    import numpy as np

    return np.random.default_rng(batch).integers(0, vocabulary_size, size=(batch, PROMPT)).astype("int32")


def timed(generate, batch: int) -> dict:
    """New tokens/s over the whole batch: the fastest of REPEATS calls after one that compiles."""
    generate()
    rates = []
    for _ in range(REPEATS):
        with Timer() as timer:
            generate()
        rates.append(batch * NEW_TOKENS / timer.seconds)
    return {"value": max(rates), "windows": [round(rate, 1) for rate in rates]}


def keras_tfm_rows(config: dict, dtype: str = "bfloat16", quantize: str = "", batches=BATCHES):
    """(rows, device, peak GB) of keras_tfm's generate on this backend; `quantize`: `model.quantize`'s mode."""
    import keras

    model = smollm_shaped(PROMPT + NEW_TOKENS, dtype, config)
    if quantize:
        model.quantize(quantize)
    rows = []
    for batch in batches:
        ids = prompts(batch, config["vocabulary_size"])

        def generate(ids=ids, batch=batch):
            out = keras.ops.convert_to_numpy(model.generate(ids, max_new_tokens=NEW_TOKENS, stop_token_ids=()))
            assert out.shape == (batch, PROMPT + NEW_TOKENS)

        rows.append({"batch": batch, **timed(generate, batch)})
    device, peak = _device_and_peak(keras.backend.backend())
    return rows, device, peak


def _device_and_peak(backend: str) -> tuple[str, float]:
    """The accelerator's name and the GB of its memory the process peaked at (0 where it cannot say)."""
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        stats = device.memory_stats() or {}
        return device.device_kind, stats.get("peak_bytes_in_use", 0) / 1e9
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return "cpu", 0.0
        return torch.cuda.get_device_name(0), torch.cuda.max_memory_allocated() / 1e9
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "cpu", 0.0
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU"), (
        tf.config.experimental.get_memory_info("GPU:0")["peak"] / 1e9
    )


def hugging_face_rows(config: dict, static: bool) -> tuple[list[dict], str, float]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(torch.bfloat16)  # made in bfloat16, as keras_tfm's is: no float32 copy at the peak
    with torch.device(device):
        model = hugging_face_llama(PROMPT + NEW_TOKENS, config)
    torch.set_default_dtype(torch.float32)
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    if static:
        kwargs["cache_implementation"] = "static"
    rows = []
    for batch in BATCHES:
        ids = torch.tensor(prompts(batch, config["vocabulary_size"]), dtype=torch.long, device=device)

        def generate(ids=ids, batch=batch):
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            assert tuple(out.shape) == (batch, PROMPT + NEW_TOKENS)
            if device == "cuda":
                torch.cuda.synchronize()

        with torch.no_grad():
            rows.append({"batch": batch, **timed(generate, batch)})
    name, peak = _device_and_peak("torch")
    return rows, name, peak


def worker(contender: str, check: bool) -> dict:
    config = CHECK if check else CONFIG
    if contender == "keras_tfm":
        rows, device, peak = keras_tfm_rows(config)
    elif contender.startswith("keras_tfm:"):
        _, dtype, quantize = contender.split(":")
        rows, device, peak = keras_tfm_rows(CHECK if check else SMOLLM2, dtype, quantize, batches=(1,))
    else:
        rows, device, peak = hugging_face_rows(config, static=contender == "hugging_face_static")
    return {"rows": rows, "device": device, "peak_gpu_memory_gb": round(peak, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"], help="Keras backends to time")
    parser.add_argument(
        "--quantization",
        action="store_true",
        help="keras_tfm alone, SmolLM2-135M shape, batch 1: float32 and bfloat16, each also int8 (model.quantize)",
    )
    parser.add_argument("--check", action="store_true", help="a 2-layer model, to try the script on any device")
    parser.add_argument("--timeout", type=int, default=300, help="seconds each contender's process may take")
    parser.add_argument("--logs", help="a folder to keep each contender's whole output in")
    parser.add_argument("--worker", nargs=2, metavar=("CONTENDER", "CHECK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        report(worker(args.worker[0], args.worker[1] == "1"))
        return
    script, runs = os.path.abspath(__file__), {}
    for name, contender, backend in QUANTIZATION if args.quantization else CONTENDERS:
        if contender.startswith("keras_tfm") and backend not in args.backends:
            continue
        log = os.path.join(args.logs, f"{contender.replace(':', '_')}_{backend}.log") if args.logs else None
        flags = [contender, "1" if args.check else "0"]
        try:
            runs[name] = run_worker(script, backend, flags, timeout=args.timeout, log=log)
        except subprocess.TimeoutExpired:
            runs[name] = {"error": [f"took over {args.timeout} s"]}
        print(name, runs[name], flush=True)
    devices = {run["device"] for run in runs.values() if "device" in run}
    machine = ", ".join(sorted(devices)) or "no device answered"
    name = ("gpu_quantization" if args.quantization else "gpu_decoding") + ("_check" if args.check else "")
    if args.quantization:
        title = "Greedy decoding, SmolLM2-135M shape, float and int8 weights, batch 1, 128 + 128 tokens"
        rows = [(row_name, {**run.get("rows", [run])[0], **_peak(run)}) for row_name, run in runs.items()]
        print_table(title, "new tokens/s", rows, {f"float32 {b}": f"keras_tfm float32 ({b})" for b in args.backends})
        results = [{"contender": n, "task": "batch_1", "unit": "new tokens/s", **_without_batch(r)} for n, r in rows]
        write_results(name, results, {"batch_1": title}, {"batch_1": "keras_tfm float32"}, machine=machine)
        return
    results, titles = [], {}
    for batch in BATCHES:
        task = f"batch_{batch}"
        titles[task] = f"Greedy decoding in bfloat16, Llama-3.2-1B shape, batch {batch}, 128 + 128 tokens"
        rows = []
        for row_name, run in runs.items():
            found = [row for row in run.get("rows", []) if row["batch"] == batch]
            rows.append((row_name, {**found[0], **_peak(run)} if found else run))
        print_table(titles[task], "new tokens/s", rows, {"transformers": "hugging_face (torch)"})
        results += [
            {"contender": row_name, "task": task, "unit": "new tokens/s", **_without_batch(row)}
            for row_name, row in rows
        ]
    write_results(name, results, titles, machine=machine)


def _peak(run: dict) -> dict:
    return {"peak_gpu_memory_gb": run["peak_gpu_memory_gb"]} if "peak_gpu_memory_gb" in run else {}


def _without_batch(row: dict) -> dict:
    return {key: value for key, value in row.items() if key != "batch"}


if __name__ == "__main__":
    main()
