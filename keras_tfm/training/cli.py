"""The command line every recipe shares: model size by name and overrides, schedule, data, runtime."""

from __future__ import annotations

import argparse
import inspect
import math
import os
import typing

import keras

from keras_tfm.data.errors import DataError

MODEL_OVERRIDES = ("num_layers", "num_heads", "hidden_dim", "intermediate_dim", "dropout", "max_length")


def integer(minimum: int) -> typing.Callable[[str], int]:
    """An argparse type: an integer >= `minimum`; anything else is refused when the flags are read
    (`error: argument --batch-size: expected an integer >= 1; got '0'`), before any data is loaded."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}; got {text!r}")
        return value

    return parse


def number(
    minimum: float, maximum: float | None = None, above_minimum: bool = False, below_maximum: bool = False
) -> typing.Callable[[str], float]:
    """An argparse type: a finite number within the bounds (`above_minimum`, `below_maximum`: strictly)."""
    if maximum is None:
        expected = f"a number {'>' if above_minimum else '>='} {minimum:g}"
    else:
        expected = f"a number in {'(' if above_minimum else '['}{minimum:g}, {maximum:g}{')' if below_maximum else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        low_ok = value > minimum if above_minimum else value >= minimum
        high_ok = maximum is None or (value < maximum if below_maximum else value <= maximum)
        if not (math.isfinite(value) and low_ok and high_ok):
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return value

    return parse


POSITIVE = integer(1)
FRACTION = number(0.0, 1.0, below_maximum=True)  # a rate in [0, 1): dropout, label smoothing, ...


def recipe_parser(description: str, sizes: dict, default_size: str, default_output_dir: str) -> argparse.ArgumentParser:
    """An `ArgumentParser` with the flags of the shared runtime; a recipe adds its own to it."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)

    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        default=default_size,
        metavar="SIZE",
        help=f"named size, one of: {', '.join(sizes)} (default: %(default)s)",
    )
    model.add_argument("--num-layers", type=POSITIVE, help="override the size's number of blocks")
    model.add_argument("--num-heads", type=POSITIVE, help="override the size's attention heads")
    model.add_argument("--hidden-dim", type=POSITIVE, help="override the size's width")
    model.add_argument("--intermediate-dim", type=POSITIVE, help="override the size's feed-forward width")
    model.add_argument("--dropout", type=FRACTION, help="override the size's dropout rate")
    model.add_argument("--max-length", type=POSITIVE, help="override the size's longest sequence (context)")

    training = parser.add_argument_group("training")
    training.add_argument(
        "--epochs", type=POSITIVE, default=10, help="epochs; a checkpoint is written after each (default: %(default)s)"
    )
    training.add_argument(
        "--steps-per-epoch", type=POSITIVE, help="optimizer steps per epoch (default: one pass over the training data)"
    )
    training.add_argument(
        "--steps",
        type=POSITIVE,
        help="total optimizer steps; replaces --epochs (epochs are then at most --steps-per-epoch long)",
    )
    training.add_argument("--batch-size", type=POSITIVE, default=32, help="global batch size (default: %(default)s)")
    training.add_argument(
        "--learning-rate",
        type=number(0.0),
        default=1e-3,
        help="peak learning rate of AdamW, reached after the warmup, then cosine decay to 10%% of it (default: %(default)s)",
    )
    training.add_argument(
        "--warmup-steps", type=integer(0), default=None, help="linear warmup steps (default: 5%% of all steps)"
    )
    training.add_argument(
        "--weight-decay", type=number(0.0), default=0.01, help="AdamW weight decay (default: %(default)s)"
    )
    training.add_argument(
        "--clip-norm",
        type=number(0.0),
        default=1.0,
        help="global gradient-norm clipping; 0 = none (default: %(default)s)",
    )
    training.add_argument(
        "--ema",
        type=FRACTION,
        default=None,
        metavar="MOMENTUM",
        help="also keep an exponential moving average of the weights with this momentum (e.g. 0.999); "
        "validation, the final evaluation and the trained model use the averaged weights "
        "(default: off)",
    )
    training.add_argument(
        "--lora-rank",
        type=POSITIVE,
        default=None,
        metavar="RANK",
        help="LoRA fine-tuning: freeze the model and train rank-RANK updates of every attention's query "
        "and value projections (and a new task head); for --from-huggingface checkpoints",
    )
    training.add_argument(
        "--lora-alpha",
        type=number(0.0, above_minimum=True),
        default=None,
        metavar="ALPHA",
        help="LoRA's updates are scaled by ALPHA / RANK (default: RANK, a scale of 1)",
    )
    training.add_argument(
        "--seed", type=int, default=0, help="seed of weights, data order and sampling (default: %(default)s)"
    )

    data = parser.add_argument_group("data")
    data.add_argument("--data", metavar="PATH", help="local files to train on (see the recipe's description)")
    data.add_argument("--dataset", metavar="NAME", help="a tensorflow-datasets name (needs network the first time)")
    data.add_argument("--data-dir", metavar="DIR", help="where tensorflow-datasets keeps its downloads")

    runtime = parser.add_argument_group("runtime")
    runtime.add_argument(
        "--output-dir",
        default=default_output_dir,
        help="checkpoints, logs, metrics.json and plots; rerunning with the same directory resumes (default: %(default)s)",
    )
    runtime.add_argument(
        "--precision",
        default="float32",
        choices=["float32", "mixed_bfloat16", "mixed_float16"],
        help="Keras dtype policy (default: %(default)s)",
    )
    runtime.add_argument(
        "--remat",
        action="store_true",
        help="recompute each block's activations in the backward pass instead of storing them: "
        "less memory (a longer --max-length or larger --batch-size fits), one more forward pass of "
        "each block (0.7-0.9x the speed here), the same gradients",
    )
    runtime.add_argument(
        "--jit-compile",
        default="auto",
        choices=["auto", "on", "off"],
        help="XLA compilation: auto = on for TensorFlow and JAX, off (eager) for PyTorch, whose "
        "torch.compile path is slower here (default: %(default)s)",
    )
    runtime.add_argument(
        "--distribute",
        default="none",
        choices=["none", "data", "model"],
        help="data: replicate the model on every device and split the batch (JAX DataParallel, "
        "TensorFlow MirroredStrategy); model: also shard attention heads and feed-forward "
        "over a 'model' mesh axis (JAX ModelParallel) (default: %(default)s)",
    )
    runtime.add_argument(
        "--model-parallel",
        type=POSITIVE,
        default=None,
        metavar="N",
        help="devices on the 'model' axis for --distribute model (default: all)",
    )
    runtime.add_argument(
        "--cpu-devices",
        type=POSITIVE,
        default=None,
        metavar="N",
        help="split the CPU into N virtual devices, to try --distribute without accelerators",
    )
    runtime.add_argument("--tensorboard", action="store_true", help="also write TensorBoard logs (needs tensorflow)")
    runtime.add_argument(
        "--verbose",
        type=int,
        default=None,
        choices=[0, 1, 2],
        help="Keras progress: 1 = bars, 2 = a line per epoch (default: bars on a terminal)",
    )
    return parser


def build_model(sizes: dict, args: argparse.Namespace, **fixed):
    """Calls the size function named by `--model` with `fixed` arguments and the overrides given."""
    if args.model not in sizes:
        raise DataError(f"--model: expected one of {', '.join(sizes)}; got {args.model!r}.")
    size = sizes[args.model]
    model_class = typing.get_type_hints(size).get("return")  # size functions are `name(**overrides) -> Class`
    accepted = inspect.signature(model_class).parameters if model_class not in (None, keras.Model) else {}
    overrides = {name: getattr(args, name) for name in MODEL_OVERRIDES if getattr(args, name, None) is not None}
    for name in overrides:
        if accepted and name not in accepted:
            raise DataError(f"--{name.replace('_', '-')}: {args.model} has no such setting.")
    try:
        return size(**{**overrides, **fixed})
    except (TypeError, ValueError) as error:
        raise DataError(f"--model {args.model}: {error}") from None


def checkpoint_config(args: argparse.Namespace, model_type: str, fixed: dict, reason: str, keep: tuple = ()) -> dict:
    """For `--from-huggingface DIR`: refuses the model overrides (except those in `keep`) and every flag
    in `fixed` that differs from its default there, each with `reason`; returns DIR's `config.json`
    after checking its model type; names the checkpoint as the model in metrics.json. DIR may be a
    Hugging Face Hub model id: `args.from_huggingface` becomes its directory in the local cache. DIR
    may be a peft LoRA adapter: `args.adapter` becomes its directory, and `args.from_huggingface`
    that of the base checkpoint it names (`args.base_model_name`)."""
    from keras_tfm.convert import adapters
    from keras_tfm.convert.files import checkpoint_directory, read_config

    given = [name for name in MODEL_OVERRIDES if name not in keep and getattr(args, name, None) is not None]
    given += [name for name, default in fixed.items() if getattr(args, name) != default]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise DataError(f"{flag}: --from-huggingface {reason}; drop {flag}.")
    name = args.from_huggingface
    try:
        directory = checkpoint_directory(name)  # a Hub model id becomes its cached snapshot
        args.adapter, args.base_model_name = None, name
        if adapters.is_adapter_directory(directory) and not os.path.isfile(os.path.join(directory, "config.json")):
            args.adapter, args.base_model_name = directory, adapters.base_model_name(directory)
            directory = checkpoint_directory(args.base_model_name)
        args.from_huggingface = directory
        config = read_config(directory)
    except (OSError, ValueError) as error:
        raise DataError(f"--from-huggingface: {error}") from None
    if config["model_type"] != model_type:
        raise DataError(
            f"--from-huggingface: expected a {model_type} checkpoint; {name!r} holds a {config['model_type']!r} model."
        )
    args.model = f"from_huggingface {name}"
    return config
