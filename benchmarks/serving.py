"""What batching buys the server: the SmolLM2-135M shape (random weights), greedy, 32-token prompts and
64 new tokens, with 1, 4, 16 and 64 clients at once, each sending requests one after another for a fixed
number of requests: throughput (new tokens/s over the run), time to the first streamed token (of a
request alone), p50/p99 latency of whole requests, against one client at a time, and the process's resident
memory after each run and its peak so far (the server runs in this process). Each cache shape
(rows, length) decodes with its own compiled loop: the server warms up first (`warm_up_length`, its
seconds until every planned shape is compiled recorded), so the runs are the first load after start, without
compiles.

    KERAS_BACKEND=jax python benchmarks/serving.py [--clients 1 4 16 64] [--requests 64] [--mixed]

`--mixed`: each request asks for 8 to 128 new tokens (drawn per request), so that requests end at
different steps and rows free up while others decode (written to `serving_mixed_<backend>.json`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_results  # noqa: E402

PROMPT_TOKENS, NEW_TOKENS = 32, 64
FIRST = 0x10000  # the characters of the ids: the supplementary planes, past the surrogates


def server(model, warm_up_length: int):
    import uvicorn

    from keras_tfm.serve import create_app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = create_app(model, "smollm2", max_batch_size=64, max_queue=256, warm_up_length=warm_up_length)
    running = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=running.run, daemon=True).start()
    while not running.started:
        time.sleep(0.05)
    app.state.engine.ready.wait()
    while app.state.engine.compiled.compiling():  # the runs start once every planned shape is compiled
        time.sleep(0.2)
    return f"http://127.0.0.1:{port}", running


def character_model():
    """SmolLM2-135M's shape (random weights) with a tokenizer of one character per id."""
    import tokenizers

    import keras_tfm
    from keras_tfm.data import HuggingFaceTokenizer

    # one character per id, so that every generated token is text the stream hands out at once
    vocabulary = {chr(FIRST + i): i for i in range(49152)}
    letters = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, unk_token=chr(FIRST)))
    letters.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    letters.decoder = tokenizers.decoders.Fuse()
    model = keras_tfm.smollm2_135m(max_length=256)
    model.tokenizer = HuggingFaceTokenizer(letters.to_str())
    return model


def run(url: str, clients: int, requests: int, mixed: bool = False) -> dict:
    import httpx

    # one client, made before the clock starts: making one takes 25-40 ms (its TLS context), none of it the server's
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=clients + 1))
    rng = np.random.default_rng(clients)
    prompts = ["".join(chr(FIRST + i) for i in rng.integers(0, 49152, PROMPT_TOKENS)) for _ in range(requests)]
    # mixed: each request asks for 8 to 128 new tokens, so requests end at different steps
    asked = iter(rng.integers(8, 2 * NEW_TOKENS + 1, requests).tolist() if mixed else [NEW_TOKENS] * requests)
    lengths = {}
    latencies, first_tokens, first_tokens_seen = [], [], [False]

    def ask(prompt: str) -> None:
        body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "stream": True}
        start = time.perf_counter()
        with client.stream("POST", url + "/v1/completions", json=body) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: {") and not first_tokens_seen[0]:
                    first_tokens.append(time.perf_counter() - start)
                    first_tokens_seen[0] = True
        latencies.append(time.perf_counter() - start)

    def ask_whole(prompt: str) -> None:
        start = time.perf_counter()
        lengths[prompt] = new_tokens = next(asked)
        body = {"prompt": prompt, "max_tokens": new_tokens, "temperature": 0}
        answer = client.post(url + "/v1/completions", json=body)
        assert answer.json()["usage"]["completion_tokens"] == new_tokens, answer.text
        latencies.append(time.perf_counter() - start)

    ask(prompts[0])  # one streamed request alone: the time to its first token
    latencies.clear()
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(ask_whole, prompts))
    seconds = time.perf_counter() - start
    client.close()
    return {
        "clients": clients,
        "requests": requests,
        "value": round(sum(lengths.values()) / seconds, 1),
        "p50_latency_s": round(float(np.percentile(latencies, 50)), 2),
        "p99_latency_s": round(float(np.percentile(latencies, 99)), 2),
        "first_token_s": round(first_tokens[0], 3),
    }


def resident_memory() -> dict:
    """The process's resident memory now and its peak, in MB (Linux)."""
    status = {line.split(":")[0]: int(line.split()[1]) for line in open("/proc/self/status") if "kB" in line}
    return {"rss_MB": status["VmRSS"] // 1024, "peak_MB": status["VmHWM"] // 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--mixed", action="store_true", help="each request asks for 8 to 128 new tokens")
    parser.add_argument("--warm-up-length", type=int, default=2 * (PROMPT_TOKENS + NEW_TOKENS),
                        help="the server compiles the shapes of requests up to this long first (0: none)")  # fmt: skip
    args = parser.parse_args()
    import keras

    from keras_tfm import compat

    compat.torch_server_process()  # as `python -m keras_tfm.serve` does
    model = character_model()
    model.build()
    weights_mb = round(sum(int(np.prod(w.shape)) * 4 for w in model.weights) / 2**20)
    start = time.perf_counter()
    url, running = server(model, args.warm_up_length)
    warm_up_s = round(time.perf_counter() - start, 1)
    print(f"warm-up: {warm_up_s} s", flush=True)
    backend, results = keras.backend.backend(), []
    for clients in args.clients:
        result = run(url, clients, max(args.requests, clients), args.mixed)
        result.update(contender=f"keras_tfm serve ({backend}), {clients} clients", task="serve", unit="new tokens/s")
        result.update(warm_up_s=warm_up_s, weights_MB=weights_mb, **resident_memory())
        results.append(result)
        ratio = result["value"] / results[0]["value"]
        print(
            f"{clients:3d} clients: {result['value']:7.1f} new tokens/s ({ratio:.2f}x one client), p50 "
            f"{result['p50_latency_s']} s, p99 {result['p99_latency_s']} s, first token {result['first_token_s']} s, "
            f"resident {result['rss_MB']} MB (peak {result['peak_MB']} MB, weights {weights_mb} MB)",
            flush=True,
        )
    running.should_exit = True
    asked = f"8 to {2 * NEW_TOKENS} new tokens each" if args.mixed else f"{NEW_TOKENS} new tokens"
    title = f"SmolLM2-135M shape served, greedy, {PROMPT_TOKENS}-token prompts + {asked}"
    write_results(f"serving{'_mixed' if args.mixed else ''}_{backend}", results, tasks={"serve": title})


if __name__ == "__main__":
    main()
