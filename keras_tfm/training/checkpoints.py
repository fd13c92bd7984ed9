"""Checkpoints after every epoch and within epochs, and resume: weights, optimizer state and the schedule
position.

`save_weights` writes the whole trackable state, the optimizer's moments and its `iterations`
counter included, so the learning-rate schedule resumes where it stopped. Each checkpoint is a new
file; `state.json` is replaced atomically after the file is complete, so a run killed at any moment
(`kill -9`) leaves the previous checkpoint intact and pointed to. `state.json` also records the
model's weight shapes: resuming another model (other settings, the same directory) is refused, as is a
damaged checkpoint, with a `CheckpointError` that says what to do. A checkpoint within an epoch records
the steps of it done (`step`); the runtime resumes there, feeding the batches that follow.

A LoRA model's checkpoint is two files: its weights with the frozen kernels (not the merged ones
Keras would write, nor the zeroed pairs it would load) and its LoRA pairs (`keras_tfm.models.lora`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import signal
import threading
import time

import keras

from keras_tfm.errors import CheckpointError
from keras_tfm.models import lora
from keras_tfm.training.distribute import alone


def _write_then_rename(path: str, write) -> None:
    """`write(temporary)` a file beside `path`, then rename it to `path`: `path` is never half-written.
    The temporary name keeps `path`'s suffix (Keras reads the format from it)."""
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".writing-{name}")
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def _itemsize(dtype) -> int:
    """Bytes per value of a Keras dtype name ("float32", "bfloat16", "int8", ...)."""
    bits = re.search(r"\d+", str(dtype))
    return max(1, int(bits.group()) // 8) if bits else 4


def _write_json(path: str, content: dict) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(content, file)
        file.flush()
        os.fsync(file.fileno())


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped by Ctrl-C (SIGINT) between two steps; the last checkpoint is kept."""


class CheckpointManager:
    """The checkpoints in `directory`. In a run of several processes every process restores, from the
    directory they share, and only the `writer` (process 0) saves: the weights are the same on all."""

    def __init__(self, directory: str, writer: bool = True):
        self.directory = directory
        self.writer = writer
        self.state_path = os.path.join(directory, "state.json")
        if writer:
            os.makedirs(directory, exist_ok=True)

    def state(self) -> dict | None:
        if not os.path.exists(self.state_path):
            return None
        try:
            with open(self.state_path, encoding="utf-8") as file:
                state = json.load(file)
            return {
                **state,
                "weights": str(state["weights"]),
                "epoch": int(state["epoch"]),
                "step": int(state.get("step", 0)),
            }
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise self._cannot_resume(self.state_path, error) from None

    def _cannot_resume(self, path: str, error: Exception) -> CheckpointError:
        reason = (str(error).strip().splitlines() or [""])[0][:300]
        return CheckpointError(
            f"cannot resume from {path!r}, damaged or written by another model "
            f"({type(error).__name__}: {reason}); delete {self.directory!r} to start over, or "
            f"choose another `output_dir`."
        )

    def save(self, model: keras.Model, epoch: int, extra: dict | None = None, step: int = 0) -> str:
        """Writes the checkpoint of `epoch` epochs and `step` steps of the next done: each file under a
        temporary name, renamed when complete, then `state.json`. A disk without room for it, or a file
        that cannot be written, stops the run with a `CheckpointError` that names the directory and the
        last good checkpoint, which is kept."""
        stem = f"epoch-{epoch:05d}" + (f"-step-{step:06d}" if step else "")
        name = f"{stem}.weights.h5"
        path = os.path.join(self.directory, name)
        if not self.writer:
            return path
        files = {"weights": name}
        if lora.lora_layers(model):
            files["lora"] = f"{stem}.lora.npz"
        previous = self.state()
        try:
            self._check_room(model, position(epoch, step), previous)
            with lora.unmerged(model), alone():
                _write_then_rename(path, lambda temporary: model.save_weights(temporary, overwrite=True))
            if "lora" in files:
                with alone():
                    _write_then_rename(
                        os.path.join(self.directory, files["lora"]),
                        lambda temporary: lora.save_lora_weights(model, temporary),
                    )
            state = {"epoch": epoch, "step": step, **files, **_architecture(model), **(extra or {})}
            _write_then_rename(self.state_path, lambda temporary: _write_json(temporary, state))
        except OSError as error:
            raise self._cannot_write(position(epoch, step), previous, error.strerror or str(error)) from None
        for key in ("weights", "lora"):
            if previous and previous.get(key) and previous[key] != files.get(key):
                old = os.path.join(self.directory, previous[key])
                if os.path.exists(old):
                    os.remove(old)
        return path

    def _check_room(self, model: keras.Model, where: str, previous: dict | None) -> None:
        """Refuses to start a checkpoint the disk has no room for: HDF5 does not survive running out of
        space in the middle of a file (the interpreter crashes), so the room is measured first."""
        variables = list(model.weights) + list(getattr(model.optimizer, "variables", []) or [])
        # the values, and about a kilobyte of HDF5 structure per variable (measured: 1.1 KB)
        needed = sum(math.prod(v.shape) * _itemsize(v.dtype) + 2048 for v in variables) * 1.1
        free = shutil.disk_usage(self.directory).free
        if free < needed:
            raise self._cannot_write(
                where, previous, f"it needs about {needed / 1e6:,.1f} MB and the disk has {free / 1e6:,.1f} MB free"
            )

    def _cannot_write(self, where: str, previous: dict | None, reason: str) -> CheckpointError:
        kept = (
            f"the last good checkpoint ({position(previous['epoch'], previous['step'])}) is kept there"
            if previous
            else "there is no earlier checkpoint"
        )
        return CheckpointError(
            f"cannot write the checkpoint of {where} in {self.directory!r} ({reason}); {kept}. Make room "
            "(or make the directory writable) and run the same command again to resume."
        )

    def restore(self, model: keras.Model, settings: dict | None = None) -> int:
        """Loads the last checkpoint into a built, compiled `model`; returns the epochs already done (0 if
        none); `state()["step"]` tells the steps of the next one done.
        `settings`: what the run computes with (JSON values); a checkpoint written with others is refused."""
        state = self.state()
        if state is None:
            return 0
        if settings is not None and state.get("settings") is not None and state["settings"] != settings:
            then, now = state["settings"], settings
            changed = [
                f"`{name}` {then.get(name, '(unset)')!r} then, {now.get(name, '(unset)')!r} now"
                for name in sorted(set(then) | set(now))
                if then.get(name) != now.get(name)
            ]
            raise CheckpointError(
                f"the checkpoint in {self.directory!r} was written by a run with other settings: "
                f"{'; '.join(changed)}. Give the same settings to resume it; to start a new run, delete "
                f"{self.directory!r} or choose another `output_dir`."
            )
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        saved, current = state.get("weight_shapes"), _architecture(model)
        if saved is not None and saved != current["weight_shapes"]:  # Keras would load what matches, silently
            raise CheckpointError(
                f"the checkpoint in {self.directory!r} holds another model ({state.get('parameters', 0):,} "
                f"parameters) than this one ({current['parameters']:,}): were other model settings given? Delete "
                f"it to start over, or choose another `output_dir`."
            )
        path = os.path.join(self.directory, state["weights"])
        try:
            model.load_weights(path)
            if lora.lora_layers(model):
                path = os.path.join(self.directory, state.get("lora") or "(no LoRA file recorded)")
                lora.load_lora_weights(model, path)
        except (OSError, ValueError, KeyError) as error:
            raise self._cannot_resume(path, error) from None
        return state["epoch"]


def _architecture(model: keras.Model) -> dict:
    """The model's parameter count and a digest of its weights' shapes, in order."""
    shapes = [[int(d) for d in weight.shape] for weight in model.weights]
    return {
        "parameters": sum(math.prod(shape) for shape in shapes),
        "weight_shapes": hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16],
    }


def position(epoch: int, step: int) -> str:
    """Where a checkpoint stands, in words: "epoch 2", or "step 40 of epoch 3"."""
    return f"step {step} of epoch {epoch + 1}" if step else f"epoch {epoch}"


class Checkpoints(keras.callbacks.Callback):
    """Saves a checkpoint at the end of each epoch and, within epochs, every `every` steps (counted from
    the run's start) or, without `every`, when `minutes` have passed since the last; none once the loss
    has gone bad (`nan_stop`'s step). `start(epoch, step)` tells where the next `fit` begins."""

    def __init__(
        self,
        manager: CheckpointManager,
        steps_per_epoch: int,
        extra: dict | None = None,
        nan_stop: StopOnNaN | None = None,
        **when,
    ):
        super().__init__()
        self.manager, self.steps_per_epoch, self.extra = manager, steps_per_epoch, extra or {}
        self.nan_stop = nan_stop
        self.every, self.seconds = when.get("every"), 60 * when.get("minutes", 10.0)
        self.epoch = self.offset = 0
        self.last = time.monotonic()

    def start(self, epoch: int, step: int) -> None:
        self.epoch, self.offset = epoch, step

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = self.offset + batch + 1
        if step >= self.steps_per_epoch or self._diverged():
            return  # the epoch's end saves
        done = self.epoch * self.steps_per_epoch + step
        due = done % self.every == 0 if self.every else time.monotonic() - self.last >= self.seconds
        if due:
            self.manager.save(self.model, self.epoch, self.extra, step=step)
            self.last = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        self.offset = 0
        if not self._diverged():
            self.manager.save(self.model, epoch + 1, self.extra)
            self.last = time.monotonic()

    def _diverged(self) -> bool:
        return self.nan_stop is not None and self.nan_stop.bad_step is not None


class StopOnNaN(keras.callbacks.Callback):
    """Stops training at the first NaN/infinite loss and remembers where, for a clear message."""

    def __init__(self):
        super().__init__()
        self.bad_step = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.bad_step = int(batch)
            self.model.stop_training = True


class StopOnInterrupt(keras.callbacks.Callback):
    """Turns Ctrl-C during `fit` into a stop after the current step, with a message that says where the
    last checkpoint is. The signal only sets a flag, which the next step end reads: an interrupt that
    arrives while a backend runs compiled code is not lost, and nothing is half-written. A second
    Ctrl-C interrupts at once."""

    def __init__(self, manager: CheckpointManager):
        super().__init__()
        self.manager = manager
        self.requested = False
        self._previous = None

    def _request(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)

    def on_train_begin(self, logs=None):
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = signal.signal(signal.SIGINT, self._request)

    def on_train_end(self, logs=None):
        self._restore()

    def _restore(self):
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def on_train_batch_end(self, batch, logs=None):
        if self.requested:
            self._restore()
            state = self.manager.state()
            raise TrainingInterrupted(
                "interrupted (Ctrl-C); "
                + (
                    f"the last checkpoint ({position(state['epoch'], state['step'])}) is kept in "
                    f"{self.manager.directory}; "
                    if state
                    else "there is no checkpoint yet; "
                )
                + "run the same command again to resume."
            )

    on_test_batch_end = on_train_batch_end
