"""The settings of one training run, checked when made: what `keras_tfm.training.train` reads.

A recipe builds it from its flags (`keras_tfm.training.cli.training_config`); a notebook builds it directly:

    config = TrainingConfig(output_dir="runs/mine", steps=200, batch_size=16, learning_rate=3e-3)
    result = keras_tfm.training.train(config, build_model=..., train_batch=..., ...)
"""

from __future__ import annotations

import dataclasses

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import is_integer, is_number

PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
# The settings that change what a run computes: a checkpoint records them, and resuming with others is refused.
RESULT_FIELDS = (
    "epochs",
    "steps_per_epoch",
    "steps",
    "batch_size",
    "learning_rate",
    "warmup_steps",
    "weight_decay",
    "clip_norm",
    "ema",
    "lora_rank",
    "lora_alpha",
    "seed",
    "precision",
)
JIT_COMPILE = ("auto", "on", "off")
DISTRIBUTE = ("none", "data", "model")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Frozen, validated settings of a training run; `dataclasses.replace(config, ...)` makes a changed copy.

    Args:
        output_dir: checkpoints, `log.csv`, `metrics.json` and plots; a run started again in the same
            directory resumes from its last checkpoint.
        epochs: epochs of training; a checkpoint is written after each.
        checkpoint_every: also write a checkpoint within epochs every this many steps (a run stopped then
            resumes there, with the batches that follow); `None`: every `checkpoint_minutes`.
        checkpoint_minutes: without `checkpoint_every`, a checkpoint within an epoch once this many minutes
            have passed since the last; 0 turns them off.
        steps_per_epoch: optimizer steps per epoch; `None`: one pass over the training data.
        steps: total optimizer steps; replaces `epochs` (epochs are then at most `steps_per_epoch` long).
        batch_size: global batch size.
        learning_rate: AdamW's peak learning rate, reached after a linear warmup, then cosine decay to 10% of it.
        warmup_steps: steps of linear warmup; `None`: 5% of all steps.
        weight_decay: AdamW's decoupled weight decay (not applied to biases and normalization scales).
        clip_norm: global gradient-norm clipping; 0 turns it off.
        ema: keep an exponential moving average of the weights with this momentum in [0, 1) and validate,
            evaluate and return the averaged weights; `None`: off.
        lora_rank: fine-tune pretrained weights through rank-`lora_rank` LoRA updates of every attention's
            query and value projections; `None`: train every weight.
        lora_alpha: LoRA's updates are scaled by `lora_alpha / lora_rank`; `None`: `lora_rank` (a scale of 1).
        seed: the seed of weights, data order and sampling.
        precision: a Keras dtype policy, one of `PRECISIONS`; "auto": mixed_bfloat16 on an accelerator with
            bfloat16 arithmetic (GPUs from NVIDIA's Ampere on, TPUs), float32 elsewhere.
        remat: recompute each block's activations in the backward pass instead of storing them.
        jit_compile: XLA compilation, one of "auto" (on for TensorFlow and JAX, off for PyTorch), "on", "off".
        distribute: "none", "data" (replicate the model, split the batch) or "model" (also shard heads and
            feed-forward widths; JAX).
        model_parallel: devices on the "model" axis for `distribute="model"`; `None`: all.
        cpu_devices: split the CPU into this many virtual devices (to try `distribute` without accelerators).
        coordinator_address, num_processes, process_id: a run of several processes (JAX): process 0's
            `HOST:PORT`, the number of processes and this one's index (`initialize_processes`); `None`: from
            the environment, or one process.
        process_timeout: seconds to wait for every process to join, and after which a silent one counts as lost.
        tensorboard: also write TensorBoard logs.
        verbose: Keras' progress output (0, 1 or 2); `None`: bars on a terminal, a line per epoch otherwise.
        model_name: the model's name in `metrics.json` and on the plots; `None`: the Keras model's name.
    """

    output_dir: str
    epochs: int = 10
    checkpoint_every: int | None = None
    checkpoint_minutes: float = 10.0
    steps_per_epoch: int | None = None
    steps: int | None = None
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int | None = None
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    ema: float | None = None
    lora_rank: int | None = None
    lora_alpha: float | None = None
    seed: int = 0
    precision: str = "auto"
    remat: bool = False
    jit_compile: str = "auto"
    distribute: str = "none"
    model_parallel: int | None = None
    cpu_devices: int | None = None
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    process_timeout: int = 60
    tensorboard: bool = False
    verbose: int | None = None
    model_name: str | None = None

    def __post_init__(self):
        if not isinstance(self.output_dir, str) or not self.output_dir:
            raise InputError(f"expected a directory path; got {self.output_dir!r}.", "output_dir")
        for name, minimum, optional in (
            ("epochs", 1, False),
            ("checkpoint_every", 1, True),
            ("steps_per_epoch", 1, True),
            ("steps", 1, True),
            ("batch_size", 1, False),
            ("warmup_steps", 0, True),
            ("lora_rank", 1, True),
            ("model_parallel", 1, True),
            ("cpu_devices", 1, True),
            ("num_processes", 1, True),
            ("process_id", 0, True),
            ("process_timeout", 1, False),
        ):
            _check_integer(name, getattr(self, name), minimum, optional)
        _check_integer("seed", self.seed, None, False)
        for name in ("learning_rate", "weight_decay", "clip_norm", "checkpoint_minutes"):
            _check_number(name, getattr(self, name), "a number >= 0", lambda value: value >= 0.0)
        if self.ema is not None:
            _check_number("ema", self.ema, "a momentum in [0, 1), such as 0.999", lambda v: 0.0 <= v < 1.0)
        if self.lora_alpha is not None:
            _check_number("lora_alpha", self.lora_alpha, "a number > 0", lambda v: v > 0.0)
            if self.lora_rank is None:
                raise InputError("it scales LoRA's updates; give `lora_rank` too.", "lora_alpha")
        for name, choices in (("precision", PRECISIONS), ("jit_compile", JIT_COMPILE), ("distribute", DISTRIBUTE)):
            if getattr(self, name) not in choices:
                raise InputError(f"expected one of {', '.join(choices)}; got {getattr(self, name)!r}.", name)
        if self.verbose not in (None, 0, 1, 2) or isinstance(self.verbose, bool):
            raise InputError(f"expected 0, 1, 2 or None; got {self.verbose!r}.", "verbose")
        for name in ("remat", "tensorboard"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"expected True or False; got {getattr(self, name)!r}.", name)
        if self.coordinator_address is not None and not isinstance(self.coordinator_address, str):
            raise InputError(f"expected HOST:PORT or None; got {self.coordinator_address!r}.", "coordinator_address")
        if self.model_name is not None and not isinstance(self.model_name, str):
            raise InputError(f"expected a string or None; got {self.model_name!r}.", "model_name")


def _check_integer(name: str, value, minimum: int | None, optional: bool) -> None:
    if value is None and optional:
        return
    if not is_integer(value) or (minimum is not None and value < minimum):
        expected = "an integer" + (f" >= {minimum}" if minimum is not None else "") + (" or None" if optional else "")
        raise InputError(f"expected {expected}; got {value!r}.", name)


def _check_number(name: str, value, expected: str, within) -> None:
    if not is_number(value) or not within(value):
        raise InputError(f"expected {expected}; got {value!r}.", name)


@dataclasses.dataclass(frozen=True)
class HuggingFaceCheckpoint:
    """A Hugging Face checkpoint that a run fine-tunes, resolved to local files.

    Args:
        name: as the user gave it: a directory, a Hub model id, or a peft LoRA adapter on either.
        directory: the local directory of the (base) checkpoint's weights, configuration and tokenizer.
        config: that checkpoint's `config.json`.
        base_model_name: the base checkpoint's name, as a peft adapter written after training records it.
        adapter: the local directory of the peft adapter when `name` is one, else `None`.
    """

    name: str
    directory: str
    config: dict
    base_model_name: str
    adapter: str | None = None
