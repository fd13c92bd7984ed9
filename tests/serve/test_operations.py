"""Running the server: defaults from the checkpoint, the command and its shutdown, metrics, the access
log and CORS."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from keras_tfm.errors import InputError
from tests.checks import saved_language_model
from tests.serve.helpers import MESSAGES, Server

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")


@pytest.mark.backend_independent
def test_defaults_come_from_the_checkpoint_and_tokenizing_leaves_the_loop_free(model, monkeypatch, tmp_path):
    """A request that names no length or sampling gets the checkpoint's generation settings (here greedy,
    5 tokens), listed by /v1/models; while one prompt tokenizes slowly, other clients are answered."""
    import keras_tfm
    from keras_tfm.generation import GenerationConfig
    from keras_tfm.serve.requests import Defaults

    keras_tfm.save_huggingface(model, tmp_path)  # as a Hub checkpoint's generation_config.json sets them
    settings = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "max_new_tokens": 7, "eos_token_id": 1}
    (tmp_path / "generation_config.json").write_text(json.dumps(settings))
    loaded = keras_tfm.from_huggingface(str(tmp_path)).generation_config
    assert loaded == settings and Defaults.of(loaded) == Defaults(7, GenerationConfig(temperature=0.7, top_p=0.8))
    monkeypatch.setattr(model, "generation_config", {"do_sample": False, "max_new_tokens": 5})
    with Server(model) as server:
        entry = httpx.get(server.url + "/v1/models").json()["data"][0]
        assert entry["max_model_len"] == 64 and entry["defaults"] == {
            "max_tokens": 5,
            "temperature": 0.0,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "top_k": 0,
            "min_p": 0.0,
            "min_new_tokens": 0,
        }
        answer = httpx.post(server.url + "/v1/completions", json={"prompt": "to be"}, timeout=60).json()
        assert answer["choices"][0]["text"] == model.generate("to be", max_new_tokens=5)[len("to be") :]
        encode = model.tokenizer.encode_prompt
        monkeypatch.setattr(model.tokenizer, "encode_prompt", lambda text: time.sleep(2) or encode(text))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(httpx.post, server.url + "/v1/completions", json={"prompt": "to"}, timeout=60)
            time.sleep(0.3)
            started = time.time()
            assert httpx.get(server.url + "/health", timeout=60).status_code == 200
            assert time.time() - started < 1.0  # not behind the 2 s of tokenizing
            assert slow.result().status_code == 200
    monkeypatch.setattr(model, "generation_config", {"temperature": 7})
    with pytest.raises(InputError, match=r"model: create_app: its generation_config: `temperature` must be"):
        Server(model)
    import keras_tfm

    with pytest.raises(InputError, match="model: create_app: the server needs a language model"):
        Server(keras_tfm.vit_tiny(num_classes=2, image_size=8, patch_size=4, num_layers=1))
    monkeypatch.setattr(model, "generation_config", None)
    with pytest.raises(InputError, match="api_key: create_app: an empty key"):
        Server(model, api_key="")


@pytest.mark.backend_independent
def test_the_command_refuses_what_no_one_could_use_and_stops_on_sigterm(tmp_path, capsys):
    """Bad flags end in one line; a served model stops on the first SIGTERM, with status 0, its streams
    answered or cancelled within the shutdown timeout."""
    from keras_tfm.serve.__main__ import main

    saved_language_model(tmp_path / "lm.keras", max_length=64)
    for flags, said in ((["--port", "70000"], "--port must be in [0, 65535]"), (["--api-key", ""], "--api-key is empty"),
                        (["--max-tokens", "0"], "--max-tokens must be at least 1")):  # fmt: skip
        with pytest.raises(SystemExit) as ended:
            main([str(tmp_path / "lm.keras"), *flags])
        assert ended.value.code == 2 and said in capsys.readouterr().err
    command = [sys.executable, "-m", "keras_tfm.serve", str(tmp_path / "lm.keras")]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    server = subprocess.Popen(
        command + ["--port", str(port), "--shutdown-timeout", "2"], stderr=subprocess.PIPE, text=True, env=environment
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and server.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.2)
        body = {"prompt": "to be", "max_tokens": 8, "temperature": 0}
        assert httpx.post(url + "/v1/completions", json=body, timeout=120).status_code == 200
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    finally:
        server.kill()
    assert server.returncode == 0 and "Traceback" not in err, err[-2000:]


@pytest.mark.backend_independent
def test_operations_see_metrics_one_log_line_per_request_and_cors_where_asked(model, caplog):
    """`/metrics` in Prometheus' text format (parsed by prometheus_client), `/v1/models/{id}`, a browser's
    preflight answered for an allowed origin only (none by default), one access-log line per request."""
    from prometheus_client.parser import text_string_to_metric_families

    origin = "https://app.example"
    with Server(model) as plain:  # no CORS unless asked: a preflight finds no route that answers it
        assert httpx.options(plain.url + "/v1/chat/completions", headers={"Origin": origin}).status_code == 405
    with caplog.at_level("INFO", logger="keras_tfm.serve"), Server(model, cors_origins=(origin,)) as server:
        assert httpx.get(server.url + "/v1/models/tiny").json()["id"] == "tiny"
        assert httpx.get(server.url + "/v1/models/other").status_code == 404
        preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        allowed = httpx.options(server.url + "/v1/chat/completions", headers={"Origin": origin, **preflight})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == origin
        other = {"Origin": "https://evil.example", **preflight}
        assert httpx.options(server.url + "/v1/chat/completions", headers=other).status_code == 400
        body = {"messages": MESSAGES, "max_tokens": 3}
        answered = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"Origin": origin}, timeout=60)
        assert answered.headers["access-control-allow-origin"] == origin
        streamed = httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60)
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
        assert httpx.post(server.url + "/v1/completions", json={"prompt": ""}, timeout=60).status_code == 400
        assert httpx.get(server.url + "/health").status_code == 200
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    requests = {labels: value for (name, labels), value in samples.items() if name == "keras_tfm_requests_total"}
    assert requests[(("method", "POST"), ("route", "/v1/chat/completions"), ("status", "200"))] == 2
    assert requests[(("method", "OPTIONS"), ("route", "/v1/chat/completions"), ("status", "200"))] == 1
    assert requests[(("method", "POST"), ("route", "/v1/completions"), ("status", "400"))] == 1
    assert samples[("keras_tfm_generated_tokens_total", ())] == 6  # two answers of 3 tokens
    assert samples[("keras_tfm_prompt_tokens_total", ())] > 0
    assert samples[("keras_tfm_time_to_first_token_seconds_count", ())] == 1
    assert samples[("keras_tfm_rows_busy", ())] == 0 and samples[("keras_tfm_requests_waiting", ())] == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "keras_tfm.serve"]
    assert sum('"POST /v1/chat/completions" 200' in line for line in lines) == 2, lines
    assert any('"POST /v1/completions" 400' in line for line in lines)
    assert not any("/health" in line or "/metrics" in line for line in lines)  # polls are counted, not logged
    assert requests[(("method", "GET"), ("route", "/health"), ("status", "200"))] == 1


@pytest.mark.backend_independent
def test_the_commands_defaults_are_the_librarys(tmp_path):
    """The server's flags take `create_app`'s defaults, `--dtype` offers `from_huggingface`'s dtypes, and
    a checkpoint loads for serving in the global dtype policy, as `from_huggingface` loads it."""
    import inspect

    import keras

    from keras_tfm.convert.huggingface import DTYPES
    from keras_tfm.saving import load
    from keras_tfm.serve import create_app
    from keras_tfm.serve.__main__ import parser

    transformers = pytest.importorskip("transformers")
    args, taken = parser().parse_args(["checkpoint"]), inspect.signature(create_app).parameters
    for name in ("max_batch_size", "max_queue", "default_max_tokens", "escape_special_tokens"):
        assert getattr(args, name) == taken[name].default, name
    assert next(a for a in parser()._actions if a.dest == "dtype").choices == DTYPES and args.dtype is None
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=20, n_positions=16)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    policy = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy("bfloat16")
        assert load(str(tmp_path)).dtype_policy.name == "bfloat16"
    finally:
        keras.config.set_dtype_policy(policy)
