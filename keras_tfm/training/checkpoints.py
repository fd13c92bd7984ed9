"""Checkpoints after every epoch and resume: weights, optimizer state and the schedule position.

`save_weights` writes the whole trackable state, the optimizer's moments and its `iterations`
counter included, so the learning-rate schedule resumes where it stopped. Each checkpoint is a new
file; `state.json` is replaced atomically after the file is complete, so a run killed at any moment
(`kill -9`) leaves the previous checkpoint intact and pointed to.
"""

from __future__ import annotations

import json
import math
import os

import keras


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class CheckpointManager:
    def __init__(self, directory: str):
        self.directory = directory
        self.state_path = os.path.join(directory, "state.json")
        os.makedirs(directory, exist_ok=True)

    def state(self) -> dict | None:
        if not os.path.exists(self.state_path):
            return None
        with open(self.state_path, encoding="utf-8") as file:
            return json.load(file)

    def save(self, model: keras.Model, epoch: int, extra: dict | None = None) -> str:
        name = f"epoch-{epoch:05d}.weights.h5"
        path = os.path.join(self.directory, name)
        model.save_weights(path, overwrite=True)
        previous = self.state()
        temporary = self.state_path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump({"epoch": epoch, "weights": name, **(extra or {})}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.state_path)
        if previous and previous["weights"] != name:
            old = os.path.join(self.directory, previous["weights"])
            if os.path.exists(old):
                os.remove(old)
        return path

    def restore(self, model: keras.Model) -> int:
        """Loads the last checkpoint into a built, compiled `model`; returns the epochs already done (0 if none)."""
        state = self.state()
        if state is None:
            return 0
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.load_weights(os.path.join(self.directory, state["weights"]))
        return int(state["epoch"])


class EpochCheckpoint(keras.callbacks.Callback):
    """Saves a checkpoint at the end of each epoch, unless the loss has gone bad."""

    def __init__(self, manager: CheckpointManager, extra: dict | None = None):
        super().__init__()
        self.manager = manager
        self.extra = extra or {}

    def on_epoch_end(self, epoch, logs=None):
        if getattr(self.model, "_keras_tfm_diverged", None) is None:
            self.manager.save(self.model, epoch + 1, self.extra)


class StopOnNaN(keras.callbacks.Callback):
    """Stops training at the first NaN/infinite loss and remembers where, for a clear message."""

    def __init__(self):
        super().__init__()
        self.bad_step = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.bad_step = int(batch)
            self.model._keras_tfm_diverged = self.bad_step
            self.model.stop_training = True
