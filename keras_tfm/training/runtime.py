"""The training runtime every recipe shares: one `train` call from settings to metrics.json.

    recipe: parse flags -> data -> `train(TrainingConfig(...), build_model=..., train_batch=..., ...)`
    runtime: seed, precision, distribution -> build + compile (AdamW, warmup + cosine, XLA)
             -> resume from the last checkpoint -> `model.fit` with progress, CSV log, checkpoints,
             NaN stop -> evaluate -> metrics.json + learning_curves.png in `output_dir`

Training data comes as `train_batch(epoch, step) -> (x, y)`, a pure function of its arguments, so a
resumed run sees exactly the batches the interrupted one would have seen.
"""

from __future__ import annotations

import csv
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
from collections.abc import Callable

import keras
import numpy as np

from keras_tfm.compat import build_before_distributed_fit, sublayers
from keras_tfm.data.shards import tokenizer_digest
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.layers import lora
from keras_tfm.models.model import Model as ZooModel
from keras_tfm.training import distribute
from keras_tfm.training.checkpoints import (
    CheckpointManager,
    EpochCheckpoint,
    StopOnInterrupt,
    StopOnNaN,
    TrainingDiverged,
)
from keras_tfm.training.config import RESULT_FIELDS, HuggingFaceCheckpoint, TrainingConfig
from keras_tfm.training.distribute import (
    ProcessLost,
    alone,
    check_same_settings,
    distribution_scope,
    gather_from_processes,
    initialize_processes,
    is_writer,
    local_rows,
    lost_message,
    lost_processes,
    processes,
    use_cpu_devices,
)


@dataclasses.dataclass
class TrainResult:
    model: keras.Model
    metrics: dict
    history: dict


def log(message: str) -> None:
    """Prints `message` from process 0 (the only one, unless the run has several)."""
    if is_writer():
        print(message, flush=True)


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
    log(f"Backend: {keras.backend.backend()}, precision {precision(config)}, output in {config.output_dir}")


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


def train(
    config: TrainingConfig,
    *,
    build_model: Callable[[], keras.Model],
    train_batch: Callable[[int, int], tuple],  # (x, y) or (x, y, sample_weight)
    steps_per_pass: int,
    validation_data: tuple,
    loss,
    metrics: list | None = None,
    weighted_metrics: list | None = None,
    callbacks: list | None = None,
    evaluate: Callable[[keras.Model], dict] | None = None,
    pretrained: bool = False,
    huggingface: HuggingFaceCheckpoint | None = None,
    tokenizer=None,
    labels: list | None = None,
    image_preprocessing: tuple | None = None,
    settings: dict | None = None,
) -> TrainResult:
    """Builds, trains (resuming if `config.output_dir` holds a checkpoint), evaluates and records a model.

    Args:
        config: the run's settings.
        build_model: makes the model (called inside the distribution's scope).
        train_batch: `(epoch, step) -> (x, y)` or `(x, y, sample_weight)`, a pure function of its arguments.
        steps_per_pass: batches in one pass over the training data (an epoch, unless the config sets one).
        validation_data: `(x, y)` or `(x, y, sample_weight)`, evaluated after every epoch and at the end.
        loss, metrics, weighted_metrics: as `keras.Model.compile` takes them.
        callbacks: more Keras callbacks for `fit`.
        evaluate: `model -> dict` of further results for `metrics.json`, called at the end.
        pretrained: `build_model` returns trained weights (a checkpoint, an earlier stage), which
            `config.lora_rank` may fine-tune.
        huggingface: the Hugging Face checkpoint `build_model` loads, if any (implies `pretrained`).
        tokenizer, labels, image_preprocessing: what the Hugging Face checkpoint written after training
            needs besides the weights (see below).
        settings: the caller's settings that change what the run computes (its data, tokenizer, model
            size, ...; JSON values). Each checkpoint records them with the config's (`RESULT_FIELDS`),
            and resuming with any of them changed is refused with the differences listed.

    The trained model is also written for transformers users (`output_dir/huggingface`) where they can
    use it: fine-tuned from `huggingface` (with that checkpoint's tokenizer files), read by a `tokenizer`
    that writes itself for transformers (characters, byte-pair, WordPiece), or a ViT given its
    `image_preprocessing` (`save_huggingface`'s), with a classifier's class names `labels`. A LoRA run on
    a Hugging Face checkpoint also writes its peft adapter. The returned model carries `tokenizer`
    (`model.tokenizer`), so that its `generate` takes text and its `.keras` file keeps the tokenizer.
    """
    pretrained = pretrained or huggingface is not None
    if config.lora_rank and not pretrained:
        raise InputError(
            "LoRA fine-tunes pretrained weights, and this run trains a model from scratch; use it with "
            "a `from_huggingface` checkpoint (gpt_lm.py, vit.py, bert_mlm.py) or bert_mlm.py's `finetune` stage.",
            "lora_rank",
        )
    epochs, steps_per_epoch = plan_steps(config, steps_per_pass)
    resolved = dataclasses.replace(config, precision=precision(config))  # a GPU's run is not resumed on a CPU
    recorded = json.loads(json.dumps({**(settings or {}), **{name: getattr(resolved, name) for name in RESULT_FIELDS}}))
    if processes().count > 1:
        data = {"validation_data": _digest(validation_data), "tokenizer": tokenizer and tokenizer_digest(tokenizer)}
        check_same_settings(
            {**recorded, "distribute": config.distribute, "model_parallel": config.model_parallel, **data}
        )
    train_batch = _local(train_batch, config.batch_size)
    validation_data = _local_validation(validation_data)
    model, lora_rank = _build(
        config, build_model, train_batch, epochs * steps_per_epoch, loss, metrics, weighted_metrics
    )
    trainable = sum(math.prod(variable.shape) for variable in model.trainable_variables)
    log(
        f"Model: {model.name}, {model.count_params():,} parameters"
        f"{f' ({trainable:,} trained: LoRA rank {lora_rank})' if lora_rank else ''}; {epochs} epochs x "
        f"{steps_per_epoch} steps of batch {config.batch_size}; XLA {'on' if use_jit(config) else 'off'}"
        f"{'; blocks rematerialized' if config.remat else ''}."
    )
    csv_path = os.path.join(config.output_dir, "log.csv")
    seconds = _fit(config, model, train_batch, epochs, steps_per_epoch, validation_data, csv_path, callbacks, recorded)

    results = model.evaluate(
        validation_data[0],
        validation_data[1],
        batch_size=_feed_batch(config),
        return_dict=True,
        verbose=0,
        sample_weight=validation_data[2] if len(validation_data) > 2 else None,
    )
    results = {f"validation_{name}": float(value) for name, value in results.items()}
    if evaluate is not None:
        results.update(evaluate(model))
    record = {
        "backend": keras.backend.backend(),
        "model": config.model_name or model.name,
        "parameters": model.count_params(),
        "trainable_parameters": trainable,
        "lora_rank": lora_rank,
        "epochs": epochs,
        "steps": epochs * steps_per_epoch,
        "batch_size": config.batch_size,
        "precision": precision(config),
        "remat": config.remat,
        "train_seconds_this_run": round(seconds, 1),
        **results,
    }
    zoo_model = next((layer for layer in (model, *sublayers(model)) if isinstance(layer, ZooModel)), None)
    if tokenizer is not None and zoo_model is not None:  # the trained model takes and returns text
        zoo_model.tokenizer = tokenizer
    if not is_writer():
        return TrainResult(model, record, {})
    with alone():
        record.update(_export(config, model, lora_rank, huggingface, tokenizer, labels, image_preprocessing))
    with open(os.path.join(config.output_dir, "metrics.json"), "w", encoding="utf-8") as file:
        json.dump(record, file, indent=2)
    history = read_log(csv_path)
    if history and importlib.util.find_spec("matplotlib") is None:  # an install without the recipes' extra
        log("No learning_curves.png: drawing it needs matplotlib (pip install 'keras_tfm[recipes]').")
    elif history:
        from keras_tfm.viz import plot_learning_curves

        plot_learning_curves(history, os.path.join(config.output_dir, "learning_curves.png"), title=record["model"])
    log("Metrics: " + json.dumps(record))
    return TrainResult(model, record, history)


def _build(
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
            _zoo_model(model).enable_lora(config.lora_rank, lora_alpha=config.lora_alpha)
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


def _fit(
    config: TrainingConfig, model, train_batch, epochs, steps_per_epoch, validation_data, csv_path, callbacks, settings
) -> float:
    """Resumes from the last checkpoint in `output_dir`, fits the epochs left and returns the seconds
    it took; raises `TrainingDiverged` if the loss went NaN."""
    manager = CheckpointManager(os.path.join(config.output_dir, "checkpoint"), writer=is_writer())
    distribute.checkpoint_note = lambda: _last_checkpoint(manager)
    initial_epoch = manager.restore(model, settings)
    seen = gather_from_processes(initial_epoch)
    if len(set(seen)) > 1:
        raise CheckpointError(
            f"the processes see different checkpoints in {manager.directory!r} (epochs done: "
            + ", ".join(f"process {index}: {epoch}" for index, epoch in enumerate(seen))
            + "); `output_dir` must be a directory that every process shares."
        )
    if initial_epoch:
        iterations = model.optimizer.iterations
        log(
            f"Resuming from {manager.state_path}: {initial_epoch} epochs done, optimizer step "
            f"{int(keras.ops.convert_to_numpy(iterations))}."
        )
        _truncate_log(csv_path, initial_epoch)
    nan_stop = StopOnNaN()
    run_callbacks = [
        StopOnInterrupt(manager),
        nan_stop,
        EpochCheckpoint(manager, {"epochs": epochs, "steps_per_epoch": steps_per_epoch, "settings": settings}),
        *([keras.callbacks.CSVLogger(csv_path, append=initial_epoch > 0)] if is_writer() else []),
        *(callbacks or []),
    ]
    if config.ema is not None:
        # Validation reads the averaged weights; checkpoints (written after it) hold the raw weights
        # and, in the optimizer's state, the averages, so a resumed run continues both.
        run_callbacks.append(keras.callbacks.SwapEMAWeights())
    if config.tensorboard and is_writer():
        run_callbacks.append(keras.callbacks.TensorBoard(os.path.join(config.output_dir, "tensorboard")))

    def stream():
        for epoch in range(initial_epoch, epochs):
            for step in range(steps_per_epoch):
                yield train_batch(epoch, step)

    data = stream() if processes().engine != "tf_config" else _worker_dataset(stream)
    verbose = config.verbose if config.verbose is not None else (1 if sys.stdout.isatty() else 2)
    start = time.perf_counter()
    if initial_epoch < epochs:
        _fit_or_report_lost(
            model,
            config,
            manager,
            data,
            steps_per_epoch=steps_per_epoch,
            epochs=epochs,
            initial_epoch=initial_epoch,
            validation_data=validation_data,
            validation_batch_size=_feed_batch(config),
            shuffle=False,
            callbacks=run_callbacks,
            verbose=verbose if is_writer() else 0,
        )
    else:
        log("Training already finished in this output directory; evaluating.")
        model.optimizer.finalize_variable_values(model.trainable_variables)  # what `fit` does at its end
    if nan_stop.bad_step is not None:
        state = manager.state()
        raise TrainingDiverged(
            f"the training loss became NaN at step {nan_stop.bad_step} of an epoch; training stopped. "
            + (f"The last good checkpoint (epoch {state['epoch']}) is kept in {manager.directory}. " if state else "")
            + "Try a lower `learning_rate`, a smaller `clip_norm` or `precision` float32."
        )
    return time.perf_counter() - start


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
        return f"The last good checkpoint (epoch {state['epoch']}) is in {manager.directory}. "
    return "No epoch had finished, so there is no checkpoint yet. "


def _digest(value) -> str:
    """A short digest of (nested) arrays."""
    digest = hashlib.sha256()
    for part in keras.tree.flatten(value):
        array = np.ascontiguousarray(part)
        digest.update(array.tobytes() + str((array.dtype, array.shape)).encode())
    return digest.hexdigest()[:16]


def _local(train_batch, batch_size: int):
    """`train_batch` giving this process's rows of each global batch: the function reads only those
    where it takes `rows` (a slice of the batch), else its batch is cut."""
    if processes().count == 1:
        return train_batch
    rows = local_rows(batch_size)
    if "rows" in inspect.signature(train_batch).parameters:
        return lambda epoch, step: train_batch(epoch, step, rows=rows)
    return lambda epoch, step: tuple(part[rows] for part in train_batch(epoch, step))


def _feed_batch(config: TrainingConfig) -> int:
    """Rows of each evaluation batch this process feeds: its share on JAX; on TensorFlow's multi-worker
    strategy the whole batch, which Keras itself shards among the workers."""
    return config.batch_size // processes().count if processes().engine == "jax" else config.batch_size


def _local_validation(validation_data: tuple) -> tuple:
    """This process's equal share of the validation rows on JAX (TensorFlow's multi-worker strategy
    shards them itself). When they do not divide evenly every process evaluates all of them: the mean
    is the same, and no process waits on a batch another lacks."""
    count = processes().count
    rows = len(validation_data[0])
    if count == 1 or rows % count or processes().engine != "jax":
        return validation_data
    share = slice(processes().index * rows // count, (processes().index + 1) * rows // count)
    return tuple(None if part is None else part[share] for part in validation_data)


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


def _export(config: TrainingConfig, model, lora_rank, huggingface, tokenizer, labels, image_preprocessing) -> dict:
    """Writes the trained model for transformers or peft users where it can be; returns where, for
    metrics.json. A failure is logged, not raised: the trained run is recorded all the same. LoRA on a
    Hugging Face checkpoint gives both a peft adapter (the pairs alone) and the merged checkpoint."""
    written = {}
    if lora_rank and huggingface:
        from keras_tfm.convert import save_peft_adapter

        path = os.path.join(config.output_dir, "peft_adapter")
        try:
            save_peft_adapter(
                _zoo_model(model), path, base=huggingface.directory, base_model_name_or_path=huggingface.base_model_name
            )
            log(f"LoRA pairs written as a peft adapter for {huggingface.base_model_name!r}: {path}")
            written["peft_adapter"] = path
        except (OSError, ValueError) as error:
            log(f"No peft adapter written: {error}")
    if huggingface or (tokenizer is not None and tokenizer.writes_huggingface()) or image_preprocessing:
        from keras_tfm.convert import save_huggingface

        path = os.path.join(config.output_dir, "huggingface")
        try:
            save_huggingface(
                _zoo_model(model),
                path,
                tokenizer_from=huggingface.directory if huggingface else None,
                labels=labels,
                image_preprocessing=image_preprocessing,
                overwrite=True,  # the run's own directory: a run resumed after it finished writes it again
            )
            if (tokenizer is not None and tokenizer.writes_huggingface()) and not huggingface:
                tokenizer.save_huggingface(path)
        except (OSError, ValueError) as error:
            log(f"No Hugging Face checkpoint written: {error}")
            return written
        log(
            f"Trained model{' (LoRA pairs merged)' if lora_rank else ''} and its "
            f"{'image processor' if image_preprocessing else 'tokenizer'} written as a Hugging Face checkpoint: {path}"
        )
        written["huggingface_checkpoint"] = path
    return written


def _zoo_model(model: keras.Model) -> ZooModel:
    """`model`, or the keras_tfm model a recipe wrapped (the ViT recipe puts preprocessing before it)."""
    if isinstance(model, ZooModel):
        return model
    return next(layer for layer in sublayers(model) if isinstance(layer, ZooModel))


def read_log(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return {
        name: [float(row[name]) for row in rows if row.get(name) not in (None, "")]
        for name in (rows[0] if rows else {})
        if name != "epoch"
    }


def _truncate_log(path: str, epochs_done: int) -> None:
    """Drops log rows of epochs after the checkpoint (written before a kill, about to be redone)."""
    if not os.path.exists(path):
        return
    with open(path, newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    if not rows:
        return
    kept = [rows[0]] + [row for row in rows[1:] if row and int(row[0]) < epochs_done]
    with open(path, "w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows(kept)
