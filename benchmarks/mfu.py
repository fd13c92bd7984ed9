"""Model FLOPs utilisation (MFU) of GPT training: keras_tfm on JAX with the recipes' default settings for
the device (XLA; `--precision auto`: bfloat16 mixed precision on a GPU) against the same GPT in PyTorch with nanoGPT's train.py settings
(transformers' GPT-2 with scaled-dot-product attention, torch.compile, bfloat16 autocast, fused AdamW).

    python benchmarks/mfu.py            # on a GPU: GPT-2 small, context 1024; on a CPU: nanoGPT's CPU model

MFU is nanoGPT's estimate: (6 N + 12 L H Q T) FLOPs per token (N parameters but position embeddings,
L layers, H heads, Q head width, T context) times tokens per second, over the device's peak: the
datasheet's dense bfloat16 peak on a GPU; on a CPU the float32 matrix-product rate measured here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, write_results  # noqa: E402

GPU = dict(vocabulary_size=50304, num_layers=12, num_heads=12, hidden_dim=768, context=1024, batch=16, steps=20)
CPU = dict(vocabulary_size=65, num_layers=4, num_heads=4, hidden_dim=128, context=64, batch=12, steps=20)
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}  # dense, SXM datasheets


def flops_per_token(config: dict, parameters: int) -> float:
    head = config["hidden_dim"] // config["num_heads"]
    positions = config["context"] * config["hidden_dim"]
    return 6 * (parameters - positions) + 12 * config["num_layers"] * config["num_heads"] * head * config["context"]


def keras_tfm_worker(config: dict, gpu: bool) -> dict:
    import keras
    import numpy as np

    import keras_tfm
    from keras_tfm.training import TrainingConfig
    from keras_tfm.training.fitting import precision

    keras.config.set_dtype_policy(precision(TrainingConfig(output_dir=".")))  # the recipes' default here
    model = keras_tfm.GPT(
        vocabulary_size=config["vocabulary_size"],
        num_layers=config["num_layers"],
        num_heads=config["num_heads"],
        hidden_dim=config["hidden_dim"],
        intermediate_dim=4 * config["hidden_dim"],
        max_length=config["context"],
        dropout=0.0,
    )
    model.compile(optimizer=keras.optimizers.AdamW(6e-4), loss=keras_tfm.TokenCrossEntropy(), jit_compile=True)
    rng = np.random.default_rng(0)
    data = rng.integers(0, config["vocabulary_size"], size=(config["batch"], config["context"] + 1)).astype("int32")
    x, y = keras.ops.convert_to_tensor(data[:, :-1]), keras.ops.convert_to_tensor(data[:, 1:])
    for _ in range(3):
        model.train_on_batch(x, y)
    start = time.perf_counter()
    for _ in range(config["steps"]):
        loss = model.train_on_batch(x, y)
    float(np.asarray(loss))
    seconds = time.perf_counter() - start
    return {
        "parameters": model.count_params(),
        "tokens_per_second": config["steps"] * config["batch"] * config["context"] / seconds,
    }


def pytorch_worker(config: dict, gpu: bool) -> dict:
    import torch
    import transformers

    device = "cuda" if gpu else "cpu"
    gpt2 = transformers.GPT2Config(
        vocab_size=config["vocabulary_size"],
        n_positions=config["context"],
        n_embd=config["hidden_dim"],
        n_layer=config["num_layers"],
        n_head=config["num_heads"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="sdpa",
    )
    model = transformers.GPT2LMHeadModel(gpt2).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=gpu)
    step_model = torch.compile(model) if gpu else model
    data = torch.randint(0, config["vocabulary_size"], (config["batch"], config["context"] + 1), device=device)
    x, y = data[:, :-1], data[:, 1:]

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=gpu):
            logits = step_model(x).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(3):
        step()
    if gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(config["steps"]):
        loss = step()
    loss.item()
    seconds = time.perf_counter() - start
    return {
        "parameters": parameters,
        "tokens_per_second": config["steps"] * config["batch"] * config["context"] / seconds,
    }


def device_and_peak() -> tuple[str, bool, float]:
    import jax

    device = jax.devices()[0]
    if device.platform == "gpu":
        name = device.device_kind
        peak = next((value for key, value in PEAK_BF16.items() if key in name), None)
        return name, True, peak
    import numpy as np

    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype("float32")
    best = min(_timed(lambda: a @ a) for _ in range(5))
    return "CPU (no GPU: float32, peak = the measured matrix-product rate)", False, 2 * 2048**3 / best


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        config, gpu = json.loads(sys.argv[3]), sys.argv[2] == "gpu"
        worker = keras_tfm_worker if os.environ.get("MFU_CONTENDER") == "keras_tfm" else pytorch_worker
        print(json.dumps(worker(config, gpu)), flush=True)
        return
    name, gpu, peak = device_and_peak()
    config = GPU if gpu else CPU
    rows = []
    for contender, backend in (("keras_tfm (jax)", "jax"), ("hugging_face GPT-2, nanoGPT settings (torch)", "torch")):
        environment = {
            **os.environ,
            "KERAS_BACKEND": backend,
            "PYTHONPATH": REPO,
            "MFU_CONTENDER": "keras_tfm" if contender.startswith("keras_tfm") else "torch",
        }
        done = subprocess.run(
            [sys.executable, __file__, "--worker", "gpu" if gpu else "cpu", json.dumps(config)],
            env=environment,
            capture_output=True,
            text=True,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            print(f"{contender}: failed\n{done.stderr[-3000:]}", flush=True)
            continue
        result = json.loads(lines[-1])
        mfu = flops_per_token(config, result["parameters"]) * result["tokens_per_second"] / peak if peak else None
        rows.append(
            {
                "contender": contender,
                "unit": "tokens/s",
                "value": round(result["tokens_per_second"]),
                "MFU": round(mfu, 3) if mfu is not None else None,
                "parameters": result["parameters"],
            }
        )
        print(rows[-1], flush=True)
    title = f"GPT training MFU on {name}: {config['num_layers']} layers, {config['hidden_dim']} wide, context {config['context']}, batch {config['batch']}"
    write_results("mfu", [dict(row, task="mfu") for row in rows], tasks={"mfu": title}, machine=name if gpu else None)


if __name__ == "__main__":
    main()
