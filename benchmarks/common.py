"""Side-by-side benchmarking: every contender runs in its own process (one Keras backend per process),
prints one JSON line, and the driver prints a table with ratios."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_worker(script: str, backend: str, args: list[str], timeout: int = 900, log: str | None = None) -> dict:
    """Runs `script --worker *args` with KERAS_BACKEND=`backend`; returns the last JSON line it printed, or
    {"error": [its last line of output]}. `log`: a file to keep all of its output in."""
    path = os.pathsep.join([REPO, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, script, "--worker", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if log:
        with open(log, "w") as file:
            file.write(result.stdout + result.stderr)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        return {"error": (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]}
    return json.loads(lines[-1])


def write_results(
    name: str,
    results: list[dict],
    tasks: dict[str, str] | None = None,
    baselines: dict[str, str] | None = None,
    machine: str | None = None,
) -> str:
    """Writes `results` as benchmarks/results/{name}.json with the date, the machine, the library versions
    and the command that produced them (a re-measurement replaces the file); returns its path. `tasks`:
    the title of each task's table (the rows' "task"), which the performance page shows; `baselines`:
    task -> the contender prefix its rows are compared with on the same backend (default keras_hub);
    `machine`: the accelerator that ran them, where one did (the host's processor is added)."""
    import datetime
    import importlib.metadata
    import platform

    versions = {}
    for package in ("keras", "keras-hub", "jax", "tensorflow", "torch", "transformers", "numpy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    processor = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as file:
            processor = next(line.split(":", 1)[1].strip() for line in file if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    backend = f"KERAS_BACKEND={os.environ['KERAS_BACKEND']} " if "KERAS_BACKEND" in os.environ else ""
    record = {
        "benchmark": name,
        "date": datetime.date.today().isoformat(),
        "machine": (f"{machine}, host " if machine else "")
        + f"{processor or platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}",
        "versions": versions,
        "command": backend + "python " + " ".join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
        "tasks": tasks or {},
        **({"baselines": baselines} if baselines else {}),
        "results": results,
    }
    path = os.path.join(REPO, "benchmarks", "results", f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        json.dump(record, file, indent=2)
        file.write("\n")
    print(f"results written to {path}")
    return path


def report(result: dict) -> None:
    print(json.dumps(result), flush=True)


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def print_table(title: str, unit: str, rows: list[tuple[str, dict]], baselines: dict[str, str]) -> None:
    """rows: (name, result with 'value' and optionally 'windows', 'method' and 'rounds'); baselines:
    column title -> name of the row to divide by. Ratios are of the 'value's."""
    print(f"\n### {title}\n")
    several = any(len(result.get("rounds", [])) > 1 for _, result in rows)
    header = (
        f"| contender | {unit} | slowest window | timed | "
        + ("each round | " if several else "")
        + " | ".join(f"vs {b}" for b in baselines)
        + " |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    values = {name: r.get("value") for name, r in rows}
    for name, result in rows:
        if "error" in result:
            print(f"| {name} | failed: {result['error'][0][:80]} | | |" + " |" * (len(baselines) + several))
            continue
        ratios = []
        for base in baselines.values():
            b = values.get(base)
            ratios.append(f"{result['value'] / b:.2f}x" if b else "-")
        value, slowest = (_number(v) for v in (result["value"], min(result.get("windows") or [result["value"]])))
        each = (" / ".join(_number(v) if v else "failed" for v in result["rounds"]) + " | ") if several else ""
        print(f"| {name} | {value} | {slowest} | {result.get('method', 'loop')} | {each}" + " | ".join(ratios) + " |")


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


BACKENDS = ("jax", "tensorflow", "torch")
BASELINES = {
    "keras-hub jax": "keras_hub (jax)",
    "keras-hub torch": "keras_hub (torch)",
    "Hugging Face": "hugging_face (torch)",
}


DEFAULT_CONTENDERS = [
    (f"{contender} ({backend})", contender, backend) for contender in ("keras_tfm", "keras_hub") for backend in BACKENDS
]
DEFAULT_CONTENDERS.append(("hugging_face (torch)", "hugging_face", "torch"))


def side_by_side(
    script: str, title: str, unit: str, task: str, contenders=DEFAULT_CONTENDERS, baselines=BASELINES, rounds: int = 1
) -> None:
    """Runs `script --worker CONTENDER BACKEND TASK` for each (row name, contender, backend) in its own
    process, `rounds` times over in turn, then prints the table of each contender's best round and
    returns those rows.

    Several rounds in turn give every contender the same chances on a machine whose speed drifts
    (on the 2-core CPU one process of the same code can be 10-30% off another)."""
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in contenders}
    for _ in range(rounds):
        for name, contender, backend in contenders:
            runs[name].append(run_worker(script, backend, [contender, backend, task]))
    rows = [(name, _best_round(results)) for name, results in runs.items()]
    print_table(title, unit, rows, baselines)
    return [{"contender": name, "task": task, "unit": unit, **result} for name, result in rows]


def _best_round(results: list[dict]) -> dict:
    done = [result for result in results if "error" not in result]
    if not done:
        return results[0]
    return dict(max(done, key=lambda result: result["value"]), rounds=[r.get("value") for r in results])


def main(
    doc: str,
    script: str,
    worker,
    tasks: dict[str, tuple[str, str]],
    contenders=DEFAULT_CONTENDERS,
    baselines=BASELINES,
    task_contenders: dict[str, tuple[list, dict]] | None = None,
    results_name: str | None = None,
    same_backend: dict[str, str] | None = None,
) -> None:
    """The command line of every speed benchmark: `script [--only TASK]` prints one side-by-side table
    per task (`tasks`: name -> (title, unit)); `script --worker CONTENDER BACKEND TASK`, which the
    driver runs in a subprocess with KERAS_BACKEND set, prints `worker(contender, task)` as JSON.
    `task_contenders`: task -> (contenders, baselines) for a task that compares others. The rows are
    also written as benchmarks/results/{results_name}.json (default: the script's name), from which
    the documentation's performance page is made; `same_backend`: task -> the contender prefix the
    page compares each row with on its backend (default keras_hub)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(tasks), help="run one task's table")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every contender this many times, in turn, and keep each one's best (default: 1)",
    )
    parser.add_argument("--worker", nargs=3, metavar=("CONTENDER", "BACKEND", "TASK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        contender, _, task = args.worker
        report(worker(contender, task))
        return
    rows = []
    for task, (title, unit) in tasks.items():
        if args.only in (None, task):
            rows += side_by_side(
                script,
                title,
                unit,
                task,
                *(task_contenders or {}).get(task, (contenders, baselines)),
                rounds=args.rounds,
            )
    results_name = results_name or os.path.splitext(os.path.basename(script))[0]
    path = os.path.join(REPO, "benchmarks", "results", f"{results_name}.json")
    command = "python " + " ".join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]])
    rows = [{**row, "command": command} for row in rows]
    titles = {task: title for task, (title, _) in tasks.items()}
    compared = dict(same_backend or {})
    if args.only and os.path.isfile(path):  # keep the other tasks' rows, each with the command that made it
        with open(path) as file:
            earlier = json.load(file)
        kept = [row for row in earlier["results"] if row.get("task") != args.only]
        rows = [{"command": earlier["command"], "date": earlier["date"], **row} for row in kept] + rows
    write_results(results_name, rows, titles, compared)


def _best_window(step, warmup_steps: int, steps: int, windows: int, examples_per_step: int, per_example: float) -> dict:
    """Runs `step(i)` `warmup_steps` times, then `windows` timed windows of `steps` calls each.
    'value' is the fastest window's rate (per_example x examples/s): on this shared 2-core machine
    the noise only ever slows a window down, so the fastest one is the closest to the code's speed;
    every window's rate is kept in 'windows'."""
    for i in range(warmup_steps):
        step(i)
    rates = []
    for w in range(windows):
        with Timer() as timer:
            for i in range(steps):
                step(warmup_steps + w * steps + i)
        rates.append(per_example * steps * examples_per_step / timer.seconds)
    return {"value": max(rates), "windows": [round(r, 1) for r in rates]}


def keras_train_throughput(
    model,
    inputs,
    targets,
    batch_size: int,
    warmup_steps: int,
    steps: int,
    windows: int = 3,
    per_example: float = 1.0,
    loss=None,
    metrics: list | None = None,
) -> dict:
    """Training speed of a Keras model with AdamW and `loss` (default: Keras' sparse categorical
    cross-entropy on logits; keras_tfm's token models get `keras_tfm.TokenCrossEntropy`, as in its
    recipes), the faster of Keras' two ways to train (see `_best_window`; both are kept in the result):
    - 'train_on_batch': one call per step on batches converted to backend tensors beforehand, as the
      Hugging Face loop below gets them. No input pipeline, but on JAX every call waits for its
      step and copies the training state back into the variables.
    - 'fit': `fit` on the NumPy arrays, `steps` steps per call, as users train. Steps are dispatched
      ahead, but the timing includes the input pipeline: Keras' tf.data pipeline on TensorFlow
      and keras-hub's on every backend, up to a third of a step here, and each call's setup.
    XLA on JAX and TensorFlow; eager on PyTorch, where Keras' torch.compile path recompiles at every
    layer boundary and trains slower than eager on CPU. `inputs`: an array or a dict of arrays, at
    least `steps` batches; `metrics`: what `compile` takes (default: the model's own default)."""
    import keras
    import numpy as np

    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # a model that runs host code in its step (YOLOS's matching) says it cannot be XLA-compiled
        jit_compile=keras.backend.backend() != "torch" and getattr(model, "supports_jit", True),
        **({} if metrics is None else {"metrics": metrics}),
    )
    count = len(keras.tree.flatten(targets)[0]) // batch_size

    def batch(array, i):
        return keras.ops.convert_to_tensor(np.asarray(array[i * batch_size : (i + 1) * batch_size]))

    batches = [tuple(keras.tree.map_structure(lambda a, i=i: batch(a, i), part) for part in (inputs, targets))
               for i in range(count)]  # fmt: skip
    on_batches = _best_window(
        lambda i: model.train_on_batch(*batches[i % count]), warmup_steps, steps, windows, batch_size, per_example
    )

    def fit(i):  # one call of `steps` steps
        model.fit(inputs, targets, batch_size=batch_size, steps_per_epoch=steps, epochs=1, verbose=0)

    # Each window is one `fit` call; the warmup call builds fit's own compiled step.
    fitted = _best_window(
        fit, warmup_steps=1, steps=1, windows=windows, examples_per_step=steps * batch_size, per_example=per_example
    )
    best = max((on_batches, "train_on_batch"), (fitted, "fit"), key=lambda r: r[0]["value"])
    return {**best[0], "method": best[1], "train_on_batch": on_batches, "fit": fitted}


def torch_train_throughput(
    model, loss_fn, batches, warmup_steps: int, steps: int, windows: int = 3, per_example: float = 1.0
) -> dict:
    """Training speed of a plain PyTorch AdamW loop; `batches[i]` is `(inputs, targets)`, reused
    cyclically. See `_best_window`."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()

    def step(i):
        inputs, targets = batches[i % len(batches)]
        loss = loss_fn(model, inputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return _best_window(step, warmup_steps, steps, windows, len(batches[0][1]), per_example)


# Hugging Face's Llama tensor names -> llama.cpp's (what its convert_hf_to_gguf.py writes)
GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}  # fmt: skip
GGUF_BLOCK_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip


def hugging_face_image_throughput(model, images, targets, task: str, batch_size: int, warmup: int, steps: int,
                                  windows: int) -> dict:  # fmt: skip
    """A transformers vision model's speed: its forward under `no_grad` on channels-last `images` ("inference"),
    or AdamW steps on `pixel_values=` and `labels=` batches of `batch_size` ("training"); `targets[i]` is image
    i's labels as the model takes them (a tensor's rows, or a list's items)."""
    import torch

    pixels = torch.tensor(images).permute(0, 3, 1, 2).contiguous()
    if task == "inference":
        model.eval()

        def step(i):
            with torch.no_grad():
                model(pixel_values=pixels)

        return _best_window(step, warmup, steps, windows, len(images), 1.0)
    batches = [(pixels[i : i + batch_size], targets[i : i + batch_size]) for i in range(0, len(pixels), batch_size)]
    return torch_train_throughput(model, lambda m, x, y: m(pixel_values=x, labels=y).loss, batches, warmup, steps,
                                  windows)  # fmt: skip


def gguf_name(name: str) -> str:
    """`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`, as llama.cpp's converter names it."""
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, _, index, *module, kind = name.split(".")
    return f"blk.{index}.{GGUF_BLOCK_NAMES['.'.join(module)]}.{kind}"
