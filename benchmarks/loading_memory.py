"""Peak memory and time of loading a Llama-shaped checkpoint with random bfloat16 weights, on each backend
and with transformers: the peak above the process's memory after its imports, against the weights' size.

The checkpoint is written shard by shard (never whole in memory) in a temporary directory (`--directory`
for another disk: the 8B shape needs 16 GB); results go to `results/loading_memory_{shape}.json`:

    python benchmarks/loading_memory.py --shape llama3_2_1b [--dtype bfloat16]
    python benchmarks/loading_memory.py --shape llama3_8b        # 16 GB of bfloat16: needs 24 GB of memory
    python benchmarks/loading_memory.py --shape llama3_8b --quantize int8   # int8 while loading: 8 GB
    python benchmarks/loading_memory.py --shape llama3_2_1b --format gguf --dtype float32  # an F32 GGUF file

`--format gguf` writes the checkpoint again as a llama.cpp GGUF file (F32 or BF16 tensors, as `--dtype`
says; no vocabulary) and loads that with `from_gguf` (and transformers' `gguf_file`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from common import REPO, gguf_name, write_results

# (hidden, layers, heads, key/value heads, feed-forward, vocabulary, tied embeddings) of the published configs
SHAPES = {
    "smollm2_135m": (576, 30, 9, 3, 1536, 49152, True),
    "llama3_2_1b": (2048, 16, 32, 8, 8192, 128256, True),
    "llama3_8b": (4096, 32, 32, 8, 14336, 128256, False),
}

WORKER = """
import json, sys, time
def peak_mb():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
def now_mb():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024
contender, directory, dtype, quantize, gguf_file = sys.argv[1:6]
if contender == "transformers":
    import torch, transformers
else:
    import keras_tfm
baseline = now_mb()
start = time.perf_counter()
if contender == "transformers":
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, torch_dtype=getattr(torch, dtype), **extra)
elif gguf_file:
    model = keras_tfm.from_gguf(f"{directory}/{gguf_file}", dtype=dtype, quantize=None if quantize == "none" else quantize)
else:
    model = keras_tfm.from_huggingface(directory, dtype=dtype, quantize=None if quantize == "none" else quantize)
print(json.dumps({"seconds": time.perf_counter() - start, "baseline_MB": baseline, "peak_MB": peak_mb()}))
"""


def write_checkpoint(directory: str, shape: tuple, shard_bytes: int = 2 << 30) -> int:
    """A Llama checkpoint of `shape` with random bfloat16 weights, a shard at a time; returns its bytes."""
    sys.path.insert(0, REPO)
    from keras_tfm.convert import safetensors_files

    hidden, layers, heads, kv_heads, ffn, vocabulary, tied = shape
    head = hidden // heads
    tensors = [("model.embed_tokens.weight", (vocabulary, hidden)), ("model.norm.weight", (hidden,))]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [(p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,))]
        tensors += [
            (p + "self_attn.q_proj.weight", (hidden, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, hidden)),
        ]
        tensors += [(p + f"self_attn.{n}_proj.weight", (kv_heads * head, hidden)) for n in "kv"]
        tensors += [(p + f"mlp.{n}_proj.weight", (ffn, hidden)) for n in ("gate", "up")]
        tensors += [(p + "mlp.down_proj.weight", (hidden, ffn))]
    if not tied:
        tensors.append(("lm_head.weight", (vocabulary, hidden)))
    rng, shards, current, size = np.random.default_rng(0), [[]], 0, 0
    for name, tensor_shape in tensors:
        nbytes = 2 * int(np.prod(tensor_shape))
        if current + nbytes > shard_bytes and shards[-1]:
            shards.append([])
            current = 0
        shards[-1].append((name, tensor_shape))
        current, size = current + nbytes, size + nbytes
    weight_map = {}
    for index, shard in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        arrays = {name: (rng.standard_normal(s, np.float32) * 0.02) for name, s in shard}
        safetensors_files.write(arrays, os.path.join(directory, file), "bfloat16")
        weight_map.update({name: file for name, _ in shard})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": weight_map}, f)
    config = dict(
        model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=ffn, vocab_size=vocabulary,
        tie_word_embeddings=tied, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
        hidden_act="silu", torch_dtype="bfloat16",
    )  # fmt: skip
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return size


def write_gguf(directory: str, shape: tuple, dtype: str) -> str:
    """The checkpoint in `directory` written again as a GGUF file there, a tensor at a time (F32 or BF16
    tensors, llama.cpp's names, no vocabulary); returns its name."""
    import gguf

    from keras_tfm.convert import safetensors_files

    hidden, layers, heads, kv_heads, ffn, vocabulary, _ = shape
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    weights = safetensors_files.SafetensorsWeights([os.path.join(directory, file) for file in files])
    name = f"model-{dtype}.gguf"
    writer = gguf.GGUFWriter(os.path.join(directory, name), "llama")
    for method, value in (("add_context_length", 8192), ("add_embedding_length", hidden), ("add_block_count", layers),
                          ("add_feed_forward_length", ffn), ("add_head_count", heads), ("add_head_count_kv", kv_heads),
                          ("add_vocab_size", vocabulary), ("add_rope_freq_base", 500000.0),
                          ("add_layer_norm_rms_eps", 1e-5)):  # fmt: skip
        getattr(writer, method)(value)
    kind = gguf.GGMLQuantizationType.F32 if dtype == "float32" else gguf.GGMLQuantizationType.BF16
    names = {key: gguf_name(key) for key in weights}
    for key in weights:
        shape_of = tuple(weights.shape(key))
        size = int(np.prod(shape_of)) * (4 if dtype == "float32" else 2)
        writer.add_tensor_info(
            names[key], shape_of, np.dtype("float32" if dtype == "float32" else "uint16"), size, kind
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for key in names:
        array = np.asarray(weights[key])
        writer.write_tensor_data(array.astype(np.float32) if dtype == "float32" else array.view(np.uint16))
    writer.close()
    return name


def measure(contender: str, backend: str | None, directory: str, dtype: str, quantize: str, gguf_file: str) -> dict:
    environment = {**os.environ, "PYTHONPATH": REPO, **({"KERAS_BACKEND": backend} if backend else {})}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, contender, directory, dtype, quantize, gguf_file],
        capture_output=True,
        text=True,
        env=environment,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="llama3_2_1b")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--backends", default="jax,tensorflow,torch")
    parser.add_argument("--quantize", default="none", choices=["none", "int8", "int4"], help="quantize while loading")
    parser.add_argument("--directory", default=None, help="where to write the temporary checkpoint")
    parser.add_argument("--format", default="safetensors", choices=["safetensors", "gguf"])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.directory) as directory:
        size = write_checkpoint(directory, SHAPES[args.shape])
        gguf_file = write_gguf(directory, SHAPES[args.shape], args.dtype) if args.format == "gguf" else ""
        weights_mb = (
            size / 2**20 * {"none": 2 if args.dtype == "float32" else 1, "int8": 0.5, "int4": 0.25}[args.quantize]
        )
        contenders = [("keras_tfm", backend) for backend in args.backends.split(",")]
        contenders += [("transformers", None)] if args.quantize == "none" else []
        for contender, backend in contenders:
            result = measure(contender, backend, directory, args.dtype, args.quantize, gguf_file)
            name = f"{contender} ({backend or 'torch'})"
            row = {"contender": name, "task": "load", "unit": "peak above imports, MB", **result}
            if "peak_MB" in result:
                row["value"] = round(result["peak_MB"] - result["baseline_MB"])
                row["x_weights"] = round(row["value"] / weights_mb, 2)
                row["seconds"] = round(result["seconds"], 1)
            row["weights_MB"] = round(weights_mb)
            rows.append(row)
            print(json.dumps(row))
    loaded = args.dtype if args.quantize == "none" else f"{args.quantize} (quantized while loading)"
    source = "checkpoint of random bfloat16 weights"
    if args.format == "gguf":
        source = f"GGUF file of random {'F32' if args.dtype == 'float32' else 'BF16'} weights"
    title = f"Loading a {args.shape}-shaped {source} as {loaded}"
    suffix = ("" if args.quantize == "none" else f"_{args.quantize}") + ("_gguf" if args.format == "gguf" else "")
    write_results(f"loading_memory_{args.shape}{suffix}", rows, tasks={"load": title})


if __name__ == "__main__":
    main()
