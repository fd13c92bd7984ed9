"""Checkpoints and resume: Ctrl-C, kill -9, a full disk, damaged or other checkpoints, LoRA, NaN, other settings."""

from __future__ import annotations

import json
import os
import re
import signal

import keras
import numpy as np
import pytest

from keras_tfm.errors import CheckpointError
from keras_tfm.training import TrainingDiverged, train
from tests.recipes.helpers import BACKEND, SHAKESPEARE, TINY_GPT, _config, _stopped_after, recipe, steps_done


@pytest.mark.skipif(
    keras.backend.backend() == "tensorflow",
    reason="signals and resuming are the runtime's; TensorFlow's exact resume: the in-process resume tests",
)
def test_ctrl_c_then_kill_9_and_rerun_resumes_to_the_same_result(tmp_path):
    """Ctrl-C (SIGINT) stops after the step it came in, with one line (it was lost on JAX, and the run
    went on); the same command resumes, is killed with kill -9, and resumes again, each time from a step
    checkpoint within an epoch: the validation loss is the uninterrupted run's."""
    flags = ["--data", SHAKESPEARE, "--steps", "24", "--steps-per-epoch", "8", "--checkpoint-every", "4"]
    flags += ["--sample-every", "0", *TINY_GPT]
    straight = recipe("gpt_lm.py", *flags, "--output-dir", str(tmp_path / "straight"))
    assert straight.returncode == 0, straight.stdout + straight.stderr
    expected = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    assert expected["validation_loss"] < 3.6  # it learned: an untrained model scores about ln(65) = 4.17

    out = tmp_path / "stopped"
    state_path = out / "checkpoint" / "state.json"
    interrupted = _stopped_after(out, flags, 4, signal.SIGINT)
    output = interrupted.stdout.read()
    interrupted_at = steps_done(out)
    assert interrupted.returncode == 130 and 4 <= interrupted_at < 24, output[-3000:]
    where = f"epoch {interrupted_at // 8}" if interrupted_at % 8 == 0 else f"step {interrupted_at % 8} of epoch"
    assert re.search(
        rf"error: interrupted \(Ctrl-C\); the last checkpoint \({where}.*\) is kept in .*; run the "
        r"same command again to resume\.",
        output,
    ), output[-3000:]
    assert "Traceback" not in output and not (out / "metrics.json").exists()

    killed_at = interrupted_at
    if BACKEND != "jax":  # JAX's kill -9 and resume: test_processes.py, one of two processes killed
        killed = _stopped_after(out, flags, interrupted_at + 4, signal.SIGKILL)
        assert f"Resuming from {state_path}: {interrupted_at // 8} epochs" in killed.stdout.read()
        killed_at = steps_done(out)
        assert interrupted_at < killed_at < 24 and not (out / "metrics.json").exists()

    resumed = recipe("gpt_lm.py", *flags, "--output-dir", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"done, optimizer step {killed_at}." in resumed.stdout
    got = json.loads((out / "metrics.json").read_text())
    assert got["validation_loss"] == pytest.approx(expected["validation_loss"], rel=1e-5, abs=1e-6)
    straight_log = (tmp_path / "straight" / "log.csv").read_text().splitlines()
    resumed_log = (out / "log.csv").read_text().splitlines()
    assert len(resumed_log) == len(straight_log) == 4  # header + 3 epochs, none repeated or lost


@pytest.mark.backend_independent  # the room is measured before Keras' HDF5 writer runs, the same on every backend
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
        model = small_gpt(num_layers=1)
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
