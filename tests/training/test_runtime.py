"""The shared training runtime: recipes finish, resume after kill -9, stop on NaN, fail clearly, distribute."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_tfm.errors import CheckpointError, DataError, InputError
from keras_tfm.training import TrainingConfig, TrainingDiverged, plan_steps, train, training_config
from keras_tfm.training.cli import MODEL_OVERRIDES, recipe_parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAKESPEARE = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare", "input.txt")
MOVIE_REVIEWS = os.path.join(ROOT, "..", "shared", "data", "movie_reviews", "movie_reviews.zip")
MULTI30K = os.path.join(ROOT, "..", "shared", "data", "multi30k", "task1", "raw")
BACKEND = keras.backend.backend()
TINY_GPT = (
    "--num-layers 1 --num-heads 2 --hidden-dim 32 --max-length 32 --batch-size 8 --eval-batches 2 --sample-tokens 8 "
    "--verbose 2"
).split()


def recipe(name: str, *flags: str, wait: bool = True, timeout: int = 600, in_process: bool | None = None):
    """Runs `recipes/name` with `flags` as a user would, and returns its exit code and output (a
    `subprocess.CompletedProcess`), or the running process when `wait` is false.

    By default the recipe's `main` runs in this process, under `run_main` as from the command line,
    with `sys.argv` set to the flags and its output captured: that saves each run the seconds Python,
    Keras and the backend take to start. A run that must be its own process (to be killed, or to set
    up virtual devices with `--cpu-devices` before the backend starts) is a subprocess."""
    path = os.path.join(ROOT, "recipes", name)
    command = [sys.executable, path, *flags]
    if in_process is None:
        in_process = wait and "--cpu-devices" not in flags
    if not in_process:
        environment = {**os.environ, "KERAS_BACKEND": BACKEND, "TF_CPP_MIN_LOG_LEVEL": "2"}
        if not wait:
            return subprocess.Popen(
                command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout)
    return _run_recipe_here(name, command)


def _run_recipe_here(name: str, command: list[str]) -> subprocess.CompletedProcess:
    import contextlib
    import io
    import traceback

    from keras_tfm.training import run_main

    main = recipe_function(name, "main")
    stdout, stderr = io.StringIO(), io.StringIO()
    argv, policy = sys.argv, keras.config.dtype_policy()
    sys.argv = command[1:]
    code = 0
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                run_main(main)
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = argv
        keras.config.set_dtype_policy(policy)  # the recipe's --precision is process-wide
        keras.backend.clear_session()
    return subprocess.CompletedProcess(command, code, stdout.getvalue(), stderr.getvalue())


def recipe_function(name: str, function: str):
    """A function of a recipe script, to test its checks in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), os.path.join(ROOT, "recipes", name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def recipe_args(**values) -> argparse.Namespace:
    """The flags a recipe's --from-huggingface checks read: unset model overrides, then `values`."""
    return argparse.Namespace(**{**{name: None for name in MODEL_OVERRIDES}, **values})


def labelled_reviews(directory, per_class: int = 48):
    """A directory of `per_class` movie reviews of each class (the layout --finetune reads): a short run."""
    from keras_tfm.data import load_labelled_text

    texts, labels, class_names = load_labelled_text(MOVIE_REVIEWS)
    for label, name in enumerate(class_names):
        (directory / name).mkdir(parents=True)
        for i in np.flatnonzero(labels == label)[:per_class]:
            (directory / name / f"{i}.txt").write_text(texts[i])
    return directory


def saved_weight(checkpoint_directory, shape) -> np.ndarray:
    """The one model weight of `shape` in the last checkpoint a recipe wrote (optimizer slots left out)."""
    import h5py

    state = json.loads((checkpoint_directory / "state.json").read_text())
    found = []
    with h5py.File(checkpoint_directory / state["weights"]) as saved:
        saved.visititems(
            lambda name, item: (
                found.append(item[()])
                if not name.startswith("optimizer") and getattr(item, "shape", None) == shape
                else None
            )
        )
    assert len(found) == 1, f"{len(found)} weights of shape {shape}"
    return found[0]


def test_gpt_recipe_short_run_leaves_checkpoint_metrics_and_plots(tmp_path):
    out = tmp_path / "run"
    done = recipe(
        "gpt_lm.py",
        "--steps",
        "4",
        "--steps-per-epoch",
        "2",
        "--output-dir",
        str(out),
        "--precision",
        "mixed_bfloat16",
        "--tokenizer",
        "bpe",
        "--vocabulary-size",
        "300",
        "--remat",
        *TINY_GPT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "offline default" in done.stdout and "blocks rematerialized" in done.stdout
    )  # no --data: the bundled text, announced
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["epoch"] == 2 and (out / "checkpoint" / state["weights"]).stat().st_size > 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["backend"] == BACKEND and metrics["steps"] == 4 and metrics["precision"] == "mixed_bfloat16"
    assert metrics["remat"] is True
    assert metrics["tokenizer"] == "bpe" and metrics["vocabulary_size"] == 300
    assert 2.0 < metrics["validation_loss"] < 6.0
    assert np.isclose(metrics["validation_perplexity"], np.exp(metrics["validation_loss"]), rtol=1e-4)
    assert (out / "learning_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert len((out / "log.csv").read_text().splitlines()) == 3  # header + 2 epochs
    assert (out / "samples.txt").read_text()


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_character_level_gpt_recipe_is_written_for_transformers(tmp_path):
    """The default, character-level GPT run leaves a checkpoint that transformers' text-generation
    pipeline uses as is: its tokenizer's ids and its greedy text are the run's own."""
    transformers = pytest.importorskip("transformers")
    import keras_tfm
    from keras_tfm.data import load_tokenizer

    out = tmp_path / "run"
    done = recipe(
        "gpt_lm.py",
        "--data",
        SHAKESPEARE,
        "--steps",
        "2",
        "--steps-per-epoch",
        "2",
        "--sample-every",
        "0",
        "--output-dir",
        str(out),
        *TINY_GPT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((out / "metrics.json").read_text())["huggingface_checkpoint"] == str(out / "huggingface")
    hf, loading = transformers.AutoModelForCausalLM.from_pretrained(out / "huggingface", output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    embeddings = hf.state_dict()["transformer.wte.weight"].numpy()
    np.testing.assert_array_equal(embeddings, saved_weight(out / "checkpoint", embeddings.shape))
    ours = load_tokenizer(str(out / "tokenizer.json"))
    prompt = "ROMEO:\nWhat say'st thou?"
    generated = transformers.pipeline("text-generation", str(out / "huggingface"))(
        prompt, max_new_tokens=8, do_sample=False
    )[0]["generated_text"]
    ids = keras_tfm.from_huggingface(str(out / "huggingface")).generate(ours.encode(prompt)[None], max_new_tokens=8)
    assert generated == ours.decode(np.asarray(ids)[0]) and len(generated) == len(prompt) + 8


@pytest.mark.slow
def _stopped_after(out, flags, epochs, signal_number) -> subprocess.Popen:
    """A GPT recipe run in its own process, sent `signal_number` once it has written the checkpoint of
    epoch `epochs`."""
    process = recipe("gpt_lm.py", *flags, "--output-dir", str(out), wait=False)
    state_path = out / "checkpoint" / "state.json"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if state_path.exists() and json.loads(state_path.read_text())["epoch"] >= epochs:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be stopped:\n" + process.stdout.read()
    os.kill(process.pid, signal_number)
    process.wait(timeout=120)
    return process


@pytest.mark.skipif(
    keras.backend.backend() == "tensorflow",
    reason="signals and resuming are the runtime's; TensorFlow's exact resume: the in-process resume tests",
)
def test_ctrl_c_then_kill_9_and_rerun_resumes_to_the_same_result(tmp_path):
    """Ctrl-C (SIGINT) stops after the step it came in, with one line (it was lost on JAX, and the run
    went on); the same command resumes, is killed with kill -9, and resumes again: the validation loss is
    the uninterrupted run's."""
    flags = ["--data", SHAKESPEARE, "--steps", "24", "--steps-per-epoch", "4", "--sample-every", "0", *TINY_GPT]
    straight = recipe("gpt_lm.py", *flags, "--output-dir", str(tmp_path / "straight"))
    assert straight.returncode == 0, straight.stdout + straight.stderr
    expected = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    assert expected["validation_loss"] < 3.6  # it learned: an untrained model scores about ln(65) = 4.17

    out = tmp_path / "stopped"
    state_path = out / "checkpoint" / "state.json"
    interrupted = _stopped_after(out, flags, 2, signal.SIGINT)
    output = interrupted.stdout.read()
    interrupted_at = json.loads(state_path.read_text())["epoch"]
    assert interrupted.returncode == 130 and 2 <= interrupted_at < 5, output[-3000:]
    assert re.search(
        rf"error: interrupted \(Ctrl-C\); the last checkpoint \(epoch {interrupted_at}\) is kept in .*; run the "
        r"same command again to resume\.",
        output,
    ), output[-3000:]
    assert "Traceback" not in output and not (out / "metrics.json").exists()

    killed_at = interrupted_at
    if BACKEND != "jax":  # JAX's kill -9 and resume: test_processes.py, one of two processes killed
        killed = _stopped_after(out, flags, interrupted_at + 1, signal.SIGKILL)
        assert f"Resuming from {state_path}: {interrupted_at} epochs done" in killed.stdout.read()
        killed_at = json.loads(state_path.read_text())["epoch"]
        assert interrupted_at < killed_at < 6 and not (out / "metrics.json").exists()

    resumed = recipe("gpt_lm.py", *flags, "--output-dir", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{killed_at} epochs done, optimizer step {4 * killed_at}" in resumed.stdout
    got = json.loads((out / "metrics.json").read_text())
    assert got["validation_loss"] == pytest.approx(expected["validation_loss"], rel=1e-5, abs=1e-6)
    straight_log = (tmp_path / "straight" / "log.csv").read_text().splitlines()
    resumed_log = (out / "log.csv").read_text().splitlines()
    assert len(resumed_log) == len(straight_log) == 7  # header + 6 epochs, none repeated or lost


def test_a_full_disk_stops_the_run_with_one_line_and_it_resumes_once_there_is_room(tmp_path, monkeypatch):
    """HDF5 crashes the interpreter when the disk fills in the middle of a file: the room is measured
    first, and the run stops (status 2) with the last good checkpoint intact and named."""
    import shutil

    flags = ["--data", SHAKESPEARE, "--steps", "12", "--steps-per-epoch", "4", "--sample-every", "0", *TINY_GPT]
    straight = recipe("gpt_lm.py", *flags, "--output-dir", str(tmp_path / "straight"))
    assert straight.returncode == 0, straight.stdout + straight.stderr
    real, calls = shutil.disk_usage, []

    def disk_usage(path):  # room for the first checkpoint only
        calls.append(path)
        return real(path)._replace(free=100_000) if len(calls) > 1 else real(path)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    out = tmp_path / "full"
    full = recipe("gpt_lm.py", *flags, "--output-dir", str(out))
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-3000:]
    assert re.fullmatch(
        r"error: cannot write the checkpoint of epoch 2 in '.*checkpoint' \(it needs about 0\.\d MB and the disk "
        r"has 0\.1 MB free\); the last good checkpoint \(epoch 1\) is kept there\. Make room .* to resume\.\n",
        full.stderr,
    ), full.stderr
    assert sorted(os.listdir(out / "checkpoint")) == ["epoch-00001.weights.h5", "state.json"]
    monkeypatch.undo()
    resumed = recipe("gpt_lm.py", *flags, "--output-dir", str(out))
    assert resumed.returncode == 0 and "1 epochs done" in resumed.stdout, resumed.stderr[-3000:]
    expected, got = (json.loads((path / "metrics.json").read_text()) for path in (tmp_path / "straight", out))
    assert got["validation_loss"] == pytest.approx(expected["validation_loss"], rel=1e-5, abs=1e-6)


def test_a_checkpoint_file_that_cannot_be_written_leaves_nothing_half_written(tmp_path, monkeypatch):
    from keras_tfm.training import CheckpointManager

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
    model.compile(keras.optimizers.Adam(), "mse")
    model.train_on_batch(np.ones((2, 3)), np.ones((2, 3)))
    manager = CheckpointManager(str(tmp_path))
    manager.save(model, 1)

    def refused(path, *args, **kwargs):
        with open(path, "wb") as file:
            file.write(b"half")
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(model, "save_weights", refused)
    with pytest.raises(
        CheckpointError, match=r"epoch 2 in .* \(Permission denied\); the last good checkpoint \(epoch 1\)"
    ):
        manager.save(model, 2)
    assert sorted(os.listdir(tmp_path)) == ["epoch-00001.weights.h5", "state.json"]
    assert manager.state()["epoch"] == 1


def _args(tmp_path, **overrides):
    args = recipe_parser("test", {}, "tiny", str(tmp_path)).parse_args([])
    args.verbose = 0
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


def _config(tmp_path, **changes) -> TrainingConfig:
    """The recipes' default settings (through their flags), quiet, in `tmp_path`, with `changes`."""
    return training_config(_args(tmp_path), **changes)


def test_resuming_a_damaged_checkpoint_or_another_model_is_refused(tmp_path):
    from keras_tfm.training import CheckpointManager

    def compiled(layers: int) -> keras.Model:
        model = keras.Sequential([keras.Input((3,))] + [keras.layers.Dense(3) for _ in range(layers)])
        model.compile(keras.optimizers.Adam(), "mse")
        model.train_on_batch(np.ones((2, 3)), np.ones((2, 3)))
        return model

    saved = compiled(2)
    manager = CheckpointManager(str(tmp_path))
    path = manager.save(saved, 1)
    same = compiled(2)
    assert manager.restore(same) == 1
    np.testing.assert_array_equal(same.get_weights()[2], saved.get_weights()[2])
    # Keras loads the first layer of a two-layer checkpoint into a one-layer model without a word.
    with pytest.raises(CheckpointError, match=r"holds another model \(24 parameters\) than this one \(12\)"):
        manager.restore(compiled(1))
    with open(path, "r+b") as file:
        file.truncate(100)
    with pytest.raises(CheckpointError, match=r"cannot resume from '.*epoch-00001.weights.h5', damaged .*delete"):
        manager.restore(compiled(2))
    (tmp_path / "state.json").write_text('{"epoch": 1')
    with pytest.raises(CheckpointError, match=r"cannot resume from '.*state.json', damaged"):
        manager.restore(compiled(2))


def test_a_lora_checkpoint_resumes_exactly(tmp_path, rng):
    """The frozen kernels and the LoRA pairs come back as they were, not Keras' merged kernels and zeroed
    pairs, so training goes on as if never stopped."""
    import keras_tfm
    from keras_tfm.training import CheckpointManager
    from tests.models.test_lora import small_gpt

    ids = rng.integers(0, 50, size=(4, 16))
    x, y = ids[:, :-1], ids[:, 1:]

    def compiled() -> keras.Model:
        model = small_gpt()
        model.enable_lora(2)
        model.compile(optimizer=keras.optimizers.AdamW(3e-2), loss=keras_tfm.TokenCrossEntropy())
        return model

    straight = compiled()
    straight.fit(x, y, epochs=3, batch_size=4, verbose=0)
    first = compiled()
    first.fit(x, y, epochs=1, batch_size=4, verbose=0)
    manager = CheckpointManager(str(tmp_path))
    manager.save(first, 1)
    first.fit(x, y, epochs=1, batch_size=4, verbose=0)
    manager.save(first, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "epoch-00002.lora.npz",
        "epoch-00002.weights.h5",
        "state.json",
    ]

    resumed = compiled()
    resumed(x)
    assert manager.restore(resumed) == 2
    for saved, loaded in zip(first.weights, resumed.weights):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(loaded), keras.ops.convert_to_numpy(saved), err_msg=saved.path
        )
    resumed.fit(x, y, epochs=1, batch_size=4, verbose=0)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(resumed(x)), keras.ops.convert_to_numpy(straight(x)), atol=1e-5, rtol=0
    )
    (tmp_path / "epoch-00002.lora.npz").unlink()
    with pytest.raises(CheckpointError, match=r"cannot resume from '.*epoch-00002.lora.npz', damaged"):
        manager.restore(compiled())


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(tmp_path):
    config = _config(tmp_path, epochs=3, steps_per_epoch=2, batch_size=4)

    def batch(epoch, step):
        x = np.ones((4, 3), "float32")
        return (x * np.nan if epoch == 1 else x), np.zeros((4, 1), "float32")

    with pytest.raises(TrainingDiverged, match=r"NaN at step 0.*last good checkpoint \(epoch 1\).*`learning_rate`"):
        train(
            config,
            build_model=lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]),
            train_batch=batch,
            steps_per_pass=2,
            validation_data=(np.ones((4, 3)), np.zeros((4, 1))),
            loss="mse",
        )
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["epoch"] == 1


class _Interrupted(Exception):
    pass


def test_ema_validates_on_the_averaged_weights_and_resumes_both(tmp_path):
    """--ema: validation, the final evaluation and the returned model use the moving average; the
    raw weights go on training; an interrupted run resumes both, and a finished one re-evaluates the
    average."""
    from keras_tfm.training import CheckpointManager, make_optimizer

    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])

    def batch(epoch, step):
        x = np.random.default_rng(100 * epoch + step).normal(size=(16, 3)).astype("float32")
        return x, np.tanh(x @ np.array([[1.0], [-2.0], [0.5]], "float32"))

    validation = batch(99, 0)

    class InterruptAfterSecondEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise _Interrupted

    def run(directory, callbacks=()):
        config = _config(directory, epochs=4, steps_per_epoch=3, batch_size=16, learning_rate=0.05, ema=0.5)
        return train(
            config,
            build_model=build,
            train_batch=batch,
            steps_per_pass=3,
            validation_data=validation,
            loss="mse",
            callbacks=list(callbacks),
        )

    straight = run(tmp_path / "straight")
    ema_loss = straight.metrics["validation_loss"]
    assert straight.model.evaluate(*validation, verbose=0) == pytest.approx(ema_loss, rel=1e-6)
    assert straight.history["val_loss"][-1] == pytest.approx(ema_loss, rel=1e-6)  # fit validated the average too

    raw = build()  # the last checkpoint holds the raw weights (and the average in the optimizer's state)
    raw.compile(optimizer=make_optimizer(_config(tmp_path, ema=0.5), 12), loss="mse")
    assert CheckpointManager(str(tmp_path / "straight" / "checkpoint")).restore(raw) == 4
    raw_loss = raw.evaluate(*validation, verbose=0)
    assert abs(raw_loss - ema_loss) > 1e-3 * ema_loss, (raw_loss, ema_loss)

    with pytest.raises(_Interrupted):
        run(tmp_path / "resumed", [InterruptAfterSecondEpoch()])
    resumed = run(tmp_path / "resumed")
    assert resumed.metrics["validation_loss"] == pytest.approx(ema_loss, rel=1e-5)

    finished = run(tmp_path / "straight")  # nothing left to train: evaluates the average again
    assert finished.metrics["validation_loss"] == pytest.approx(ema_loss, rel=1e-5)

    with pytest.raises(InputError, match=r"^ema: expected a momentum in \[0, 1\), such as 0.999; got 1.5"):
        _config(tmp_path, ema=1.5)


@pytest.mark.backend_independent
def test_model_overrides_are_checked_against_the_model_class(tmp_path):
    import keras_tfm
    from keras_tfm.training import build_model

    sizes = {"vit_tiny": keras_tfm.vit_tiny, "transformer_small": keras_tfm.transformer_small}
    args = _args(tmp_path, model="vit_tiny", num_layers=2, hidden_dim=48)
    model = build_model(sizes, args, num_classes=3)
    assert (model.num_layers, model.hidden_dim, model.num_heads, model.num_classes) == (2, 48, 3, 3)
    args = _args(tmp_path, model="vit_tiny", max_length=16)
    with pytest.raises(InputError, match="^max_length: vit_tiny has no such setting"):
        build_model(sizes, args)
    args = _args(tmp_path, model="transformer_small", num_layers=2)
    with pytest.raises(InputError, match="^num_layers: transformer_small has no such setting"):
        build_model(sizes, args, source_vocabulary_size=10)


@pytest.mark.backend_independent
def test_lora_flags_need_pretrained_weights(tmp_path):
    """Refused before anything is built: LoRA of random weights would fine-tune nothing worth keeping."""
    with pytest.raises(
        InputError,
        match="^lora_rank: LoRA fine-tunes pretrained weights, and this run trains a model from scratch; use it "
        "with a `from_huggingface` checkpoint",
    ):
        train(
            _config(tmp_path, lora_rank=4),
            build_model=None,
            train_batch=None,
            steps_per_pass=1,
            validation_data=(),
            loss=None,
        )
    with pytest.raises(InputError, match="^lora_alpha: it scales LoRA's updates; give `lora_rank` too"):
        _config(tmp_path, lora_alpha=16.0)


def test_lora_reaches_the_model_inside_a_recipe_wrapper():
    """The ViT recipe puts preprocessing layers before the model; --lora-rank goes to the model inside."""
    import keras_tfm
    from keras_tfm.training.recording import zoo_model as _zoo_model

    vit = keras_tfm.vit_tiny(num_classes=3, image_size=16, patch_size=8, num_layers=1)
    wrapper = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Resizing(16, 16), vit])
    assert _zoo_model(wrapper) is vit and _zoo_model(vit) is vit


@pytest.mark.backend_independent
def test_steps_plan():
    config = TrainingConfig("unused", epochs=3, batch_size=8)
    assert plan_steps(config, 50) == (3, 50)
    assert plan_steps(dataclasses.replace(config, steps=120), 50) == (3, 40)
    assert plan_steps(dataclasses.replace(config, steps=7, steps_per_epoch=2), 50) == (4, 2)
    assert plan_steps(config, 0) == (3, 1)  # less data than one batch: one step an epoch, not none


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"batch_size": 0}, "batch_size: expected an integer >= 1; got 0"),
        ({"epochs": 2.5}, "epochs: expected an integer >= 1; got 2.5"),
        ({"steps": True}, "steps: expected an integer >= 1 or None; got True"),
        ({"warmup_steps": -1}, "warmup_steps: expected an integer >= 0 or None; got -1"),
        ({"seed": "0"}, "seed: expected an integer; got '0'"),
        ({"learning_rate": float("nan")}, "learning_rate: expected a number >= 0; got nan"),
        ({"weight_decay": -0.1}, "weight_decay: expected a number >= 0; got -0.1"),
        ({"clip_norm": float("inf")}, "clip_norm: expected a number >= 0; got inf"),
        ({"lora_rank": 4, "lora_alpha": 0.0}, "lora_alpha: expected a number > 0; got 0.0"),
        (
            {"precision": "float16"},
            "precision: expected one of auto, float32, mixed_bfloat16, mixed_float16; got 'float16'",
        ),
        ({"jit_compile": True}, "jit_compile: expected one of auto, on, off; got True"),
        ({"distribute": "pipeline"}, "distribute: expected one of none, data, model; got 'pipeline'"),
        ({"verbose": 3}, "verbose: expected 0, 1, 2 or None; got 3"),
        ({"remat": "yes"}, "remat: expected True or False; got 'yes'"),
        ({"output_dir": ""}, "output_dir: expected a directory path; got ''"),
    ],
)
def test_training_config_refuses_bad_settings_by_name(changes, message):
    """Settings are checked when the config is made, before anything is built or written."""
    with pytest.raises(InputError, match="^" + re.escape(message) + "[.]$") as caught:
        TrainingConfig(**{"output_dir": "runs/x", **changes})
    assert caught.value.argument == message.split(":")[0]
    config = TrainingConfig("runs/x", epochs=np.int64(2), learning_rate=np.float32(0.5))  # NumPy numbers are numbers
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 3


@pytest.mark.backend_independent
def test_the_command_line_shows_library_arguments_as_its_flags(capsys):
    """A library error names Python arguments; a recipe's command line prints the same error with its flags."""
    from keras_tfm.training import run_main

    parser = recipe_parser("test", {}, "tiny", "runs/x")
    parser.add_argument("--tokenizer")
    parser.aliases["kind"] = "tokenizer"

    def main():  # as a recipe's: parses its flags, then calls the library
        parser.parse_args([])
        raise DataError("give `kind` bpe, or another `output_dir`; `unknown` stays as it is.", argument="kind")

    with pytest.raises(SystemExit) as exit_status:
        run_main(main)
    assert exit_status.value.code == 2
    assert capsys.readouterr().err == (
        "error: --tokenizer: give --tokenizer bpe, or another --output-dir; `unknown` stays as it is.\n"
    )
    assert str(DataError("no such file.", argument="data")) == "data: no such file."  # Python callers


@pytest.mark.backend_independent
def test_numeric_flags_are_checked_when_read():
    from keras_tfm.training import FRACTION, POSITIVE, number

    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--count", type=POSITIVE)
    parser.add_argument("--rate", type=FRACTION)
    parser.add_argument("--learning-rate", type=number(0.0))  # 0: evaluate a checkpoint unchanged
    parser.add_argument("--mask-rate", type=number(0.0, 1.0, above_minimum=True))
    assert vars(parser.parse_args(["--count", "1", "--rate", "0", "--learning-rate", "0", "--mask-rate", "1"])) == dict(
        count=1, rate=0.0, learning_rate=0.0, mask_rate=1.0
    )
    for flag, value, expected in [
        ("--count", "0", "an integer >= 1"),
        ("--count", "2.5", "an integer >= 1"),
        ("--rate", "1", r"a number in \[0, 1\)"),
        ("--rate", "-0.1", r"a number in \[0, 1\)"),
        ("--learning-rate", "-1", "a number >= 0"),
        ("--learning-rate", "inf", "a number >= 0"),
        ("--learning-rate", "nan", "a number >= 0"),
        ("--mask-rate", "0", r"a number in \(0, 1\]"),
    ]:
        with pytest.raises(argparse.ArgumentError, match=f"expected {expected}; got '{value}'"):
            parser.parse_args([flag, value])


@pytest.mark.parametrize(
    "script, flags, message",
    [
        ("gpt_lm.py", ["--model", "gpt_huge"], "--model: expected one of gpt_shakespeare_char_cpu, .* got 'gpt_huge'"),
        (
            "gpt_lm.py",
            ["--data", "/nonexistent/input.txt"],
            "--data: expected a text file .* nothing is at '/nonexistent/input.txt'",
        ),
        # before pretraining, not after it
        ("bert_mlm.py", ["--finetune", "/nonexistent.zip"], "--finetune: expected a zip archive .* nothing is at"),
        # each was a traceback (NumPy's "need at least one array to stack"; the block's build), or trained on to NaN
        ("gpt_lm.py", ["--batch-size", "0"], "argument --batch-size: expected an integer >= 1; got '0'"),
        ("vit.py", ["--mixup", "-1"], "argument --mixup: expected a number >= 0; got '-1'"),
        (
            "gpt_lm.py",
            ["--num-heads", "5"],
            "--model: gpt_shakespeare_char_cpu: GPT: hidden_dim must be a multiple of num_heads; received hidden_dim=128, "
            "num_heads=5",
        ),
        # LoRA on BERT's pretraining would fine-tune random weights (see also test_lora_flags_need_pretrained_weights)
        ("bert_mlm.py", ["--lora-rank", "4"], "--lora-rank: LoRA fine-tunes pretrained weights: give --finetune PATH"),
        # was overridden by --sequence-length without a word
        (
            "bert_mlm.py",
            ["--max-length", "4"],
            "--max-length: the model's positions must hold a sequence of --sequence-length 128; got 4",
        ),
        ("gpt_lm.py", ["--data", "{tmp}/labels.gz"], "--data: '.*labels.gz' looks binary, not text"),
        # a traceback, where checkpoints could not have been written
        ("vit.py", ["--output-dir", "{tmp}/short.txt/run"], "--output-dir: cannot write to '.*short.txt/run'"),
        # refused after the tokenizer is fitted, but before it is written: a rerun must not reuse it
        (
            "gpt_lm.py",
            ["--data", "{tmp}/short.txt"],
            "--data: the training text has 11 tokens, fewer than one window of 65",
        ),
        ("bert_mlm.py", ["--num-heads", "3"], "--model: bert_mini: .*hidden_dim must be a multiple of num_heads"),
        (
            "translator.py",
            ["--num-heads", "3", "--vocabulary-size", "100"],
            "--model: transformer_small: .*hidden_dim must be a multiple of num_heads",
        ),
    ],
)
@pytest.mark.backend_independent
def test_recipe_bad_flags_fail_in_one_clear_line(tmp_path, script, flags, message):
    import re

    (tmp_path / "short.txt").write_text("to be or not\n")
    with gzip.open(tmp_path / "labels.gz", "wb") as file:  # an IDX file of labels, as Fashion-MNIST's
        file.write(bytes([0, 0, 8, 1, 0, 0, 0, 100]) + bytes(i % 10 for i in range(100)))
    flags = [flag.replace("{tmp}", str(tmp_path)) for flag in flags]
    done = recipe(script, "--output-dir", str(tmp_path / "run"), *flags, timeout=120)
    assert done.returncode == 2
    assert re.search(message, done.stderr), done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("*.json"))  # nothing lasting written: no tokenizer, no checkpoint


@pytest.mark.backend_independent
def test_a_recipe_refuses_to_resume_with_other_settings(tmp_path):
    """A rerun in the same --output-dir with other data, seed or learning rate would mix two runs: it is
    refused with the differences, as flags; flags that change nothing (verbosity) may differ."""
    out = tmp_path / "run"
    (tmp_path / "a.txt").write_text(open(SHAKESPEARE, encoding="utf-8").read()[:20_000])
    (tmp_path / "b.txt").write_text(open(SHAKESPEARE, encoding="utf-8").read()[20_000:40_000])
    first = [*TINY_GPT, "--steps", "1", "--output-dir", str(out), "--sample-every", "0"]
    done = recipe("gpt_lm.py", *first, "--data", str(tmp_path / "a.txt"))
    assert done.returncode == 0, done.stderr[-3000:]
    done = recipe("gpt_lm.py", *first, "--data", str(tmp_path / "a.txt"), "--seed", "1", "--learning-rate", "0.01")
    assert done.returncode == 2
    assert re.search(
        r"error: the checkpoint in '.*checkpoint' was written by a run with other settings: --learning-rate 0.003 "
        r"then, 0.01 now; --seed 0 then, 1 now. Give the same settings to resume it; to start a new run, delete "
        r".* or choose another --output-dir.",
        done.stderr,
    ), done.stderr
    done = recipe("gpt_lm.py", *first, "--data", str(tmp_path / "b.txt"))  # the tokenizer refuses first
    assert done.returncode == 2
    assert "holds a tokenizer an earlier run in this --output-dir fitted on other text;" in done.stderr, done.stderr
    done = recipe("gpt_lm.py", *first[:-2], "--data", str(tmp_path / "a.txt"), "--verbose", "0", "--sample-every", "1")
    assert done.returncode == 0 and "Training already finished" in done.stdout, done.stderr[-3000:]


def test_resuming_with_other_settings_is_refused(tmp_path):
    """`train` records the settings that change a run's result with each checkpoint and compares them on
    resume; a one-layer model and one step keep it fast on every backend."""

    def run(settings=None, **changes):
        return train(
            _config(tmp_path, **{"epochs": 1, "steps_per_epoch": 1, "batch_size": 4, **changes}),
            build_model=lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]),
            train_batch=lambda epoch, step: (np.ones((4, 3), "float32"), np.zeros((4, 1), "float32")),
            steps_per_pass=1,
            validation_data=(np.ones((4, 3), "float32"), np.zeros((4, 1), "float32")),
            loss="mse",
            settings=settings or {"data": "a.txt"},
        )

    run()
    with pytest.raises(
        CheckpointError,
        match=r"other settings: `batch_size` 4 then, 2 now; `data` 'a.txt' then, 'b.txt' now\. Give the same",
    ):
        run({"data": "b.txt"}, batch_size=2)
    with pytest.raises(CheckpointError, match=r"other settings: `precision` 'float32' then, 'mixed_bfloat16' now"):
        run(precision="mixed_bfloat16")
    assert run(verbose=2, jit_compile="off", tensorboard=False).metrics["epochs"] == 1  # changes nothing: resumes


@pytest.mark.skipif(BACKEND == "torch", reason="keras.distribution (JAX) and tf.distribute (TensorFlow)")
@pytest.mark.parametrize("mode", ["data", "model"])
def test_distributed_step_equals_single_device_step(mode):
    if mode == "model" and BACKEND != "jax":
        pytest.skip("model parallelism runs on the jax backend")
    if mode == "data" and BACKEND == "jax":
        pytest.skip("JAX's data parallelism: test_processes.py (two processes train as one device)")
    jit = "nojit" if BACKEND == "tensorflow" else "jit"  # see runtime.use_jit
    done = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(__file__), "distributed_check.py"), mode, jit],
        env={**os.environ, "KERAS_BACKEND": BACKEND},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["devices"] == 4
    assert result["weights_changed"] > 1e-3  # the step did something
    assert result["loss"][1] == pytest.approx(result["loss"][0], rel=1e-5)
    assert result["max_weight_difference"] < 1e-5


@pytest.mark.skipif(
    BACKEND != "jax", reason="JAX placed the metrics' variables (EMA distributed on TensorFlow: test_processes)"
)
def test_recipe_with_metric_objects_and_ema_trains_distributed(tmp_path):
    """The recipes make their metric objects before the runtime sets up the distribution; on JAX their
    variables then sat on one device and the compiled step refused them."""
    out = tmp_path / "run"
    done = recipe(
        "vit.py",
        "--steps",
        "4",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "16",
        "--num-layers",
        "1",
        "--hidden-dim",
        "48",
        "--intermediate-dim",
        "96",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
        "--distribute",
        "data",
        "--cpu-devices",
        "2",
        "--ema",
        "0.9",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "over 2 devices" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 4 and 0.0 <= metrics["validation_accuracy"] <= 1.0


def test_torch_refuses_distribute_clearly(tmp_path):
    if BACKEND != "torch":
        pytest.skip("the torch backend has no keras distribution engine")
    from keras_tfm.training import distribution_scope

    with pytest.raises(
        InputError, match="^distribute: 'data': supported on the jax and tensorflow backends, not torch"
    ):
        distribution_scope("data")


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_vit_recipe_short_run_on_the_offline_digits(tmp_path):
    out = tmp_path / "run"
    done = recipe(
        "vit.py",
        "--steps",
        "4",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "16",
        "--num-layers",
        "1",
        "--hidden-dim",
        "48",
        "--intermediate-dim",
        "96",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
        "--erasing",
        "0.5",
        "--mixup",
        "0.2",
        "--cutmix",
        "1.0",
        "--flip",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scikit-learn's bundled 8x8 handwritten digits" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 4 and 0.0 <= metrics["validation_accuracy"] <= 1.0
    flip_averaged = metrics["validation_accuracy_flip_averaged"]
    assert 0.0 <= flip_averaged <= 1.0 and f"averaged with their mirror images {flip_averaged:.4f}" in done.stdout
    for name in ("learning_curves.png", "attention_maps.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "checkpoint" / "state.json").read_text())["epoch"] == 2
    _check_vit_written_for_transformers(out, metrics)


def _check_vit_written_for_transformers(out, metrics):
    """The recipe's trained ViT as a transformers checkpoint: its weights, the digits' class names, and an
    image processor that prepares raw pixels as the recipe does (scaled to [0, 1])."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import keras_tfm
    from keras_tfm.data import load_images

    assert metrics["huggingface_checkpoint"] == str(out / "huggingface")
    hf, loading = transformers.AutoModelForImageClassification.from_pretrained(
        out / "huggingface", output_loading_info=True
    )
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    assert hf.config.id2label == {i: str(i) for i in range(10)}
    patch_kernel = hf.state_dict()["vit.embeddings.patch_embeddings.projection.weight"].numpy().transpose(2, 3, 1, 0)
    np.testing.assert_allclose(saved_weight(out / "checkpoint", patch_kernel.shape), patch_kernel, atol=1e-6, rtol=0)
    images = load_images(None, None).test[0][:8]
    processor = transformers.AutoImageProcessor.from_pretrained(out / "huggingface")
    with torch.no_grad():
        logits = hf(**processor(list(images), return_tensors="pt")).logits.numpy()
    ours = keras_tfm.from_huggingface(str(out / "huggingface"))(images.astype("float32") / 255)
    np.testing.assert_allclose(logits, keras.ops.convert_to_numpy(ours), atol=1e-4, rtol=0)


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_translator_recipe_short_run_reports_bleu(tmp_path):
    out = tmp_path / "run"
    done = recipe(
        "translator.py",
        "--steps",
        "4",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "16",
        "--num-layers",
        "1",
        "--hidden-dim",
        "32",
        "--intermediate-dim",
        "64",
        "--num-heads",
        "2",
        "--sequence-length",
        "16",
        "--vocabulary-size",
        "100",
        "--bleu-sentences",
        "8",
        "--beam-size",
        "2",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "generated English number words" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test_sentences"] == 8 and 0.0 <= metrics["test_bleu_lowercase"] <= 100.0
    assert metrics["bleu_signature"].startswith("BLEU = ")
    assert len((out / "translations.txt").read_text().splitlines()) == 8
    assert (out / "learning_curves.png").exists() and (out / "tokenizer_source.json").exists()


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_translator_recipe_with_sentencepiece_scores_a_test_source_that_encodes_to_nothing(tmp_path):
    import gzip

    data = tmp_path / "multi30k"  # the layout of ../shared/data/multi30k, a few of its lines
    data.mkdir()
    for split, lines in (("train", 64), ("val", 8), ("test_2016_flickr", 3)):
        for language in ("de", "en"):
            with gzip.open(os.path.join(MULTI30K, f"{split}.{language}.gz"), "rt", encoding="utf-8") as file:
                text = [next(file) for _ in range(lines)]
            if split.startswith("test"):  # a source of control characters only: no subword
                text.append("\x07\x01\n" if language == "de" else "A dog.\n")
            (data / f"{split}.{language}").write_text("".join(text), encoding="utf-8")
    out = tmp_path / "run"
    done = recipe(
        "translator.py",
        "--data",
        str(data),
        "--tokenizer",
        "sentencepiece",
        "--steps",
        "1",
        "--batch-size",
        "8",
        "--num-layers",
        "1",
        "--hidden-dim",
        "16",
        "--intermediate-dim",
        "16",
        "--num-heads",
        "2",
        "--sequence-length",
        "12",
        "--vocabulary-size",
        "200",
        "--beam-size",
        "1",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr  # translate() refused the empty source: a traceback
    rows = [line.split("\t") for line in (out / "translations.txt").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 4 and rows[-1] == ["\x07\x01", "A dog.", ""]
    assert json.loads((out / "metrics.json").read_text())["test_sentences"] == 4
    assert json.loads((out / "tokenizer_target.json").read_text())["kind"] == "sentencepiece"


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_bert_recipe_pretrains_then_finetunes(tmp_path):
    out = tmp_path / "run"
    done = recipe(
        "bert_mlm.py",
        "--steps",
        "4",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "32",
        "--num-layers",
        "1",
        "--hidden-dim",
        "32",
        "--num-heads",
        "2",
        "--intermediate-dim",
        "64",
        "--sequence-length",
        "32",
        "--vocabulary-size",
        "500",
        "--finetune",
        str(labelled_reviews(tmp_path / "labelled")),
        "--finetune-epochs",
        "1",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pretrained = json.loads((out / "metrics.json").read_text())
    assert pretrained["steps"] == 4 and pretrained["masked_tokens_evaluated"] > 0
    assert np.isclose(pretrained["validation_perplexity"], np.exp(pretrained["validation_loss"]), rtol=1e-4)
    finetuned = json.loads((out / "finetune" / "metrics.json").read_text())
    assert finetuned["model"] == "bert_mini" and 0.0 <= finetuned["validation_accuracy"] <= 1.0
    assert "['neg', 'pos']" in done.stdout
    for stage in (out, out / "finetune"):
        assert (stage / "learning_curves.png").exists() and (stage / "checkpoint" / "state.json").exists()
    # each stage's model and the WordPiece tokenizer, for transformers users
    transformers = pytest.importorskip("transformers")
    from keras_tfm.data import load_tokenizer

    for stage, hf_class in (
        (out, transformers.BertForMaskedLM),
        (out / "finetune", transformers.BertForSequenceClassification),
    ):
        assert json.loads((stage / "metrics.json").read_text())["huggingface_checkpoint"] == str(stage / "huggingface")
        hf, loading = hf_class.from_pretrained(stage / "huggingface", output_loading_info=True)
        assert not loading["missing_keys"] and not loading["unexpected_keys"]
        embeddings = hf.state_dict()["bert.embeddings.word_embeddings.weight"].numpy()
        np.testing.assert_array_equal(embeddings, saved_weight(stage / "checkpoint", embeddings.shape))
    assert hf.config.id2label == {0: "neg", 1: "pos"}  # the fine-tuned classifier's class names
    line = "An unexpectedly moving film, with a plot that twists."
    ours = load_tokenizer(str(out / "tokenizer.json")).encode(line).tolist()
    assert (
        transformers.AutoTokenizer.from_pretrained(out / "huggingface")(line, add_special_tokens=False)["input_ids"]
        == ours
    )


def test_dynamic_masks_follow_the_bert_recipe():
    """The recipe's masker: 15% selected, never special tokens, 80/10/10
    [MASK]/random/unchanged, the same masks for the same seed (resume) and new ones for a new step."""
    from keras_tfm.data.masking import DynamicMasker, pack_sequences

    pad, cls, sep, mask = 0, 2, 3, 4
    rng = np.random.default_rng(0)
    rows = pack_sequences(rng.integers(10, 1000, 400 * 126), 128, cls, sep)
    assert rows.shape == (400, 128) and (rows[:, 0] == cls).all() and (rows[:, -1] == sep).all()
    masker = DynamicMasker(1000, mask, [pad, cls, sep], pad, mask_rate=0.15, mask_positions=40)
    inputs, labels, weights = masker(rows, [0, 1, 2])
    selected = weights > 0
    positions = inputs["mask_positions"][selected]
    assert abs(selected.sum() / (400 * 126) - 0.15) < 0.01 and selected.sum(1).max() <= 40
    assert not np.isin(positions, [0, 127]).any()  # [CLS] and [SEP] are never selected
    rows_index = np.nonzero(selected)[0]
    new, original = inputs["token_ids"][rows_index, positions], rows[rows_index, positions]
    assert np.array_equal(labels[selected], original)
    shares = [(new == mask).mean(), ((new != mask) & (new != original)).mean(), (new == original).mean()]
    assert abs(shares[0] - 0.8) < 0.03 and abs(shares[1] - 0.1) < 0.03 and abs(shares[2] - 0.1) < 0.03
    assert np.array_equal(masker(rows, [0, 1, 2])[0]["mask_positions"], inputs["mask_positions"])
    assert not np.array_equal(masker(rows, [0, 1, 3])[0]["mask_positions"], inputs["mask_positions"])


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_vit_recipe_fine_tunes_a_hugging_face_checkpoint(tmp_path):
    """--from-huggingface: the checkpoint's architecture and weights, a head for the data's 10 classes,
    grayscale digits as RGB, resized and cropped as its image processor does; flags that would change the architecture are refused."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    checkpoint = tmp_path / "checkpoint"
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        num_hidden_layers=1,
        hidden_size=24,
        num_attention_heads=2,
        intermediate_size=48,
        num_labels=7,
    )
    hf = transformers.ViTForImageClassification(config)
    hf.save_pretrained(str(checkpoint))
    # resizes to 20 and crops the center 16 x 16, the checkpoint's size
    transformers.DeiTImageProcessor(
        size={"height": 20, "width": 20}, crop_size={"height": 16, "width": 16}
    ).save_pretrained(str(checkpoint))
    checkpoint_settings = recipe_function("vit.py", "checkpoint_settings")
    with pytest.raises(InputError, match="^patch_size: `from_huggingface` takes the architecture from the checkpoint"):
        checkpoint_settings(
            recipe_args(from_huggingface=str(checkpoint), model="vit_small_images", patch_size=8, pooling="token")
        )

    out = tmp_path / "run"
    # Learning rate 0: the weights stay the checkpoint's, to be compared below.
    done = recipe(
        "vit.py",
        "--from-huggingface",
        str(checkpoint),
        "--steps",
        "2",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "16",
        "--learning-rate",
        "0",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with torch.device("meta"):
        ten_classes = transformers.ViTForImageClassification(
            transformers.ViTConfig(
                **{**{k: v for k, v in config.to_dict().items() if k not in ("id2label", "label2id")}, "num_labels": 10}
            )
        )
    assert f"{sum(p.numel() for p in ten_classes.parameters()):,} parameters" in done.stdout
    assert "Images: 8x8x3, to the model at 16x16 through resizing, center_crop, rescaling, normalization" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == f"from_huggingface {checkpoint}" and 0.0 <= metrics["validation_accuracy"] <= 1.0
    patch_kernel = hf.state_dict()["vit.embeddings.patch_embeddings.projection.weight"].numpy().transpose(2, 3, 1, 0)
    np.testing.assert_allclose(saved_weight(out / "checkpoint", patch_kernel.shape), patch_kernel, atol=1e-6, rtol=0)
    # written back for transformers with the checkpoint's processor, grayscale made RGB, and the data's classes
    processor = json.loads((out / "huggingface" / "preprocessor_config.json").read_text())
    assert processor["image_processor_type"] == "DeiTImageProcessor" and processor["do_convert_rgb"]
    assert processor["size"] == {"height": 20, "width": 20} and processor["crop_size"] == {"height": 16, "width": 16}
    tuned = transformers.AutoModelForImageClassification.from_pretrained(out / "huggingface")
    assert tuned.config.image_size == 16 and tuned.config.id2label == {i: str(i) for i in range(10)}
    gray = np.arange(64, dtype="uint8").reshape(8, 8, 1) * 4
    assert transformers.AutoImageProcessor.from_pretrained(out / "huggingface")(gray, return_tensors="np")[
        "pixel_values"
    ].shape == (1, 3, 16, 16)


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_bert_recipe_fine_tunes_a_hugging_face_checkpoint(tmp_path):
    """--from-huggingface: no pretraining; the checkpoint's tokenizer, weights and pooler, a new head."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from keras_tfm.data import read_text
    from tests.checks import bert_vocabulary

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "vocab.txt").write_text("\n".join(bert_vocabulary(read_text(MOVIE_REVIEWS)[:200_000])) + "\n")
    transformers.BertTokenizer(str(checkpoint / "vocab.txt")).save_pretrained(str(checkpoint))
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len((checkpoint / "vocab.txt").read_text().split()),
        hidden_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=40,
    )
    hf = transformers.BertForPreTraining(config)
    hf.save_pretrained(str(checkpoint))
    with pytest.raises(DataError, match="^from_huggingface: give --finetune PATH"):
        recipe_function("bert_mlm.py", "finetune_checkpoint")(
            recipe_args(from_huggingface=str(checkpoint), finetune=None)
        )

    out = tmp_path / "run"
    # Learning rate 0: the weights stay the checkpoint's, to be compared below.
    labelled = labelled_reviews(tmp_path / "labelled")
    done = recipe(
        "bert_mlm.py",
        "--from-huggingface",
        str(checkpoint),
        "--finetune",
        str(labelled),
        "--sequence-length",
        "32",
        "--batch-size",
        "32",
        "--finetune-epochs",
        "1",
        "--finetune-learning-rate",
        "0",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (out / "checkpoint").exists()  # no pretraining stage
    metrics = json.loads((out / "finetune" / "metrics.json").read_text())
    assert metrics["model"] == f"from_huggingface {checkpoint}" and 0.0 <= metrics["validation_accuracy"] <= 1.0
    with torch.device("meta"):
        two_classes = transformers.BertForSequenceClassification(config)
    assert f"{sum(p.numel() for p in two_classes.parameters()):,} parameters" in done.stdout
    embeddings = hf.state_dict()["bert.embeddings.word_embeddings.weight"].numpy()
    np.testing.assert_allclose(
        saved_weight(out / "finetune" / "checkpoint", embeddings.shape), embeddings, atol=1e-6, rtol=0
    )


def gpt2_checkpoint(tmp_path):
    """A small random GPT-2 checkpoint with a byte-pair tokenizer learned on Shakespeare, in
    tmp_path/checkpoint, and the text in tmp_path/text.txt."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from keras_tfm.data import BytePairTokenizer

    with open(SHAKESPEARE, encoding="utf-8") as file:
        text = file.read()[:100_000]
    (tmp_path / "text.txt").write_text(text)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    learned = BytePairTokenizer.fit(text, 400)
    (checkpoint / "vocab.json").write_text(json.dumps(learned.vocabulary))
    (checkpoint / "merges.txt").write_text("#version: 0.2\n" + "\n".join(learned.merges) + "\n")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=400, n_positions=64, n_embd=32, n_layer=1, n_head=2)
    )
    hf.save_pretrained(str(checkpoint))
    return checkpoint, hf


def short_fine_tuning(checkpoint, tmp_path, out) -> list[str]:
    """gpt_lm.py's flags for two steps of fine-tuning `checkpoint` on tmp_path/text.txt into `out`."""
    return [
        *("--from-huggingface", str(checkpoint), "--data", str(tmp_path / "text.txt"), "--max-length", "32"),
        *("--steps", "2", "--steps-per-epoch", "2", "--batch-size", "8", "--eval-batches", "2"),
        *("--sample-tokens", "8", "--sample-every", "0", "--verbose", "2", "--output-dir", str(out)),
    ]


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_gpt_recipe_fine_tunes_a_hugging_face_checkpoint(tmp_path):
    """--from-huggingface: the checkpoint's weights and its byte-pair tokenizer, windows of --max-length."""
    checkpoint, hf = gpt2_checkpoint(tmp_path)
    checkpoint_settings = recipe_function("gpt_lm.py", "checkpoint_settings")
    flags = dict(model="gpt_shakespeare_char_cpu", tokenizer="char", vocabulary_size=8192)
    with pytest.raises(DataError, match="^max_length: the checkpoint has 64 positions; got 65"):
        checkpoint_settings(recipe_args(from_huggingface=str(checkpoint), **{**flags, "max_length": 65}))
    small = tmp_path / "small_vocabulary"
    small.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (small / name).write_text((checkpoint / name).read_text())
    (small / "config.json").write_text(
        json.dumps({**json.loads((checkpoint / "config.json").read_text()), "vocab_size": 300})
    )
    with pytest.raises(DataError, match="the tokenizer has 400 tokens, more than the checkpoint's 300 embeddings"):
        checkpoint_settings(recipe_args(from_huggingface=str(small), **flags))

    out = tmp_path / "run"
    # Learning rate 0: the weights stay the checkpoint's, to be compared below.
    done = recipe("gpt_lm.py", *short_fine_tuning(checkpoint, tmp_path, out), "--learning-rate", "0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{sum(p.numel() for p in hf.parameters()):,} parameters" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == f"from_huggingface {checkpoint}" and metrics["vocabulary_size"] == 400
    assert 4.0 < metrics["validation_loss"] < 8.0  # random weights over 400 tokens: about log(400) = 6.0
    assert (out / "samples.txt").read_text()
    embeddings = hf.state_dict()["transformer.wte.weight"].numpy()
    np.testing.assert_allclose(saved_weight(out / "checkpoint", embeddings.shape), embeddings, atol=1e-6, rtol=0)
    # the fine-tuned model as a Hugging Face checkpoint, with the checkpoint's tokenizer files
    import transformers

    assert metrics["huggingface_checkpoint"] == str(out / "huggingface")
    exported = transformers.GPT2LMHeadModel.from_pretrained(out / "huggingface").state_dict()
    assert set(exported) == set(hf.state_dict())
    np.testing.assert_array_equal(
        exported["transformer.wte.weight"].numpy(), saved_weight(out / "checkpoint", embeddings.shape)
    )
    vocabulary = transformers.GPT2Tokenizer.from_pretrained(out / "huggingface").get_vocab()
    vocabulary.pop("<|endoftext|>")  # GPT2Tokenizer adds it
    assert vocabulary == json.loads((checkpoint / "vocab.json").read_text())


@pytest.mark.backend_independent  # the recipe's pipeline; LoRA's training and resume on each backend: test_lora, test_peft
def test_gpt_recipe_lora_fine_tunes_a_hugging_face_checkpoint_and_resumes(tmp_path):
    """--lora-rank: the checkpoint's weights stay as they were; only the pairs train, and a rerun with more
    steps resumes them."""
    checkpoint, hf = gpt2_checkpoint(tmp_path)
    out = tmp_path / "run"
    flags = [
        "--from-huggingface",
        str(checkpoint),
        "--data",
        str(tmp_path / "text.txt"),
        "--max-length",
        "32",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "8",
        "--eval-batches",
        "2",
        "--sample-tokens",
        "8",
        "--sample-every",
        "0",
        "--learning-rate",
        "1e-2",
        "--lora-rank",
        "4",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    ]
    done = recipe("gpt_lm.py", *flags, "--steps", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trained = 2 * (32 * 4 + 4 * 32)  # query and value of the one block
    assert (
        f"{sum(p.numel() for p in hf.parameters()) + trained:,} parameters ({trained:,} trained: LoRA rank 4)"
        in done.stdout
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["lora_rank"] == 4 and metrics["trainable_parameters"] == trained
    resumed = recipe("gpt_lm.py", *flags, "--steps", "2")  # exact resumption: test_a_lora_checkpoint_resumes_exactly
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "Training already finished in this output directory" in resumed.stdout
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["epoch"] == 1 and (out / "checkpoint" / state["lora"]).exists()
    embeddings = hf.state_dict()["transformer.wte.weight"].numpy()  # frozen, though the learning rate is not 0
    np.testing.assert_allclose(saved_weight(out / "checkpoint", embeddings.shape), embeddings, atol=1e-6, rtol=0)
    with np.load(out / "checkpoint" / state["lora"]) as pairs:
        assert np.abs(pairs["block_0/self_attention/query:b"]).max() > 0  # trained from zero

    # The run wrote its pairs as a peft adapter on the checkpoint (query and value: one c_attn pair of rank 8),
    # which a new run takes as --from-huggingface and trains on.
    assert metrics["peft_adapter"] == str(out / "peft_adapter")
    adapter = json.loads((out / "peft_adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["base_model_name_or_path"], adapter["target_modules"]) == (
        8,
        str(checkpoint),
        ["transformer.h.0.attn.c_attn"],
    )
    peft = pytest.importorskip("peft")
    import torch

    import keras_tfm

    ids = np.arange(12).reshape(2, 6)
    tuned = peft.PeftModel.from_pretrained(hf, out / "peft_adapter").eval()
    with torch.no_grad():
        expected = tuned(torch.tensor(ids)).logits.numpy()
    ours = keras_tfm.from_huggingface(str(out / "peft_adapter"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(ids)), expected, atol=1e-4, rtol=0)
    again = recipe(
        "gpt_lm.py",
        *[flag for flag in flags[2:] if flag not in ("--lora-rank", "4")],
        "--steps",
        "2",
        "--from-huggingface",
        str(out / "peft_adapter"),
        "--output-dir",
        str(tmp_path / "again"),
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    trained = 3 * (32 * 8 + 8 * 32)  # query, key and value, each with c_attn's A and its third of B
    assert f"({trained:,} trained: LoRA rank 8)" in again.stdout
    assert (
        json.loads((tmp_path / "again" / "metrics.json").read_text())["model"]
        == f"from_huggingface {out / 'peft_adapter'}"
    )


@pytest.mark.backend_independent
def test_checkpoint_config_refuses_what_a_checkpoint_fixes(tmp_path):
    from keras_tfm.training import checkpoint_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 64}))
    args = argparse.Namespace(
        from_huggingface=str(tmp_path),
        model="small",
        num_layers=None,
        num_heads=None,
        hidden_dim=None,
        intermediate_dim=None,
        dropout=None,
        max_length=32,
        tokenizer="char",
    )
    with pytest.raises(
        InputError, match="^max_length: `from_huggingface` takes the model from the checkpoint; leave `max_length` out"
    ):
        checkpoint_config(args, "gpt2", {"model": "small"}, "takes the model from the checkpoint")
    with pytest.raises(InputError, match="^tokenizer: `from_huggingface` reason; leave `tokenizer` out"):
        checkpoint_config(args, "gpt2", {"tokenizer": "bpe"}, "reason", keep=("max_length",))
    with pytest.raises(DataError, match="expected a vit checkpoint; .* holds a 'gpt2' model"):
        checkpoint_config(args, "vit", {}, "reason", keep=("max_length",))
    with pytest.raises(DataError, match="^from_huggingface: there is no directory"):
        checkpoint_config(
            argparse.Namespace(**{**vars(args), "from_huggingface": str(tmp_path / "none")}),
            "gpt2",
            {},
            "reason",
            keep=("max_length",),
        )
    checkpoint = checkpoint_config(args, "gpt2", {"model": "small"}, "reason", keep=("max_length",))
    assert (checkpoint.config["n_positions"], checkpoint.directory, checkpoint.adapter) == (64, str(tmp_path), None)
    config = training_config(argparse.Namespace(**vars(args), output_dir=str(tmp_path)), checkpoint)
    assert config.model_name == f"from_huggingface {tmp_path}"
    assert args.model == "small"  # the flags are left as given


def llama_family_checkpoint(tmp_path, initializer_range: float = 0.02):
    """A small random Qwen2 checkpoint (query/key/value biases, grouped keys and values) with a
    tokenizer.json learned on Shakespeare in Llama 3's form (byte-level BPE, a begin-of-text token added
    in front), in tmp_path/checkpoint; the text in tmp_path/text.txt."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from tokenizers import ByteLevelBPETokenizer, processors

    with open(SHAKESPEARE, encoding="utf-8") as file:
        text = file.read()[:100_000]
    (tmp_path / "text.txt").write_text(text)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    learner = ByteLevelBPETokenizer()
    learner.train_from_iterator([text], vocab_size=400, special_tokens=["<|begin_of_text|>"], show_progress=False)
    learner.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    learner.save(str(checkpoint / "tokenizer.json"))
    (checkpoint / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>"})
    )
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=400,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
    )
    hf = transformers.Qwen2ForCausalLM(config)
    hf.save_pretrained(str(checkpoint))
    return checkpoint, hf, text


@pytest.mark.backend_independent
def test_a_checkpoints_tokenizer_json_gives_transformers_ids(tmp_path):
    transformers = pytest.importorskip("transformers")
    from keras_tfm.data import HuggingFaceTokenizer, load_tokenizer, save_tokenizer

    checkpoint, _, text = llama_family_checkpoint(tmp_path)
    ours = HuggingFaceTokenizer.from_huggingface(str(checkpoint))
    theirs = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    sample = text[:2000] + " naïve café — 東京\n\n"
    assert ours.encode(sample).tolist() == theirs(sample, add_special_tokens=False)["input_ids"]
    assert ours.encode(sample, add_special_tokens=True).tolist() == theirs(sample)["input_ids"]
    assert ours.encode(sample, add_special_tokens=True)[0] == 0  # Llama 3's <|begin_of_text|> in front
    assert ours.decode(ours.encode(sample)) == sample and ours.vocabulary_size == 400
    reloaded = load_tokenizer(save_tokenizer(ours, str(tmp_path)))
    assert reloaded.encode(sample).tolist() == ours.encode(sample).tolist()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="^from_huggingface: no tokenizer.json in"):
        HuggingFaceTokenizer.from_huggingface(str(tmp_path / "empty"))


@pytest.mark.backend_independent
def test_gpt_recipe_lora_fine_tunes_a_llama_family_checkpoint_for_transformers(tmp_path):
    """--from-huggingface with a Qwen2 checkpoint and --lora-rank: its tokenizer.json, its weights with the
    pairs trained, written back as a checkpoint transformers loads and as a peft adapter."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    checkpoint, hf, _ = llama_family_checkpoint(tmp_path)
    out = tmp_path / "run"
    done = recipe(
        "gpt_lm.py", *short_fine_tuning(checkpoint, tmp_path, out), "--learning-rate", "1e-2", "--lora-rank", "4"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trained = 32 * 4 + 4 * 32 + 32 * 4 + 4 * 16  # query (32 -> 32) and value (32 -> 16: two key/value heads)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["trainable_parameters"] == trained and metrics["vocabulary_size"] == 400
    assert 4.0 < metrics["validation_loss"] < 8.0  # random weights over 400 tokens: about log(400) = 6.0
    import keras_tfm

    exported = transformers.AutoModelForCausalLM.from_pretrained(out / "huggingface").eval()
    assert type(exported).__name__ == "Qwen2ForCausalLM"
    tuned = keras_tfm.from_huggingface(str(out / "peft_adapter"))  # the checkpoint with the run's pairs
    ids = np.arange(12).reshape(2, 6)
    with torch.no_grad():
        expected = exported(torch.tensor(ids)).logits.numpy()
        untuned = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(tuned(ids)), expected, atol=1e-4, rtol=0)
    assert np.abs(expected - untuned).max() > 1e-4  # the pairs moved
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "huggingface")
    assert tokenizer("To be")["input_ids"][0] == 0


@pytest.mark.backend_independent
def test_the_trained_model_carries_its_tokenizer(tmp_path):
    """train(..., tokenizer=...) returns a model that takes and returns text, and whose .keras file keeps
    the tokenizer."""
    import keras_tfm
    from keras_tfm.data import CharacterTokenizer
    from keras_tfm.training import train

    tokenizer = CharacterTokenizer.fit("abcdefghij ")
    ids = np.random.default_rng(0).integers(0, tokenizer.vocabulary_size, size=(16, 9)).astype("int32")
    result = train(
        TrainingConfig(output_dir=str(tmp_path / "run"), steps=2, batch_size=8, verbose=0),
        build_model=lambda: keras_tfm.DecoderLM(
            vocabulary_size=tokenizer.vocabulary_size,
            max_length=16,
            num_layers=1,
            num_heads=2,
            hidden_dim=8,
            intermediate_dim=16,
        ),
        train_batch=lambda epoch, step: (ids[:8, :-1], ids[:8, 1:]),
        steps_per_pass=2,
        validation_data=(ids[8:, :-1], ids[8:, 1:]),
        loss=keras_tfm.TokenCrossEntropy(),
        tokenizer=tokenizer,
    )
    assert result.model.tokenizer is tokenizer
    text = result.model.generate("abc", max_new_tokens=4)
    assert isinstance(text, str) and text.startswith("abc") and len(text) == 7
    result.model.save(tmp_path / "lm.keras")
    assert keras_tfm.load_model(str(tmp_path / "lm.keras")).generate("abc", max_new_tokens=4) == text
