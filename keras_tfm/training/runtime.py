"""The training runtime every recipe shares: one `train` call from settings to metrics.json.

    recipe: parse flags -> data -> `train(TrainingConfig(...), build_model=..., train_batch=..., ...)`
    runtime: seed, precision, distribution -> build + compile (AdamW, warmup + cosine, XLA)
             -> resume from the last checkpoint -> `model.fit` with progress, CSV log, checkpoints,
             NaN stop -> evaluate -> metrics.json + learning_curves.png in `output_dir`

Training data comes as `train_batch(epoch, step) -> (x, y)`, a pure function of its arguments, so a
resumed run sees exactly the batches the interrupted one would have seen. Fitting is `fitting.py`,
recording `recording.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import keras

from keras_tfm.errors import InputError
from keras_tfm.training.config import HuggingFaceCheckpoint, TrainingConfig
from keras_tfm.training.distribute import is_writer, log
from keras_tfm.training.fitting import (
    batched,
    build,
    check_agreement,
    feed_batch,
    fit,
    local_batches,
    local_validation,
    plan_steps,
    recorded_settings,
    use_jit,
)
from keras_tfm.training.recording import write_records, zoo_model


@dataclasses.dataclass
class TrainResult:
    model: keras.Model
    metrics: dict
    history: dict


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
        validation_data: `(x, y)` or `(x, y, sample_weight)`, or a `keras.utils.PyDataset` of such batches
            (images prepared as they are drawn: `data.ProcessedImages`), evaluated after every epoch and at the end.
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

    The trained model is also written for transformers and peft users where they can use it
    (`recording.export`); it carries `tokenizer`, so that its `generate` takes text.
    """
    if config.lora_rank and not (pretrained or huggingface is not None):
        raise InputError(
            "LoRA fine-tunes pretrained weights, and this run trains a model from scratch; use it with "
            "a `from_huggingface` checkpoint (gpt_lm.py, vit.py, bert_mlm.py) or bert_mlm.py's `finetune` stage.",
            "lora_rank",
        )
    epochs, steps_per_epoch = plan_steps(config, steps_per_pass)
    recorded = recorded_settings(config, settings)
    check_agreement(config, recorded, validation_data, tokenizer)
    train_batch = local_batches(train_batch, config.batch_size)
    validation_data = local_validation(validation_data)
    model, lora_rank = build(
        config, build_model, train_batch, epochs * steps_per_epoch, loss, metrics, weighted_metrics
    )
    trainable = _log_model(config, model, lora_rank, epochs, steps_per_epoch)
    seconds = fit(config, model, train_batch, epochs, steps_per_epoch, validation_data, callbacks, recorded)
    record = {
        "backend": keras.backend.backend(),
        "model": config.model_name or model.name,
        "parameters": model.count_params(),
        "trainable_parameters": trainable,
        "lora_rank": lora_rank,
        **dict(epochs=epochs, steps=epochs * steps_per_epoch, batch_size=config.batch_size),
        **dict(precision=model.dtype_policy.name, remat=config.remat, train_seconds_this_run=round(seconds, 1)),
        **_evaluation(config, model, validation_data, evaluate),
    }
    if tokenizer is not None and zoo_model(model) is not None:  # the trained model takes and returns text
        zoo_model(model).tokenizer = tokenizer
    if not is_writer():
        return TrainResult(model, record, {})
    history = write_records(
        config, model, record, lora_rank, huggingface, tokenizer, labels, image_preprocessing, settings
    )
    return TrainResult(model, record, history)


def _log_model(config: TrainingConfig, model, lora_rank, epochs: int, steps_per_epoch: int) -> int:
    """Says what is trained, how long and how; returns the trained parameters."""
    trainable = sum(math.prod(variable.shape) for variable in model.trainable_variables)
    trained = f" ({trainable:,} trained: LoRA rank {lora_rank})" if lora_rank else ""
    log(
        f"Model: {model.name}, {model.count_params():,} parameters{trained}; {epochs} epochs x {steps_per_epoch} "
        f"steps of batch {config.batch_size}; XLA {'on' if use_jit(config) else 'off'}"
        f"{'; blocks rematerialized' if config.remat else ''}."
    )
    return trainable


def _evaluation(config: TrainingConfig, model, validation_data: tuple, evaluate) -> dict:
    """The validation metrics (`validation_loss`, ...) and what `evaluate(model)` adds."""
    if batched(validation_data):
        results = model.evaluate(validation_data, return_dict=True, verbose=0)
    else:
        results = _evaluated_arrays(config, model, validation_data)
    results = {f"validation_{name}": float(value) for name, value in results.items()}
    if evaluate is not None:
        results.update(evaluate(model))
    return results


def _evaluated_arrays(config: TrainingConfig, model, validation_data: tuple) -> dict:
    return model.evaluate(
        validation_data[0],
        validation_data[1],
        batch_size=feed_batch(config),
        return_dict=True,
        verbose=0,
        sample_weight=validation_data[2] if len(validation_data) > 2 else None,
    )
