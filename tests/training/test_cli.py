"""The recipes' command line: flags checked when read, library arguments shown as flags, checkpoints' fixed settings."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import re

import numpy as np
import pytest

from keras_tfm.errors import DataError, InputError
from keras_tfm.training import TrainingConfig, train, training_config
from keras_tfm.training.cli import recipe_parser
from tests.recipes.helpers import _args, _config, recipe


@pytest.mark.backend_independent
def test_model_overrides_are_checked_against_the_model_class(tmp_path):
    import keras_tfm
    from keras_tfm.training import build_model

    sizes = {"vit_tiny": keras_tfm.vit_tiny, "transformer_small": keras_tfm.transformer_small}
    args = _args(tmp_path, model="vit_tiny", num_layers=2, hidden_dim=48)
    model = build_model(sizes, args, num_classes=3)
    assert (model.num_layers, model.hidden_dim, model.num_heads, model.num_classes) == (2, 48, 3, 3)
    args = _args(tmp_path, model="vit_tiny", max_length=16)
    with pytest.raises(InputError, match="^max_length: vit_tiny has no such setting"):
        build_model(sizes, args)
    args = _args(tmp_path, model="transformer_small", num_layers=2)
    with pytest.raises(InputError, match="^num_layers: transformer_small has no such setting"):
        build_model(sizes, args, source_vocabulary_size=10)


@pytest.mark.backend_independent
def test_lora_flags_need_pretrained_weights(tmp_path):
    """Refused before anything is built: LoRA of random weights would fine-tune nothing worth keeping."""
    with pytest.raises(
        InputError,
        match="^lora_rank: LoRA fine-tunes pretrained weights, and this run trains a model from scratch; use it "
        "with a `from_huggingface` checkpoint",
    ):
        train(
            _config(tmp_path, lora_rank=4),
            build_model=None,
            train_batch=None,
            steps_per_pass=1,
            validation_data=(),
            loss=None,
        )
    with pytest.raises(InputError, match="^lora_alpha: it scales LoRA's updates; give `lora_rank` too"):
        _config(tmp_path, lora_alpha=16.0)


@pytest.mark.backend_independent
def test_the_command_line_shows_library_arguments_as_its_flags(capsys):
    """A library error names Python arguments; a recipe's command line prints the same error with its flags."""
    from keras_tfm.training import run_main

    parser = recipe_parser("test", {}, "tiny", "runs/x")
    parser.add_argument("--tokenizer")
    parser.aliases["kind"] = "tokenizer"

    def main():  # as a recipe's: parses its flags, then calls the library
        parser.parse_args([])
        raise DataError("give `kind` bpe, or another `output_dir`; `unknown` stays as it is.", argument="kind")

    with pytest.raises(SystemExit) as exit_status:
        run_main(main)
    assert exit_status.value.code == 2
    assert capsys.readouterr().err == (
        "error: --tokenizer: give --tokenizer bpe, or another --output-dir; `unknown` stays as it is.\n"
    )
    assert str(DataError("no such file.", argument="data")) == "data: no such file."  # Python callers


@pytest.mark.backend_independent
def test_numeric_flags_are_checked_when_read():
    from keras_tfm.training import FRACTION, POSITIVE, number

    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--count", type=POSITIVE)
    parser.add_argument("--rate", type=FRACTION)
    parser.add_argument("--learning-rate", type=number(0.0))  # 0: evaluate a checkpoint unchanged
    parser.add_argument("--mask-rate", type=number(0.0, 1.0, above_minimum=True))
    assert vars(parser.parse_args(["--count", "1", "--rate", "0", "--learning-rate", "0", "--mask-rate", "1"])) == dict(
        count=1, rate=0.0, learning_rate=0.0, mask_rate=1.0
    )
    for flag, value, expected in [
        ("--count", "0", "an integer >= 1"),
        ("--count", "2.5", "an integer >= 1"),
        ("--rate", "1", r"a number in \[0, 1\)"),
        ("--rate", "-0.1", r"a number in \[0, 1\)"),
        ("--learning-rate", "-1", "a number >= 0"),
        ("--learning-rate", "inf", "a number >= 0"),
        ("--learning-rate", "nan", "a number >= 0"),
        ("--mask-rate", "0", r"a number in \(0, 1\]"),
    ]:
        with pytest.raises(argparse.ArgumentError, match=f"expected {expected}; got '{value}'"):
            parser.parse_args([flag, value])


@pytest.mark.parametrize(
    "script, flags, message",
    [
        ("gpt_lm.py", ["--model", "gpt_huge"], "--model: expected one of gpt_shakespeare_char_cpu, .* got 'gpt_huge'"),
        (
            "gpt_lm.py",
            ["--data", "/nonexistent/input.txt"],
            "--data: expected a text file .* nothing is at '/nonexistent/input.txt'",
        ),
        # before pretraining, not after it
        ("bert_mlm.py", ["--finetune", "/nonexistent.zip"], "--finetune: expected a zip archive .* nothing is at"),
        # each was a traceback (NumPy's "need at least one array to stack"; the block's build), or trained on to NaN
        ("gpt_lm.py", ["--batch-size", "0"], "argument --batch-size: expected an integer >= 1; got '0'"),
        ("vit.py", ["--mixup", "-1"], "argument --mixup: expected a number >= 0; got '-1'"),
        (
            "gpt_lm.py",
            ["--num-heads", "5"],
            "--model: gpt_shakespeare_char_cpu: GPT: hidden_dim must be a multiple of num_heads; received hidden_dim=128, "
            "num_heads=5",
        ),
        # LoRA on BERT's pretraining would fine-tune random weights (see also test_lora_flags_need_pretrained_weights)
        ("bert_mlm.py", ["--lora-rank", "4"], "--lora-rank: LoRA fine-tunes pretrained weights: give --finetune PATH"),
        # was overridden by --sequence-length without a word
        (
            "bert_mlm.py",
            ["--max-length", "4"],
            "--max-length: the model's positions must hold a sequence of --sequence-length 128; got 4",
        ),
        ("gpt_lm.py", ["--data", "{tmp}/labels.gz"], "--data: '.*labels.gz' looks binary, not text"),
        # a traceback, where checkpoints could not have been written
        ("vit.py", ["--output-dir", "{tmp}/short.txt/run"], "--output-dir: cannot write to '.*short.txt/run'"),
        # refused after the tokenizer is fitted, but before it is written: a rerun must not reuse it
        (
            "gpt_lm.py",
            ["--data", "{tmp}/short.txt"],
            "--data: the training text has 11 tokens, fewer than one window of 65",
        ),
        ("bert_mlm.py", ["--num-heads", "3"], "--model: bert_mini: .*hidden_dim must be a multiple of num_heads"),
        (
            "translator.py",
            ["--num-heads", "3", "--vocabulary-size", "100"],
            "--model: transformer_small: .*hidden_dim must be a multiple of num_heads",
        ),
    ],
)
@pytest.mark.backend_independent
def test_recipe_bad_flags_fail_in_one_clear_line(tmp_path, script, flags, message):
    import re

    (tmp_path / "short.txt").write_text("to be or not\n")
    with gzip.open(tmp_path / "labels.gz", "wb") as file:  # an IDX file of labels, as Fashion-MNIST's
        file.write(bytes([0, 0, 8, 1, 0, 0, 0, 100]) + bytes(i % 10 for i in range(100)))
    flags = [flag.replace("{tmp}", str(tmp_path)) for flag in flags]
    done = recipe(script, "--output-dir", str(tmp_path / "run"), *flags, timeout=120)
    assert done.returncode == 2
    assert re.search(message, done.stderr), done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("*.json"))  # nothing lasting written: no tokenizer, no checkpoint
    assert not (tmp_path / "run").exists()  # nor the run's directory


@pytest.mark.backend_independent
def test_checkpoint_config_refuses_what_a_checkpoint_fixes(tmp_path):
    from keras_tfm.training import checkpoint_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 64}))
    args = argparse.Namespace(
        from_huggingface=str(tmp_path),
        model="small",
        num_layers=None,
        num_heads=None,
        hidden_dim=None,
        intermediate_dim=None,
        dropout=None,
        max_length=32,
        tokenizer="char",
    )
    with pytest.raises(
        InputError, match="^max_length: `from_huggingface` takes the model from the checkpoint; leave `max_length` out"
    ):
        checkpoint_config(args, "gpt2", {"model": "small"}, "takes the model from the checkpoint")
    with pytest.raises(InputError, match="^tokenizer: `from_huggingface` reason; leave `tokenizer` out"):
        checkpoint_config(args, "gpt2", {"tokenizer": "bpe"}, "reason", keep=("max_length",))
    with pytest.raises(DataError, match="expected a vit checkpoint; .* holds a 'gpt2' model"):
        checkpoint_config(args, "vit", {}, "reason", keep=("max_length",))
    with pytest.raises(DataError, match="^from_huggingface: there is no directory"):
        checkpoint_config(
            argparse.Namespace(**{**vars(args), "from_huggingface": str(tmp_path / "none")}),
            "gpt2",
            {},
            "reason",
            keep=("max_length",),
        )
    checkpoint = checkpoint_config(args, "gpt2", {"model": "small"}, "reason", keep=("max_length",))
    assert (checkpoint.config["n_positions"], checkpoint.directory, checkpoint.adapter) == (64, str(tmp_path), None)
    config = training_config(argparse.Namespace(**vars(args), output_dir=str(tmp_path)), checkpoint)
    assert config.model_name == f"from_huggingface {tmp_path}"
    assert args.model == "small"  # the flags are left as given


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"batch_size": 0}, "batch_size: expected an integer >= 1; got 0"),
        ({"epochs": 2.5}, "epochs: expected an integer >= 1; got 2.5"),
        ({"steps": True}, "steps: expected an integer >= 1 or None; got True"),
        ({"warmup_steps": -1}, "warmup_steps: expected an integer >= 0 or None; got -1"),
        ({"seed": "0"}, "seed: expected an integer; got '0'"),
        ({"learning_rate": float("nan")}, "learning_rate: expected a number >= 0; got nan"),
        ({"weight_decay": -0.1}, "weight_decay: expected a number >= 0; got -0.1"),
        ({"clip_norm": float("inf")}, "clip_norm: expected a number >= 0; got inf"),
        ({"lora_rank": 4, "lora_alpha": 0.0}, "lora_alpha: expected a number > 0; got 0.0"),
        (
            {"precision": "float16"},
            "precision: expected one of auto, float32, mixed_bfloat16, mixed_float16; got 'float16'",
        ),
        ({"jit_compile": True}, "jit_compile: expected one of auto, on, off; got True"),
        ({"distribute": "pipeline"}, "distribute: expected one of none, data, model; got 'pipeline'"),
        ({"verbose": 3}, "verbose: expected 0, 1, 2 or None; got 3"),
        ({"remat": "yes"}, "remat: expected True or False; got 'yes'"),
        ({"output_dir": ""}, "output_dir: expected a directory path; got ''"),
    ],
)
def test_training_config_refuses_bad_settings_by_name(changes, message):
    """Settings are checked when the config is made, before anything is built or written."""
    with pytest.raises(InputError, match="^" + re.escape(message) + "[.]$") as caught:
        TrainingConfig(**{"output_dir": "runs/x", **changes})
    assert caught.value.argument == message.split(":")[0]
    config = TrainingConfig("runs/x", epochs=np.int64(2), learning_rate=np.float32(0.5))  # NumPy numbers are numbers
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 3


@pytest.mark.backend_independent
def test_runs_without_an_output_dir_get_one_of_their_data_model_and_settings():
    """The same command finds its directory again (to resume); another data set, model or setting, or
    another recipe, gets its own, named by the data and the model."""
    from tests.recipes.helpers import recipe_function

    def output_dir(name, *flags):
        sizes = recipe_function(name, "model_sizes")()
        return recipe_function(name, "flags")(sizes).parse_args(list(flags)).output_dir

    shakespeare = output_dir("gpt_lm.py", "--data", "../shared/data/tinyshakespeare/input.txt")
    assert re.fullmatch(r"runs/gpt_lm/input-gpt_shakespeare_char_cpu-[0-9a-f]{6}", shakespeare)
    assert output_dir("gpt_lm.py", "--data", "../shared/data/tinyshakespeare/input.txt") == shakespeare
    assert (
        output_dir("gpt_lm.py", "--data", "../shared/data/tinyshakespeare/input.txt", "--prompt", "To") == shakespeare
    )
    others = {
        output_dir("gpt_lm.py"),
        output_dir("gpt_lm.py", "--data", "../shared/data/tinyshakespeare/input.txt", "--batch-size", "8"),
        output_dir("gpt_lm.py", "--data", "../shared/data/tinyshakespeare/input.txt", "--model", "gpt2_small"),
        output_dir("vit.py"),
        output_dir("gpt_lm.py", "--output-dir", "mine"),
    }
    assert len(others | {shakespeare}) == 6 and "mine" in others
    assert re.fullmatch(r"runs/gpt_lm/default-gpt_shakespeare_char_cpu-[0-9a-f]{6}", output_dir("gpt_lm.py"))
    from keras_tfm.training.recording import data_name  # the learning curves' title names the data too

    assert data_name({"data": "../shared/data/tinyshakespeare/input.txt"}) == "input.txt"
    assert data_name({"dataset": "tiny_shakespeare"}) == "tiny_shakespeare"
    assert data_name({"data": None}) == "the built-in data"
