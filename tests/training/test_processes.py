"""Runs of several processes on localhost (JAX processes, TensorFlow workers), a lost process, and token
shards on disk."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import h5py
import keras
import numpy as np
import pytest

from keras_tfm.errors import DataError, InputError
from keras_tfm.training import initialize_processes
from tests.recipes.helpers import ROOT, SHAKESPEARE, TINY_GPT, recipe

BACKEND = keras.backend.backend()
FLAGS = ["--data", SHAKESPEARE, "--sample-every", "0", "--distribute", "data", *TINY_GPT]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def start(out, flags, index: int, count: int, port: int) -> subprocess.Popen:
    """Process `index` of `count` of the GPT recipe: JAX flags, or TensorFlow's `TF_CONFIG`."""
    environment = {**os.environ, "KERAS_BACKEND": BACKEND, "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, os.path.join(ROOT, "recipes", "gpt_lm.py"), *flags, "--output-dir", str(out)]
    if BACKEND == "jax":
        command += ["--coordinator-address", f"localhost:{port}", "--num-processes", str(count)]
        command += ["--process-id", str(index), "--process-timeout", "10"]
    else:
        workers = [f"localhost:{port + number}" for number in range(count)]
        environment["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        )
    return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_together(out, flags, count: int = 2) -> list[str]:
    port = free_port()
    runs = [start(out, flags, index, count, port) for index in range(count)]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    for run, output in zip(runs, outputs):
        assert run.returncode == 0, output[-3000:]
    return outputs


def weights(path) -> dict:
    arrays = {}
    with h5py.File(path) as file:
        file.visititems(
            lambda name, item: arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None
        )
    return arrays


def assert_same_run(one, two):
    """Same validation loss and weights (float32 sums in another order: a tight tolerance)."""
    expected, got = (json.loads((out / "metrics.json").read_text()) for out in (one, two))
    assert got["validation_loss"] == pytest.approx(expected["validation_loss"], rel=1e-5)
    assert expected["validation_loss"] < 3.9  # it learned: an untrained model scores about ln(65) = 4.17
    state = json.loads((one / "checkpoint" / "state.json").read_text())
    first, second = (weights(out / "checkpoint" / state["weights"]) for out in (one, two))
    assert first.keys() == second.keys() and len(first) > 10
    assert max(np.abs(first[name] - second[name]).max() for name in first) < 1e-5


def assert_different_settings_refused(out, flags):
    """One process with another learning rate and seed would mix two optimizers silently: every process
    refuses, naming the settings and each process's value, before a step; the checkpoint stays as it was."""
    state, log = (out / "checkpoint" / "state.json").read_text(), (out / "log.csv").read_text()
    port = free_port()
    runs = [
        start(out, [*flags, "--learning-rate", "0.003"], 0, 2, port),
        start(out, [*flags, "--learning-rate", "0.5", "--seed", "2"], 1, 2, port),
    ]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    for run, output in zip(runs, outputs):
        assert run.returncode == 2, output[-3000:]
        assert re.search(
            r"error: the 2 processes of this run were started with different settings: --learning-rate 0\.003 "
            r"\(process 0\), 0\.5 \(process 1\); --seed 0 \(process 0\), 2 \(process 1\); `validation_data` .*"
            r"Start every process with the same command and data",
            output,
        ), output[-3000:]
    assert (out / "checkpoint" / "state.json").read_text() == state and (out / "log.csv").read_text() == log


@pytest.mark.skipif(BACKEND == "torch", reason="JAX processes and TensorFlow workers")
def test_two_processes_lose_one_then_resume_to_the_run_of_one(tmp_path):
    """Two processes train as one: on JAX, two of one CPU device each as one device does; on TensorFlow,
    two workers (with a moving average of the weights) as one process with two devices.
    Process 1 is killed mid-run: process 0 stops within a minute naming it and the checkpoint; both started
    again with different settings refuse; with the same, they resume and end with the single run's validation
    loss and weights."""
    plain = ["--data", SHAKESPEARE, "--sample-every", "0", *TINY_GPT, "--steps", "24", "--steps-per-epoch", "4"]
    if BACKEND == "jax":
        flags = [*plain, "--distribute", "data"]
        single = recipe("gpt_lm.py", *plain, "--output-dir", str(tmp_path / "single"))
    else:  # graph mode without XLA: its compile of the step (every process, every start) tests nothing here
        flags = [*plain, "--distribute", "data", "--ema", "0.9", "--jit-compile", "off"]
        single = recipe("gpt_lm.py", *flags, "--cpu-devices", "2", "--output-dir", str(tmp_path / "single"))
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]

    out = tmp_path / "two"
    state_path = out / "checkpoint" / "state.json"
    port = free_port()
    runs = [start(out, flags, index, 2, port) for index in range(2)]
    deadline = time.time() + 300
    while time.time() < deadline and runs[0].poll() is None:
        if state_path.exists() and json.loads(state_path.read_text())["epoch"] >= 2:
            break
        time.sleep(0.05)
    assert runs[0].poll() is None, "the run ended before it could be stopped:\n" + runs[0].stdout.read()
    os.kill(runs[1].pid, signal.SIGKILL)
    killed = time.time()
    output = runs[0].communicate(timeout=120)[0]
    runs[1].communicate(timeout=60)
    assert time.time() - killed < 60 and runs[0].returncode == 4, output[-3000:]
    epoch = json.loads(state_path.read_text())["epoch"]
    assert 2 <= epoch < 6 and not (out / "metrics.json").exists()
    assert re.search(
        rf"error: process 1 of 2 stopped \(.*\); this process stops too\. The last good checkpoint \(epoch {epoch}\) "
        r"is in .*\. Start the same command on every process again to resume\.",
        output,
    ), output[-3000:]

    if BACKEND == "jax":  # the comparison after the gather is the backends'; TensorFlow's gather runs at every start
        assert_different_settings_refused(out, flags)
    outputs = run_together(out, flags)
    assert f"Resuming from {state_path}: {epoch} epochs done" in outputs[0]
    assert "of 2 processes (this is process 0)" in outputs[0] and outputs[1].count("Epoch") == 0  # one writer
    assert_same_run(tmp_path / "single", out)
    assert len((out / "log.csv").read_text().splitlines()) == 7  # header + 6 epochs, none repeated or lost
    if BACKEND == "tensorflow":
        # Under a strategy Keras' fit took a batch to build the model and lost it: the last step had no
        # batch (and every batch came a step early). The optimizer's step count says every step ran.
        for run in ("single", "two"):
            assert weights(tmp_path / run / "checkpoint" / "epoch-00006.weights.h5")["optimizer/vars/0"] == 24


# Process 1 dies after a first gather; process 0 stays out of collectives past the heartbeat timeout.
LOST_PEER = """
import os, signal, sys, time
import keras
from jax.experimental import multihost_utils
from keras_tfm.training import initialize_processes
from keras_tfm.training.distribute import lost_processes

index = int(sys.argv[2])
initialize_processes(sys.argv[1], 2, index, timeout=4)
multihost_utils.process_allgather(keras.ops.ones(2))
if index == 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(12)
try:
    multihost_utils.process_allgather(keras.ops.ones(2))
except Exception as error:
    print("lost:", lost_processes(10, error), flush=True)
    os._exit(4)
"""


@pytest.mark.skipif(BACKEND != "jax", reason="JAX processes")
def test_a_process_busy_past_the_heartbeat_timeout_names_its_lost_peer():
    """The coordinator notices the lost process (5 s without heartbeats) while process 0 computes:
    process 0 is not ended for it, and its next gather fails and names process 1."""
    address = f"localhost:{free_port()}"
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", LOST_PEER, address, str(index)],
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for index in range(2)
    ]
    output = runs[0].communicate(timeout=120)[0]
    runs[1].communicate(timeout=60)
    assert runs[0].returncode == 4 and "lost: [1]" in output, output[-3000:]


@pytest.mark.backend_independent
def test_bad_process_settings_are_refused_by_name(monkeypatch):
    for name in ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(
        InputError, match=r"^process_id: expected an integer in \[0, 2\) \(`num_processes` is 2\); got 2"
    ):
        initialize_processes("localhost:1234", 2, 2)
    with pytest.raises(
        InputError, match=r"^coordinator_address: expected HOST:PORT, such as 10\.0\.0\.1:1234; got 'here'"
    ):
        initialize_processes("here", 2, 0)
    with pytest.raises(InputError, match=r"^process_id: a run of several processes needs .*; `process_id` is missing"):
        initialize_processes("localhost:1234", 2, None)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(InputError, match=r"^num_processes: expected an integer in \$JAX_NUM_PROCESSES; got 'two'"):
        initialize_processes()


def test_several_processes_need_jax_and_a_coordinator_that_answers(tmp_path):
    if BACKEND != "jax":
        with pytest.raises(
            InputError, match=rf"^num_processes: several processes join with the jax backend .*not {BACKEND}"
        ):
            initialize_processes(f"localhost:{free_port()}", 2, 1)
        return
    port = free_port()  # nothing listens there
    started = time.time()
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "recipes", "gpt_lm.py"), *FLAGS, "--output-dir", str(tmp_path)]
        + ["--coordinator-address", f"localhost:{port}", "--num-processes", "2", "--process-id", "1"]
        + ["--process-timeout", "2"],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and time.time() - started < 60
    assert re.search(
        rf"error: --coordinator-address: process 1 of 2 could not reach the coordinator at 'localhost:{port}' within 2 s",
        done.stderr,
    ), done.stderr[-3000:]


@pytest.mark.backend_independent
def test_token_shards_hold_the_in_memory_ids_across_shard_boundaries(tmp_path):
    from keras_tfm.data import CharacterTokenizer, TokenShards, prepare_token_shards
    from keras_tfm.data.text import read_text, split_text

    path = tmp_path / "text.txt"
    path.write_text(read_text(SHAKESPEARE)[:30_000], encoding="utf-8")
    train_text, validation_text = split_text(read_text(str(path)))
    tokenizer = CharacterTokenizer.fit(train_text)
    shards = prepare_token_shards(
        str(path), tokenizer, str(tmp_path / "shards"), chunk_characters=997, shard_tokens=4096, log=None
    )
    train, validation = TokenShards(shards, "train"), TokenShards(shards, "validation")
    assert len(os.listdir(shards)) > 8  # several shards of each split
    expected = tokenizer.encode(train_text)
    np.testing.assert_array_equal(train[0 : len(train)], expected)
    np.testing.assert_array_equal(validation[0 : len(validation)], tokenizer.encode(validation_text))
    for start in (0, 4090, 4096, 8191, len(expected) - 70):  # windows across the 4,096-token boundaries
        np.testing.assert_array_equal(train[start : start + 65], expected[start : start + 65])

    other = CharacterTokenizer.fit(train_text + "\u00e9")
    with pytest.raises(
        DataError,
        match=rf"^token_shards: the shards in .* another tokenizer \(char, {tokenizer.vocabulary_size} tokens\)",
    ):
        prepare_token_shards(str(path), other, shards, log=None)
    other_text = tmp_path / "other.txt"
    other_text.write_text(read_text(SHAKESPEARE)[30_000:60_000], encoding="utf-8")
    with pytest.raises(
        DataError, match=r"^token_shards: the shards in .* were made from .*text.txt.*, not from .*other.txt"
    ):
        prepare_token_shards(str(other_text), tokenizer, shards, log=None)  # same tokenizer, another text
    with open(path, "a", encoding="utf-8") as file:
        file.write("more lines\n")
    with pytest.raises(DataError, match=r"text.txt' \(30,\d+ bytes\) as it is now \(they differ in size"):
        prepare_token_shards(str(path), tokenizer, shards, log=None)  # the same file, changed since

    with open(os.path.join(shards, "train-00002.bin"), "r+b") as file:
        file.seek(10)
        file.write(np.array([60000], "uint16").tobytes())  # a damaged byte: an id past the vocabulary
    with pytest.raises(DataError, match=r"train-00002.bin' holds id 60000 at token 5, outside the vocabulary"):
        train[8192 : 8192 + 64]
    with open(os.path.join(shards, "train-00001.bin"), "r+b") as file:
        file.truncate(100)
    with pytest.raises(DataError, match=r"train-00001\.bin' is missing or not 8,192 bytes long; delete .* and prepare"):
        TokenShards(shards, "train")


@pytest.mark.backend_independent
def test_an_empty_text_prepares_no_shards(tmp_path):
    from keras_tfm.data import CharacterTokenizer, prepare_token_shards

    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match=r"^data: .*empty.txt' is empty; expected text to train on"):
        prepare_token_shards(str(tmp_path / "empty.txt"), CharacterTokenizer.fit("ab"), str(tmp_path / "s"), log=None)
    assert not (tmp_path / "s").exists()
    (tmp_path / "one.txt").write_text("a")  # too little text to leave a token to train on
    with pytest.raises(DataError, match=r"gives no tokens to train on \(0 train, 1 validation tokens\)"):
        prepare_token_shards(str(tmp_path / "one.txt"), CharacterTokenizer.fit("ab"), str(tmp_path / "s"), log=None)
    assert os.listdir(tmp_path / "s") == []


@pytest.mark.backend_independent
def test_gpt_recipe_trains_from_token_shards_as_from_text(tmp_path):
    """The shards on disk give the batches of the in-memory path: the same validation loss."""
    flags = ["--data", SHAKESPEARE, "--steps", "4", "--steps-per-epoch", "2", "--sample-every", "0", *TINY_GPT]
    from_text = recipe("gpt_lm.py", *flags, "--output-dir", str(tmp_path / "text"))
    shards = tmp_path / "shards"
    prepared = recipe(
        "gpt_lm.py", *flags, "--token-shards", str(shards), "--prepare-only", "--output-dir", str(tmp_path / "p")
    )
    from_shards = recipe(
        "gpt_lm.py", *flags[2:], "--token-shards", str(shards), "--output-dir", str(tmp_path / "shards-run")
    )
    for done in (from_text, prepared, from_shards):
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "read from disk as batches need them" in from_shards.stdout and (shards / "meta.json").exists()
    expected, got = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("text", "shards-run"))
    assert got["validation_loss"] == expected["validation_loss"]

    refused = recipe(
        "gpt_lm.py",
        *flags[2:],
        "--token-shards",
        str(shards),
        "--tokenizer",
        "bpe",
        "--output-dir",
        str(tmp_path / "bpe"),
    )
    assert refused.returncode == 2
    assert (
        "error: --token-shards: the shards in" in refused.stderr
        and "made by a char tokenizer, not bpe" in refused.stderr
    )
    other = tmp_path / "other.txt"
    other.write_text("another text\n" * 500)
    refused = recipe(
        "gpt_lm.py",
        "--data",
        str(other),
        *flags[2:],
        "--token-shards",
        str(shards),
        "--output-dir",
        str(tmp_path / "o"),
    )
    assert refused.returncode == 2 and re.search(
        r"error: --token-shards: the shards in .* were made from .*input.txt", refused.stderr
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    refused = recipe(
        "gpt_lm.py", "--data", str(empty), *flags[2:], "--token-shards", str(tmp_path / "e"), "--prepare-only"
    )
    assert refused.returncode == 2 and "empty.txt' is empty" in refused.stderr and not (tmp_path / "e").exists()


def test_auto_precision_is_float32_without_an_accelerator(tmp_path):
    from keras_tfm.training import TrainingConfig
    from keras_tfm.training.fitting import precision

    assert precision(TrainingConfig(output_dir=str(tmp_path))) == "float32"  # this machine has no GPU
    assert precision(TrainingConfig(output_dir=str(tmp_path), precision="mixed_float16")) == "mixed_float16"
