"""Fitting: the step plan, EMA, distribution over devices, LoRA inside a wrapper."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_tfm.errors import InputError
from keras_tfm.training import TrainingConfig, plan_steps, train
from tests.recipes.helpers import BACKEND, _config, _Interrupted, recipe


def test_ema_validates_on_the_averaged_weights_and_resumes_both_within_an_epoch(tmp_path, capsys):
    """--ema: validation, the final evaluation and the returned model use the moving average; the
    raw weights go on training; a run stopped within an epoch resumes both from its last step
    checkpoint, to the uninterrupted run's result, and a finished one re-evaluates the average."""
    from keras_tfm.training import CheckpointManager, make_optimizer

    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])

    def batch(epoch, step):
        x = np.random.default_rng(100 * epoch + step).normal(size=(16, 3)).astype("float32")
        return x, np.tanh(x @ np.array([[1.0], [-2.0], [0.5]], "float32"))

    validation = batch(99, 0)

    class InterruptInThirdEpoch(keras.callbacks.Callback):  # at its last step, before that is saved
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == 2 and batch == 2:
                raise _Interrupted

    def run(directory, callbacks=()):
        config = _config(
            directory, epochs=4, steps_per_epoch=3, batch_size=16, learning_rate=0.05, ema=0.5, checkpoint_every=2
        )
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
        run(tmp_path / "resumed", [InterruptInThirdEpoch()])
    state = json.loads((tmp_path / "resumed" / "checkpoint" / "state.json").read_text())
    assert (state["epoch"], state["step"]) == (2, 2)  # the checkpoint of step 8, within the third epoch
    capsys.readouterr()
    resumed = run(tmp_path / "resumed")
    assert "2 epochs and 2 steps done, optimizer step 8." in capsys.readouterr().out
    assert resumed.metrics["validation_loss"] == pytest.approx(ema_loss, rel=1e-5)
    assert len(resumed.history["loss"]) == 4  # one row per epoch: the resumed epoch's too

    finished = run(tmp_path / "straight")  # nothing left to train: evaluates the average again
    assert finished.metrics["validation_loss"] == pytest.approx(ema_loss, rel=1e-5)

    with pytest.raises(InputError, match=r"^ema: expected a momentum in \[0, 1\), such as 0.999; got 1.5"):
        _config(tmp_path, ema=1.5)


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


@pytest.mark.backend_independent
def test_a_sample_from_the_default_newline_prompt_starts_with_its_text(capsys):
    from keras_tfm.training.samples import PrintSamples

    PrintSamples(lambda model: "\n\nTo be, or not", every=1).on_epoch_end(0)
    assert capsys.readouterr().out == "--- sample after epoch 1 ---\nTo be, or not\n---\n"
