"""The training runtime every recipe shares: one `train` call from flags to metrics.json.

    recipe: parse flags -> data -> `train(args, build_model=..., train_batch=..., ...)`
    runtime: seed, precision, distribution -> build + compile (AdamW, warmup + cosine, XLA)
             -> resume from the last checkpoint -> `model.fit` with progress, CSV log, checkpoints,
             NaN stop -> evaluate -> metrics.json + learning_curves.png in --output-dir

Training data comes as `train_batch(epoch, step) -> (x, y)`, a pure function of its arguments, so a
resumed run sees exactly the batches the interrupted one would have seen.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable

import keras

from keras_tfm.compat import sublayers
from keras_tfm.data.errors import DataError
from keras_tfm.layers import lora
from keras_tfm.models.model import Model as ZooModel
from keras_tfm.training.checkpoints import CheckpointManager, EpochCheckpoint, StopOnNaN, TrainingDiverged
from keras_tfm.training.distribute import distribution_scope, use_cpu_devices


@dataclasses.dataclass
class TrainResult:
    model: keras.Model
    metrics: dict
    history: dict


def log(message: str) -> None:
    print(message, flush=True)


def setup(args: argparse.Namespace) -> None:
    """Virtual CPU devices, seed and dtype policy; call before building anything."""
    if args.cpu_devices:
        use_cpu_devices(args.cpu_devices)
    keras.utils.set_random_seed(args.seed)
    keras.config.set_dtype_policy(args.precision)
    os.makedirs(args.output_dir, exist_ok=True)
    log(f"Backend: {keras.backend.backend()}, precision {args.precision}, output in {args.output_dir}")


def use_jit(args: argparse.Namespace) -> bool:
    # On PyTorch, Keras' jit_compile means torch.compile, which recompiles at every layer boundary of
    # these models (minutes) and then runs slower than eager; so "auto" is eager there.
    if args.jit_compile == "auto":
        if keras.backend.backend() == "tensorflow" and args.distribute != "none":
            import tensorflow as tf

            # XLA cannot place MirroredStrategy's per-device variables on virtual CPU devices
            # ("Trying to access resource ... located in device CPU:1 from device CPU:0"); GPUs are fine.
            return bool(tf.config.list_logical_devices("GPU"))
        return keras.backend.backend() != "torch"
    return args.jit_compile == "on"


def plan_steps(args: argparse.Namespace, steps_per_pass: int) -> tuple[int, int]:
    """(epochs, steps_per_epoch) from --epochs, --steps-per-epoch and --steps."""
    steps_per_epoch = args.steps_per_epoch or max(1, steps_per_pass)
    epochs = args.epochs
    if args.steps:
        steps_per_epoch = min(steps_per_epoch, args.steps)
        epochs = math.ceil(args.steps / steps_per_epoch)
        steps_per_epoch = math.ceil(args.steps / epochs)
    for flag, value in (
        ("--epochs", epochs),
        ("--steps-per-epoch", steps_per_epoch),
        ("--batch-size", args.batch_size),
    ):
        if value < 1:
            raise DataError(f"{flag}: expected a positive number, got {value}.")
    return epochs, steps_per_epoch


def make_optimizer(args: argparse.Namespace, total_steps: int) -> keras.optimizers.Optimizer:
    """AdamW, linear warmup to --learning-rate, then cosine decay to a tenth of it; no weight decay
    on biases, LayerNorm and embeddings' positions; with --ema, a moving average of the weights."""
    if args.ema is not None and not 0.0 <= args.ema < 1.0:
        raise DataError(f"--ema: expected a momentum in [0, 1), such as 0.999; got {args.ema}.")
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, total_steps // 20)
    warmup = min(warmup, max(total_steps - 1, 0))
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=max(1, total_steps - warmup),
        alpha=0.1,
        warmup_target=args.learning_rate,
        warmup_steps=warmup,
    )
    optimizer = keras.optimizers.AdamW(
        schedule,
        weight_decay=args.weight_decay,
        beta_2=0.99,
        global_clipnorm=args.clip_norm or None,
        use_ema=args.ema is not None,
        ema_momentum=args.ema if args.ema is not None else 0.99,
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
    args: argparse.Namespace,
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
    tokenizer=None,
    labels: list | None = None,
    image_preprocessing: tuple | None = None,
) -> TrainResult:
    """Builds, trains (resuming if `--output-dir` holds a checkpoint), evaluates and records a model.
    `pretrained`: `build_model` returns trained weights (a checkpoint, an earlier stage), which
    `--lora-rank` may fine-tune. The trained model is also written for transformers users
    (`OUTPUT_DIR/huggingface`) where they can use it: fine-tuned from `--from-huggingface` (with that
    checkpoint's tokenizer files), read by a `tokenizer` that writes itself for transformers
    (characters, byte-pair, WordPiece), or a ViT given its `image_preprocessing` (`save_huggingface`'s), with a
    classifier's class names `labels`. A LoRA run on a checkpoint writes its peft adapter instead."""
    lora_rank = getattr(args, "lora_rank", None)
    if lora_rank and not pretrained:
        raise DataError(
            "--lora-rank: LoRA fine-tunes pretrained weights, and this run trains a model from scratch; "
            "use it with --from-huggingface DIR (gpt_lm.py, vit.py, bert_mlm.py) or bert_mlm.py's "
            "--finetune stage."
        )
    if getattr(args, "lora_alpha", None) is not None and not lora_rank:
        raise DataError("--lora-alpha: it scales LoRA's updates; give --lora-rank too.")
    epochs, steps_per_epoch = plan_steps(args, steps_per_pass)
    total_steps = epochs * steps_per_epoch
    with distribution_scope(args.distribute, args.model_parallel, log=log):
        model = build_model()
        adapted = lora.lora_layers(model)  # a peft adapter's, from --from-huggingface
        if lora_rank and adapted:
            raise DataError(
                f"--lora-rank: --from-huggingface {getattr(args, 'adapter', '')!r} is a LoRA adapter "
                f"of rank {next(iter(adapted.values())).lora_rank}, which goes on training; drop "
                "--lora-rank."
            )
        if lora_rank:
            _zoo_model(model).enable_lora(lora_rank, lora_alpha=getattr(args, "lora_alpha", None))
        lora_rank = lora_rank or (next(iter(adapted.values())).lora_rank if adapted else None)
        remat = getattr(args, "remat", False)
        if remat:
            model.remat = True
        model.compile(
            optimizer=make_optimizer(args, total_steps),
            loss=loss,
            metrics=_made_here(metrics),
            weighted_metrics=_made_here(weighted_metrics),
            jit_compile=use_jit(args),
        )
        first_x = train_batch(0, 0)[0]
        model(first_x)
    trainable = sum(math.prod(variable.shape) for variable in model.trainable_variables)
    log(
        f"Model: {model.name}, {model.count_params():,} parameters"
        f"{f' ({trainable:,} trained: LoRA rank {lora_rank})' if lora_rank else ''}; {epochs} epochs x "
        f"{steps_per_epoch} steps of batch {args.batch_size}; XLA {'on' if use_jit(args) else 'off'}"
        f"{'; blocks rematerialized' if remat else ''}."
    )

    manager = CheckpointManager(os.path.join(args.output_dir, "checkpoint"))
    initial_epoch = manager.restore(model)
    csv_path = os.path.join(args.output_dir, "log.csv")
    if initial_epoch:
        log(
            f"Resuming from {manager.state_path}: {initial_epoch} epochs done, optimizer step "
            f"{int(model.optimizer.iterations.numpy() if hasattr(model.optimizer.iterations, 'numpy') else model.optimizer.iterations)}."
        )
        _truncate_log(csv_path, initial_epoch)
    nan_stop = StopOnNaN()
    run_callbacks = [
        nan_stop,
        EpochCheckpoint(manager, {"epochs": epochs, "steps_per_epoch": steps_per_epoch}),
        keras.callbacks.CSVLogger(csv_path, append=initial_epoch > 0),
        *(callbacks or []),
    ]
    if args.ema is not None:
        # Validation reads the averaged weights; checkpoints (written after it) hold the raw weights
        # and, in the optimizer's state, the averages, so a resumed run continues both.
        run_callbacks.append(keras.callbacks.SwapEMAWeights())
    if args.tensorboard:
        run_callbacks.append(keras.callbacks.TensorBoard(os.path.join(args.output_dir, "tensorboard")))

    def stream():
        for epoch in range(initial_epoch, epochs):
            for step in range(steps_per_epoch):
                yield train_batch(epoch, step)

    start = time.perf_counter()
    if initial_epoch < epochs:
        model.fit(
            stream(),
            steps_per_epoch=steps_per_epoch,
            epochs=epochs,
            initial_epoch=initial_epoch,
            validation_data=validation_data,
            validation_batch_size=args.batch_size,
            shuffle=False,
            callbacks=run_callbacks,
            verbose=args.verbose if args.verbose is not None else (1 if sys.stdout.isatty() else 2),
        )
    else:
        log("Training already finished in this output directory; evaluating.")
        model.optimizer.finalize_variable_values(model.trainable_variables)  # what `fit` does at its end
    seconds = time.perf_counter() - start
    if nan_stop.bad_step is not None:
        state = manager.state()
        raise TrainingDiverged(
            f"the training loss became NaN at step {nan_stop.bad_step} of an epoch; training stopped. "
            + (f"The last good checkpoint (epoch {state['epoch']}) is kept in {manager.directory}. " if state else "")
            + "Try a lower --learning-rate, a smaller --clip-norm or --precision float32."
        )

    results = model.evaluate(
        validation_data[0],
        validation_data[1],
        batch_size=args.batch_size,
        return_dict=True,
        verbose=0,
        sample_weight=validation_data[2] if len(validation_data) > 2 else None,
    )
    results = {f"validation_{name}": float(value) for name, value in results.items()}
    if evaluate is not None:
        results.update(evaluate(model))
    history = read_log(csv_path)
    record = {
        "backend": keras.backend.backend(),
        "model": args.model,
        "parameters": model.count_params(),
        "trainable_parameters": trainable,
        "lora_rank": lora_rank,
        "epochs": epochs,
        "steps": total_steps,
        "batch_size": args.batch_size,
        "precision": args.precision,
        "remat": remat,
        "train_seconds_this_run": round(seconds, 1),
        **results,
    }
    hugging_face_checkpoint = getattr(args, "from_huggingface", None)
    if lora_rank and hugging_face_checkpoint:  # LoRA on a Hugging Face checkpoint: for peft too
        from keras_tfm.convert import save_peft_adapter

        path = os.path.join(args.output_dir, "peft_adapter")
        try:
            save_peft_adapter(
                _zoo_model(model),
                path,
                base=hugging_face_checkpoint,
                base_model_name_or_path=getattr(args, "base_model_name", None),
            )
            record["peft_adapter"] = path
            log(
                f"LoRA pairs written as a peft adapter for "
                f"{getattr(args, 'base_model_name', hugging_face_checkpoint)!r}: {path}"
            )
        except (OSError, ValueError) as error:  # the trained run is recorded all the same
            log(f"No peft adapter written: {error}")
    elif hugging_face_checkpoint or hasattr(tokenizer, "save_huggingface") or image_preprocessing:
        from keras_tfm.convert import save_huggingface

        path = os.path.join(args.output_dir, "huggingface")
        try:
            save_huggingface(
                _zoo_model(model),
                path,
                tokenizer_from=hugging_face_checkpoint,
                labels=labels,
                image_preprocessing=image_preprocessing,
            )
            if hasattr(tokenizer, "save_huggingface") and not hugging_face_checkpoint:
                tokenizer.save_huggingface(path)
            record["huggingface_checkpoint"] = path
            log(
                f"Trained model and its {'image processor' if image_preprocessing else 'tokenizer'} written as a "
                f"Hugging Face checkpoint: {path}"
            )
        except (OSError, ValueError) as error:  # the trained run is recorded all the same
            log(f"No Hugging Face checkpoint written: {error}")
    with open(os.path.join(args.output_dir, "metrics.json"), "w", encoding="utf-8") as file:
        json.dump(record, file, indent=2)
    if history:
        from keras_tfm.viz import plot_learning_curves

        plot_learning_curves(history, os.path.join(args.output_dir, "learning_curves.png"), title=args.model)
    log("Metrics: " + json.dumps(record))
    return TrainResult(model, record, history)


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


def run_main(main: Callable[[], None]) -> None:
    """Runs a recipe's `main`, turning bad input and divergence into one clear line and exit status."""
    try:
        main()
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except TrainingDiverged as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(3) from None
