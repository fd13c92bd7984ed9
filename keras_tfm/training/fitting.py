"""Fitting a run: the machine set up (devices, processes, seed, precision), the model built and compiled
in the distribution's scope, and `model.fit` with resume, checkpoints, NaN and Ctrl-C stops, and a lost
process reported; what every process of a run must agree on is checked before the first step."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import sys
import time

import keras
import numpy as np

from keras_tfm.compat import build_before_distributed_fit, optimizer_averages_kept_apart
from keras_tfm.data.shards import tokenizer_digest
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.models import lora
from keras_tfm.training import distribute
from keras_tfm.training.checkpoints import (
    CheckpointManager,
    Checkpoints,
    StopOnInterrupt,
    StopOnNaN,
    TrainingDiverged,
    position,
)
from keras_tfm.training.config import RESULT_FIELDS, TrainingConfig
from keras_tfm.training.distribute import (
    ProcessLost,
    check_same_settings,
    distribution_scope,
    gather_from_processes,
    initialize_processes,
    is_writer,
    local_rows,
    log,
    lost_message,
    lost_processes,
    processes,
    use_cpu_devices,
)
from keras_tfm.training.progress import Progress
from keras_tfm.training.recording import truncate_log, zoo_model


def precision(config: TrainingConfig) -> str:
    """The run's dtype policy: `config.precision`, with "auto" resolved for this machine's devices."""
    if config.precision != "auto":
        return config.precision
    return "mixed_bfloat16" if bfloat16_accelerator() else "float32"


@functools.cache
def bfloat16_accelerator() -> bool:
    """Whether the backend computes on an accelerator with native bfloat16 arithmetic."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform == "tpu":
            return True
        return device.platform == "gpu" and float(getattr(device, "compute_capability", 0) or 0) >= 8.0
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_logical_devices("TPU"):
            return True
        gpus = tf.config.list_physical_devices("GPU")
        return bool(gpus) and tf.config.experimental.get_device_details(gpus[0]).get("compute_capability", (0, 0)) >= (
            8,
            0,
        )
    if backend == "torch":
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return False


def setup(config: TrainingConfig) -> None:
    """Virtual CPU devices, the run's processes, seed and dtype policy; call before building anything."""
    if config.tensorboard and not all(importlib.util.find_spec(name) for name in ("tensorboard", "tensorflow")):
        raise InputError(  # Keras' callback writes through TensorFlow's summaries, which need the package
            "TensorBoard logs are written with the tensorboard and tensorflow packages, and this install lacks "
            "one: pip install 'keras_tfm[tensorboard]'.",
            "tensorboard",
        )
    if config.cpu_devices:
        if keras.backend.backend() == "torch":
            raise InputError("virtual CPU devices need the jax or tensorflow backend, not torch.", "cpu_devices")
        use_cpu_devices(config.cpu_devices)
    places = initialize_processes(
        config.coordinator_address, config.num_processes, config.process_id, timeout=config.process_timeout
    )
    if places.count > 1:
        if config.distribute == "none":
            raise InputError(
                f"the {places.count} processes train one model together with `distribute` data or model; got none.",
                "distribute",
            )
        if config.batch_size % places.count:
            raise InputError(
                f"the global batch is split evenly among the {places.count} processes; got {config.batch_size}.",
                "batch_size",
            )
    if not is_writer():  # process 0 writes the run's files
        keras.utils.set_random_seed(config.seed)
        keras.config.set_dtype_policy(precision(config))
        return
    try:  # before anything is trained: a run that cannot write its checkpoints would lose them
        os.makedirs(config.output_dir, exist_ok=True)
        probe = os.path.join(config.output_dir, ".keras_tfm_write_test")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
    except OSError as error:
        raise InputError(
            f"cannot write to {config.output_dir!r} ({error.strerror or error}); give a directory this user can write.",
            "output_dir",
        ) from None
    keras.utils.set_random_seed(config.seed)
    keras.config.set_dtype_policy(precision(config))
    log(
        f"Output in {config.output_dir} (checkpoints, log.csv, metrics.json; the same command resumes there). "
        f"Backend: {keras.backend.backend()}, precision {precision(config)}."
    )


def use_jit(config: TrainingConfig) -> bool:
    # On PyTorch, Keras' jit_compile means torch.compile, which recompiles at every layer boundary of
    # these models (minutes) and then runs slower than eager; so "auto" is eager there.
    if config.jit_compile == "auto":
        if keras.backend.backend() == "tensorflow" and config.distribute != "none":
            import tensorflow as tf

            # XLA cannot place MirroredStrategy's per-device variables on virtual CPU devices
            # ("Trying to access resource ... located in device CPU:1 from device CPU:0"); GPUs are fine.
            return bool(tf.config.list_logical_devices("GPU"))
        return keras.backend.backend() != "torch"
    return config.jit_compile == "on"


def plan_steps(config: TrainingConfig, steps_per_pass: int) -> tuple[int, int]:
    """(epochs, steps_per_epoch) from `epochs`, `steps_per_epoch` and `steps`; an epoch is one pass
    (`steps_per_pass` batches, at least one) unless `steps_per_epoch` says otherwise."""
    steps_per_epoch = config.steps_per_epoch or max(1, steps_per_pass)
    epochs = config.epochs
    if config.steps:
        steps_per_epoch = min(steps_per_epoch, config.steps)
        epochs = math.ceil(config.steps / steps_per_epoch)
        steps_per_epoch = math.ceil(config.steps / epochs)
    return epochs, steps_per_epoch


def make_optimizer(config: TrainingConfig, total_steps: int) -> keras.optimizers.Optimizer:
    """AdamW, linear warmup to `learning_rate`, then cosine decay to a tenth of it; no weight decay
    on biases, LayerNorm and embeddings' positions; with `ema`, a moving average of the weights."""
    warmup = config.warmup_steps if config.warmup_steps is not None else max(1, total_steps // 20)
    warmup = min(warmup, max(total_steps - 1, 0))
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=max(1, total_steps - warmup),
        alpha=0.1,
        warmup_target=config.learning_rate,
        warmup_steps=warmup,
    )
    optimizer = keras.optimizers.AdamW(
        schedule,
        weight_decay=config.weight_decay,
        beta_2=0.99,
        global_clipnorm=config.clip_norm or None,
        use_ema=config.ema is not None,
        ema_momentum=config.ema if config.ema is not None else 0.99,
    )
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


def _made_here(metrics: list | None) -> list:
    """Metric objects made again from their configs, under the distribution set up by the caller:
    JAX places the variables of a metric made before (as recipes make them) on one device only, and
    the compiled training step then refuses the mix of devices."""
    return [
        type(metric).from_config(metric.get_config()) if isinstance(metric, keras.metrics.Metric) else metric
        for metric in metrics or []
    ]


def recorded_settings(config: TrainingConfig, settings: dict | None) -> dict:
    """What each checkpoint records of the run's settings: the caller's and the config's `RESULT_FIELDS`
    (JSON values), the precision resolved (a GPU's run is not resumed on a CPU)."""
    resolved = dataclasses.replace(config, precision=precision(config))
    return json.loads(json.dumps({**(settings or {}), **{name: getattr(resolved, name) for name in RESULT_FIELDS}}))


def check_agreement(config: TrainingConfig, recorded: dict, validation_data: tuple, tokenizer) -> None:
    """Refuses processes of one run started with different settings, data or tokenizer."""
    if processes().count > 1:
        data = {"validation_data": _digest(validation_data), "tokenizer": tokenizer and tokenizer_digest(tokenizer)}
        check_same_settings(
            {**recorded, "distribute": config.distribute, "model_parallel": config.model_parallel, **data}
        )


def build(
    config: TrainingConfig, build_model, train_batch, total_steps: int, loss, metrics, weighted_metrics
) -> tuple[keras.Model, int | None]:
    """The model built (on the first batch) and compiled in the distribution's scope, with LoRA enabled
    where asked; returns it and its LoRA rank (`config.lora_rank`, or that of a peft adapter it was
    loaded with)."""
    with distribution_scope(config.distribute, config.model_parallel, log=log):
        model = build_model()
        adapted = lora.lora_layers(model)  # a peft adapter's, from a `from_huggingface` adapter
        if config.lora_rank and adapted:
            raise InputError(
                f"the checkpoint is a LoRA adapter of rank {next(iter(adapted.values())).lora_rank}, which "
                "goes on training; leave `lora_rank` out.",
                "lora_rank",
            )
        if config.lora_rank:
            zoo_model(model).enable_lora(config.lora_rank, lora_alpha=config.lora_alpha)
        if config.remat:
            model.remat = True
        model.compile(
            optimizer=make_optimizer(config, total_steps),
            loss=loss,
            metrics=_made_here(metrics),
            weighted_metrics=_made_here(weighted_metrics),
            jit_compile=use_jit(config),
        )
        first = train_batch(0, 0)
        model(first[0])
        if keras.backend.backend() == "tensorflow" and config.distribute != "none":
            build_before_distributed_fit(model, first, multi_worker=processes().engine == "tf_config")
    return model, config.lora_rank or (next(iter(adapted.values())).lora_rank if adapted else None)


def fit(
    config: TrainingConfig, model, train_batch, epochs, steps_per_epoch, validation_data, callbacks, settings
) -> float:
    """Resumes from the last checkpoint in `output_dir` (at an epoch's end or within one), fits the steps
    left and returns the seconds it took; raises `TrainingDiverged` if the loss went NaN."""
    csv_path = os.path.join(config.output_dir, "log.csv")
    manager = CheckpointManager(os.path.join(config.output_dir, "checkpoint"), writer=is_writer())
    distribute.checkpoint_note = lambda: _last_checkpoint(manager)
    initial_epoch, initial_step = _resume(model, manager, settings, steps_per_epoch, csv_path)
    verbose = config.verbose if config.verbose is not None else (1 if sys.stdout.isatty() else 2)
    nan_stop = StopOnNaN()
    saving = Checkpoints(
        manager,
        steps_per_epoch,
        {"epochs": epochs, "steps_per_epoch": steps_per_epoch, "settings": settings},
        nan_stop,
        every=config.checkpoint_every,
        minutes=config.checkpoint_minutes or math.inf,
    )
    done = initial_epoch * steps_per_epoch + initial_step
    run_callbacks = [  # the log's row before the checkpoint: a run killed between them redoes (and drops) the row
        StopOnInterrupt(manager),
        nan_stop,
        *([keras.callbacks.CSVLogger(csv_path, append=done > 0)] if is_writer() else []),
        saving,
        Progress(epochs * steps_per_epoch, done, verbose if is_writer() else 0),
        *(callbacks or []),
    ]
    if config.ema is not None:
        # Validation reads the averaged weights; checkpoints (written after it) hold the raw weights
        # and, in the optimizer's state, the averages, so a resumed run continues both.
        run_callbacks.append(keras.callbacks.SwapEMAWeights())
    if config.tensorboard and is_writer():
        run_callbacks.append(keras.callbacks.TensorBoard(os.path.join(config.output_dir, "tensorboard")))
    start = time.perf_counter()
    if initial_epoch >= epochs:
        log("Training already finished in this output directory; evaluating.")
        model.optimizer.finalize_variable_values(model.trainable_variables)  # what `fit` does at its end
    # A resumed epoch's steps left are a `fit` of their own: Keras' epochs all have one length.
    parts = [(initial_epoch, initial_epoch + 1, initial_step)] if initial_step else []
    parts += [(initial_epoch + bool(initial_step), epochs, 0)] if initial_epoch + bool(initial_step) < epochs else []
    for index, (first, last, step) in enumerate(parts):
        saving.start(first, step)
        final = index == len(parts) - 1
        with contextlib.nullcontext() if final else optimizer_averages_kept_apart(model.optimizer):
            _fit_or_report_lost(
                model,
                config,
                manager,
                _batches(train_batch, first, last, step, steps_per_epoch),
                steps_per_epoch=steps_per_epoch - step,
                epochs=last,
                initial_epoch=first,
                validation_data=validation_data,
                validation_batch_size=None if batched(validation_data) else feed_batch(config),
                shuffle=False,
                callbacks=run_callbacks,
                verbose=verbose if is_writer() else 0,
            )
        if model.stop_training:
            break
    if nan_stop.bad_step is not None:
        state = manager.state()
        raise TrainingDiverged(
            f"the training loss became NaN at step {nan_stop.bad_step} of an epoch; training stopped. "
            + (
                f"The last good checkpoint ({position(state['epoch'], state['step'])}) is kept in {manager.directory}. "
                if state
                else ""
            )
            + "Try a lower `learning_rate`, a smaller `clip_norm` or `precision` float32."
        )
    return time.perf_counter() - start


def _resume(model, manager: CheckpointManager, settings: dict, steps_per_epoch: int, csv_path: str) -> tuple:
    """(epochs done, steps of the next done) by the last checkpoint, loaded into `model`; every process
    must see the same one."""
    initial_epoch = manager.restore(model, settings)
    state = manager.state()
    initial_step = state["step"] if state else 0
    seen = gather_from_processes(initial_epoch * steps_per_epoch + initial_step)
    if len(set(seen)) > 1:
        raise CheckpointError(
            f"the processes see different checkpoints in {manager.directory!r} (steps done: "
            + ", ".join(f"process {index}: {steps}" for index, steps in enumerate(seen))
            + "); `output_dir` must be a directory that every process shares."
        )
    if initial_epoch or initial_step:
        iterations = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        steps = f" and {initial_step} steps" if initial_step else ""
        log(f"Resuming from {manager.state_path}: {initial_epoch} epochs{steps} done, optimizer step {iterations}.")
        truncate_log(csv_path, initial_epoch)
    return initial_epoch, initial_step


def _batches(train_batch, first: int, last: int, step: int, steps_per_epoch: int):
    """The batches of epochs `first` to `last` (excluded), from step `step` of the first; a dataset of
    them on TensorFlow's multi-worker strategy."""

    def stream():
        for epoch in range(first, last):
            for index in range(step if epoch == first else 0, steps_per_epoch):
                yield train_batch(epoch, index)

    return stream() if processes().engine != "tf_config" else _worker_dataset(stream)


def _fit_or_report_lost(model, config: TrainingConfig, manager: CheckpointManager, data, **arguments) -> None:
    """`model.fit(data, **arguments)`; in a run of several processes, a failure caused by a process that
    stopped becomes a `ProcessLost` that names it and the checkpoint to resume from."""
    try:
        model.fit(data, **arguments)
    except Exception as error:
        if processes().count == 1:
            raise
        lost = lost_processes(config.process_timeout + 5, error)
        if lost is None:
            raise
        lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
        reason = next(
            (line for line in lines if re.search(r"abort|closed|reset|unavailable|failed", line, re.I)), lines[0]
        )
        raise ProcessLost(lost_message(lost, reason[:200])) from None


def _last_checkpoint(manager: CheckpointManager) -> str:
    try:
        state = manager.state()
    except CheckpointError:
        state = None
    if state:
        return f"The last good checkpoint ({position(state['epoch'], state['step'])}) is in {manager.directory}. "
    return "There is no checkpoint yet. "


def _digest(value) -> str:
    """A short digest of (nested) arrays, or a dataset's own (`ProcessedImages.digest`)."""
    if isinstance(value, keras.utils.PyDataset):
        return value.digest() if hasattr(value, "digest") else type(value).__name__
    digest = hashlib.sha256()
    for part in keras.tree.flatten(value):
        array = np.ascontiguousarray(part)
        digest.update(array.tobytes() + str((array.dtype, array.shape)).encode())
    return digest.hexdigest()[:16]


def local_batches(train_batch, batch_size: int):
    """`train_batch` giving this process's rows of each global batch: the function reads only those
    where it takes `rows` (a slice of the batch), else its batch is cut."""
    if processes().count == 1:
        return train_batch
    rows = local_rows(batch_size)
    if "rows" in inspect.signature(train_batch).parameters:
        return lambda epoch, step: train_batch(epoch, step, rows=rows)
    return lambda epoch, step: tuple(part[rows] for part in train_batch(epoch, step))


def feed_batch(config: TrainingConfig) -> int:
    """Rows of each evaluation batch this process feeds: its share on JAX; on TensorFlow's multi-worker
    strategy the whole batch, which Keras itself shards among the workers."""
    return config.batch_size // processes().count if processes().engine == "jax" else config.batch_size


def local_validation(validation_data: tuple) -> tuple:
    """This process's equal share of the validation rows on JAX (TensorFlow's multi-worker strategy
    shards them itself). When they do not divide evenly every process evaluates all of them: the mean
    is the same, and no process waits on a batch another lacks."""
    count = processes().count
    if isinstance(validation_data, keras.utils.PyDataset):  # batches every process draws alike
        if processes().engine == "tf_config":
            raise InputError("TensorFlow's workers evaluate arrays; received a keras.utils.PyDataset.",
                             "validation_data")  # fmt: skip
        return validation_data
    rows = len(validation_data[0])
    if count == 1 or rows % count or processes().engine != "jax":
        return validation_data
    share = slice(processes().index * rows // count, (processes().index + 1) * rows // count)
    return tuple(None if part is None else part[share] for part in validation_data)


def batched(data) -> bool:
    """Whether `data` comes in batches of its own (a `keras.utils.PyDataset`) rather than as arrays."""
    return isinstance(data, keras.utils.PyDataset)


def _worker_dataset(stream):
    """The batches of `stream` (this worker's rows) as MultiWorkerMirroredStrategy takes them: a dataset
    made on each worker, each of its elements split among the worker's devices."""
    import tensorflow as tf

    strategy = distribute.worker_strategy()
    first = next(iter(stream()))
    signature = tuple(tf.TensorSpec((None, *np.shape(part)[1:]), tf.as_dtype(np.asarray(part).dtype)) for part in first)

    def dataset(context: tf.distribute.InputContext):
        batches = tf.data.Dataset.from_generator(stream, output_signature=signature)
        per_replica = context.get_per_replica_batch_size(len(first[0]) * context.num_input_pipelines)
        return batches.rebatch(per_replica) if per_replica != len(first[0]) else batches

    return strategy.distribute_datasets_from_function(dataset)
