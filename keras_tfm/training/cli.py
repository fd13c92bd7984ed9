"""The command line every recipe shares: model size by name and overrides, schedule, data, runtime.

Flags are the library's argument names with hyphens (`--output-dir` is `TrainingConfig.output_dir`), so
the library's errors, which name Python arguments, reach the command line as flags (`run_main`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import inspect
import json
import math
import os
import re
import sys
import typing
from collections.abc import Callable

import keras

from keras_tfm.errors import DataError, InputError
from keras_tfm.training.checkpoints import TrainingDiverged, TrainingInterrupted
from keras_tfm.training.config import RESULT_FIELDS, HuggingFaceCheckpoint, TrainingConfig
from keras_tfm.training.distribute import ProcessLost

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


def one_of(names) -> typing.Callable[[str], str]:
    """An argparse type: one of `names`."""

    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(names)}; got {text!r}")
        return text

    return parse


POSITIVE = integer(1)
FRACTION = number(0.0, 1.0, below_maximum=True)  # a rate in [0, 1): dropout, label smoothing, ...


class RecipeParser(argparse.ArgumentParser):
    """An `ArgumentParser` that speaks of the library's arguments as its flags.

    `aliases` maps a library argument to this parser's flag where their names differ (for example
    `{"kind": "tokenizer"}`: `load_or_fit_tokenizer(kind=...)` is given `--tokenizer`). `unrecorded`
    names the recipe's flags that do not change what a run computes (what it samples after training, say).
    Without `--output-dir`, a run writes to `runs_directory/DATA-MODEL-DIGEST` (`default_output_dir`).
    """

    parsed: RecipeParser | None = None  # the parser of the command line being run, for `run_main`

    def __init__(self, *args, runs_directory: str = "runs", **kwargs):
        super().__init__(*args, **kwargs)
        self.aliases: dict[str, str] = {}
        self.unrecorded: tuple[str, ...] = ()
        self.runs_directory = runs_directory
        self._destinations: set[str] = set()
        self.new_output_dir: str | None = None  # the run's directory, where this run makes it

    def parse_args(self, args=None, namespace=None):
        namespace = super().parse_args(args, namespace)
        self._destinations = set(vars(namespace))
        RecipeParser.parsed = self
        if getattr(namespace, "output_dir", "") is None:
            namespace.output_dir = default_output_dir(self.runs_directory, namespace, self.unrecorded)
        output_dir = getattr(namespace, "output_dir", None)
        self.new_output_dir = output_dir if output_dir and not os.path.exists(output_dir) else None
        return namespace

    def flag(self, argument: str) -> str | None:
        """`--the-flag` that gives the library's `argument`, or `None` if this command line has none."""
        name = self.aliases.get(argument, argument)
        return "--" + name.replace("_", "-") if name in self._destinations else None

    def speak_flags(self, error: InputError) -> str:
        """`error`'s message with the arguments it names written as this command line's flags."""
        message = error.words(self.flag, quoted=False)
        prefix = error.argument and (self.flag(error.argument) or error.argument)
        return f"{prefix}: {message}" if prefix else message


def recipe_parser(description: str, sizes: dict, default_size: str, runs_directory: str) -> RecipeParser:
    """A `RecipeParser` with the flags of the shared runtime; a recipe adds its own to it. Runs without
    `--output-dir` go to a directory of their own in `runs_directory`."""
    parser = RecipeParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter, runs_directory=runs_directory
    )

    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        type=one_of(sizes) if sizes else str,  # refused as the flags are read, before any data is touched
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
        "--checkpoint-every",
        type=POSITIVE,
        metavar="N",
        help="also write a checkpoint every N steps within epochs; a stopped run resumes there (default: every "
        "--checkpoint-minutes)",
    )
    training.add_argument(
        "--checkpoint-minutes",
        type=number(0.0),
        default=10.0,
        metavar="M",
        help="without --checkpoint-every, a checkpoint within an epoch once M minutes have passed since the "
        "last; 0 = only at epoch ends (default: %(default)s)",
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
        help="checkpoints, logs, metrics.json and plots; rerunning with the same directory resumes (default: "
        f"{runs_directory}/DATA-MODEL-DIGEST: a directory of each data, model and settings, so that the same command "
        "resumes and another starts afresh)",
    )
    runtime.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "float32", "mixed_bfloat16", "mixed_float16"],
        help="Keras dtype policy; auto = mixed_bfloat16 on a GPU with bfloat16 arithmetic (Ampere and "
        "later) or a TPU, float32 elsewhere (default: %(default)s)",
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
    processes = parser.add_argument_group(
        "several processes (JAX; on TensorFlow set TF_CONFIG instead)",
        "Start the same command on every process, each with its --process-id; --distribute data or model then "
        "spans the devices of all of them. Also read from KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES, "
        "_PROCESS_ID or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID.",
    )
    processes.add_argument("--coordinator-address", metavar="HOST:PORT", help="process 0's address and a free port")
    processes.add_argument("--num-processes", type=POSITIVE, metavar="N", help="processes in the run")
    processes.add_argument("--process-id", type=integer(0), metavar="I", help="this process's index, 0 to N-1")
    processes.add_argument(
        "--process-timeout",
        type=POSITIVE,
        default=60,
        metavar="SECONDS",
        help="wait this long for every process to join; a process silent this long counts as lost (default: %(default)s)",
    )
    runtime.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard logs in OUTPUT_DIR/tensorboard (pip install 'keras_tfm[tensorboard]')",
    )
    runtime.add_argument(
        "--verbose",
        type=int,
        default=None,
        choices=[0, 1, 2],
        help="Keras progress: 1 = bars, 2 = a line per epoch (default: bars on a terminal)",
    )
    return parser


def training_config(
    args: argparse.Namespace, huggingface: HuggingFaceCheckpoint | None = None, **changes
) -> TrainingConfig:
    """The `TrainingConfig` of the parsed flags (each field from the flag of its name), with `changes`;
    the model is named by `--model`, or by the `huggingface` checkpoint it fine-tunes."""
    fields = {field.name for field in dataclasses.fields(TrainingConfig)}
    values = {name: value for name, value in vars(args).items() if name in fields}
    model_name = f"from_huggingface {huggingface.name}" if huggingface else args.model
    return TrainingConfig(**{**values, "model_name": model_name, **changes})


# Flags that cannot change what a run computes (a run may resume with them changed): the runtime's
# settings outside `RESULT_FIELDS`, and where tensorflow-datasets keeps its downloads.
NOT_RECORDED = (
    *(field.name for field in dataclasses.fields(TrainingConfig) if field.name not in RESULT_FIELDS),
    "data_dir",
)


def recipe_settings(args: argparse.Namespace, ignore: tuple = ()) -> dict:
    """The flags that change what a run computes, for `train(settings=...)`: all but `NOT_RECORDED`,
    the parser's `unrecorded` and `ignore`."""
    ignore = (*NOT_RECORDED, *(RecipeParser.parsed.unrecorded if RecipeParser.parsed else ()), *ignore)
    return {name: value for name, value in vars(args).items() if name not in ignore}


def default_output_dir(runs_directory: str, args: argparse.Namespace, unrecorded: tuple = ()) -> str:
    """`runs_directory/DATA-MODEL-DIGEST`: the data's name (file or dataset), the model's (size or
    checkpoint) and a digest of the settings that change what the run computes. The same command
    finds its directory again (and resumes); another recipe, data set, model or setting gets its own."""
    source = next((getattr(args, name) for name in ("data", "dataset", "finetune") if getattr(args, name, None)), None)
    data = (
        re.sub(r"(\.(txt|gz|zip|tar|csv|json))+$", "", os.path.basename(os.path.normpath(source)))
        if source
        else "default"
    )
    model = getattr(args, "from_huggingface", None) or getattr(args, "model", None) or "model"
    model = os.path.basename(os.path.normpath(model))
    settings = {n: v for n, v in vars(args).items() if n not in (*NOT_RECORDED, *unrecorded)}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:6]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{data}-{model}")
    return os.path.join(runs_directory, f"{name}-{digest}")


def build_model(sizes: dict, args: argparse.Namespace, **fixed):
    """Calls the size function named by `--model` with `fixed` arguments and the overrides given."""
    if args.model not in sizes:
        raise InputError(f"expected one of {', '.join(sizes)}; got {args.model!r}.", argument="model")
    size = sizes[args.model]
    model_class = typing.get_type_hints(size).get("return")  # size functions are `name(**overrides) -> Class`
    accepted = inspect.signature(model_class).parameters if model_class not in (None, keras.Model) else {}
    overrides = {name: getattr(args, name) for name in MODEL_OVERRIDES if getattr(args, name, None) is not None}
    for name in overrides:
        if accepted and name not in accepted:
            raise InputError(f"{args.model} has no such setting.", argument=name)
    try:
        return size(**{**overrides, **fixed})
    except (TypeError, ValueError) as error:
        raise InputError(f"{args.model}: {error}", argument="model") from None


def checkpoint_config(
    args: argparse.Namespace, model_type: str | tuple[str, ...], fixed: dict, reason: str, keep: tuple = ()
) -> HuggingFaceCheckpoint:
    """For `--from-huggingface DIR`: refuses the model overrides (except those in `keep`) and every flag
    in `fixed` that differs from its default there, each with `reason`; returns DIR resolved, with its
    `config.json` after checking its model type. DIR may be a Hugging Face Hub model id (read from, or
    downloaded into, the local cache) or a peft LoRA adapter on a checkpoint."""
    from keras_tfm.convert import adapters
    from keras_tfm.convert.files import checkpoint_directory, read_config

    given = [name for name in MODEL_OVERRIDES if name not in keep and getattr(args, name, None) is not None]
    given += [name for name, default in fixed.items() if getattr(args, name) != default]
    if given:
        raise InputError(f"`from_huggingface` {reason}; leave `{given[0]}` out.", argument=given[0])
    name = args.from_huggingface
    try:
        directory = checkpoint_directory(name)  # a Hub model id becomes its cached snapshot
        adapter, base_model_name = None, name
        if adapters.is_adapter_directory(directory) and not os.path.isfile(os.path.join(directory, "config.json")):
            adapter, base_model_name = directory, adapters.base_model_name(directory)
            directory = checkpoint_directory(base_model_name)
        config = read_config(directory)
    except InputError as error:  # in the recipe's words: the flag names the checkpoint
        raise DataError(error.message, argument="from_huggingface") from None
    model_types = (model_type,) if isinstance(model_type, str) else tuple(model_type)
    if config["model_type"] not in model_types:
        raise DataError(
            f"expected a {' or '.join(model_types)} checkpoint; {name!r} holds a {config['model_type']!r} model.",
            argument="from_huggingface",
        )
    return HuggingFaceCheckpoint(name, directory, config, base_model_name, adapter)


def run_main(main: Callable[[], None]) -> None:
    """Runs a recipe's `main`, turning bad input, divergence, a lost process and Ctrl-C into one clear
    line (speaking of the recipe's flags) and exit status 2 (bad input), 3 (the loss diverged), 4 (another
    process of the run stopped) or 130 (interrupted)."""
    RecipeParser.parsed = None
    try:
        main()
    except ProcessLost as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Not `SystemExit`: JAX's exit handler would wait for the lost process at a shutdown barrier.
        os._exit(4)
    except KeyboardInterrupt as interrupt:  # Ctrl-C: during training, after the step it was in
        message = str(interrupt) if isinstance(interrupt, TrainingInterrupted) else "interrupted (Ctrl-C)."
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(130) from None
    except (InputError, TrainingDiverged) as error:
        status = 3 if isinstance(error, TrainingDiverged) else 2
        error = error if isinstance(error, InputError) else InputError(str(error))
        parser = RecipeParser.parsed
        print(f"error: {parser.speak_flags(error) if parser else error}", file=sys.stderr)
        if status == 2 and parser and parser.new_output_dir:  # a run refused leaves no empty directory behind
            with contextlib.suppress(OSError):  # removed only while empty
                os.rmdir(parser.new_output_dir)
        raise SystemExit(status) from None


def shapes_flags(parser: RecipeParser, image_size: int, max_shapes: int, train_images: int, test_images: int):
    """The flags of a recipe on generated shapes (`data.shape_splits`), with its defaults; returns their group."""
    group = parser.add_argument_group("generated shapes")
    group.add_argument("--image-size", type=integer(16), default=image_size,
                       help="side of the generated pictures (default: %(default)s)")  # fmt: skip
    group.add_argument("--max-shapes", type=POSITIVE, default=max_shapes,
                       help="most shapes in a picture (default: %(default)s)")  # fmt: skip
    group.add_argument("--train-images", type=POSITIVE, default=train_images,
                       help="generated training pictures (default: %(default)s)")  # fmt: skip
    group.add_argument("--test-images", type=POSITIVE, default=test_images,
                       help="generated test pictures (default: %(default)s)")  # fmt: skip
    return group
