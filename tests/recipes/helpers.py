"""What the recipe and training tests share: paths of the shared data, small model flags, running a
recipe as its command line does, small checkpoints."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_tfm.training import TrainingConfig, training_config
from keras_tfm.training.cli import MODEL_OVERRIDES, recipe_parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


SHAKESPEARE = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare", "input.txt")


MOVIE_REVIEWS = os.path.join(ROOT, "..", "shared", "data", "movie_reviews", "movie_reviews.zip")


MULTI30K = os.path.join(ROOT, "..", "shared", "data", "multi30k", "task1", "raw")


BACKEND = keras.backend.backend()


TINY_GPT = (
    "--num-layers 1 --num-heads 2 --hidden-dim 32 --max-length 32 --batch-size 8 --eval-batches 2 --sample-tokens 8 "
    "--verbose 2"
).split()


def recipe(name: str, *flags: str, wait: bool = True, timeout: int = 600, in_process: bool | None = None):
    """Runs `recipes/name` with `flags` as a user would, and returns its exit code and output (a
    `subprocess.CompletedProcess`), or the running process when `wait` is false.

    By default the recipe's `main` runs in this process, under `run_main` as from the command line,
    with `sys.argv` set to the flags and its output captured: that saves each run the seconds Python,
    Keras and the backend take to start. A run that must be its own process (to be killed, or to set
    up virtual devices with `--cpu-devices` before the backend starts) is a subprocess."""
    path = os.path.join(ROOT, "recipes", name)
    command = [sys.executable, path, *flags]
    if in_process is None:
        in_process = wait and "--cpu-devices" not in flags
    if not in_process:
        environment = {**os.environ, "KERAS_BACKEND": BACKEND, "TF_CPP_MIN_LOG_LEVEL": "2"}
        if not wait:
            return subprocess.Popen(
                command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout)
    return _run_recipe_here(name, command)


def _run_recipe_here(name: str, command: list[str]) -> subprocess.CompletedProcess:
    import contextlib
    import io
    import traceback

    from keras_tfm.training import run_main

    main = recipe_function(name, "main")
    stdout, stderr = io.StringIO(), io.StringIO()
    argv, policy = sys.argv, keras.config.dtype_policy()
    sys.argv = command[1:]
    code = 0
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                run_main(main)
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = argv
        keras.config.set_dtype_policy(policy)  # the recipe's --precision is process-wide
        keras.backend.clear_session()
    return subprocess.CompletedProcess(command, code, stdout.getvalue(), stderr.getvalue())


def recipe_function(name: str, function: str):
    """A function of a recipe script, to test its checks in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), os.path.join(ROOT, "recipes", name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def recipe_args(**values) -> argparse.Namespace:
    """The flags a recipe's --from-huggingface checks read: unset model overrides, then `values`."""
    return argparse.Namespace(**{**{name: None for name in MODEL_OVERRIDES}, **values})


def labelled_reviews(directory, per_class: int = 48):
    """A directory of `per_class` movie reviews of each class (the layout --finetune reads): a short run."""
    from keras_tfm.data import load_labelled_text

    texts, labels, class_names = load_labelled_text(MOVIE_REVIEWS)
    for label, name in enumerate(class_names):
        (directory / name).mkdir(parents=True)
        for i in np.flatnonzero(labels == label)[:per_class]:
            (directory / name / f"{i}.txt").write_text(texts[i])
    return directory


def saved_weight(checkpoint_directory, shape) -> np.ndarray:
    """The one model weight of `shape` in the last checkpoint a recipe wrote (optimizer slots left out)."""
    import h5py

    state = json.loads((checkpoint_directory / "state.json").read_text())
    found = []
    with h5py.File(checkpoint_directory / state["weights"]) as saved:
        saved.visititems(
            lambda name, item: (
                found.append(item[()])
                if not name.startswith("optimizer") and getattr(item, "shape", None) == shape
                else None
            )
        )
    assert len(found) == 1, f"{len(found)} weights of shape {shape}"
    return found[0]


@pytest.mark.slow
def _stopped_after(out, flags, steps, signal_number) -> subprocess.Popen:
    """A GPT recipe run in its own process, sent `signal_number` once it has written a checkpoint of at
    least `steps` steps (at an epoch's end or within one)."""
    process = recipe("gpt_lm.py", *flags, "--output-dir", str(out), wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if steps_done(out) >= steps:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be stopped:\n" + process.stdout.read()
    os.kill(process.pid, signal_number)
    process.wait(timeout=120)
    return process


def steps_done(out) -> int:
    """The optimizer steps of the last checkpoint a run in `out` wrote (0 if none)."""
    state_path = out / "checkpoint" / "state.json"
    if not state_path.exists():
        return 0
    state = json.loads(state_path.read_text())
    return state["epoch"] * state["steps_per_epoch"] + state["step"]


def _args(tmp_path, **overrides):
    args = recipe_parser("test", {}, "tiny", "runs").parse_args(["--output-dir", str(tmp_path)])
    args.verbose = 0
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


def _config(tmp_path, **changes) -> TrainingConfig:
    """The recipes' default settings (through their flags), quiet, in `tmp_path`, with `changes`."""
    return training_config(_args(tmp_path), **changes)


class _Interrupted(Exception):
    pass


def _check_vit_written_for_transformers(out, metrics):
    """The recipe's trained ViT as a transformers checkpoint: its weights, the digits' class names, and an
    image processor that prepares raw pixels as the recipe does (scaled to [0, 1])."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import keras_tfm
    from keras_tfm.data import load_images

    assert metrics["huggingface_checkpoint"] == str(out / "huggingface")
    hf, loading = transformers.AutoModelForImageClassification.from_pretrained(
        out / "huggingface", output_loading_info=True
    )
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    assert hf.config.id2label == {i: str(i) for i in range(10)}
    patch_kernel = hf.state_dict()["vit.embeddings.patch_embeddings.projection.weight"].numpy().transpose(2, 3, 1, 0)
    np.testing.assert_allclose(saved_weight(out / "checkpoint", patch_kernel.shape), patch_kernel, atol=1e-6, rtol=0)
    images = load_images(None, None).test[0][:8]
    processor = transformers.AutoImageProcessor.from_pretrained(out / "huggingface")
    with torch.no_grad():
        logits = hf(**processor(list(images), return_tensors="pt")).logits.numpy()
    ours = keras_tfm.from_huggingface(str(out / "huggingface"))(images.astype("float32") / 255)
    np.testing.assert_allclose(logits, keras.ops.convert_to_numpy(ours), atol=1e-4, rtol=0)


def gpt2_checkpoint(tmp_path):
    """A small random GPT-2 checkpoint with a byte-pair tokenizer learned on Shakespeare, in
    tmp_path/checkpoint, and the text in tmp_path/text.txt."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from keras_tfm.data import BytePairTokenizer

    with open(SHAKESPEARE, encoding="utf-8") as file:
        text = file.read()[:100_000]
    (tmp_path / "text.txt").write_text(text)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    learned = BytePairTokenizer.fit(text, 400)
    (checkpoint / "vocab.json").write_text(json.dumps(learned.vocabulary))
    (checkpoint / "merges.txt").write_text("#version: 0.2\n" + "\n".join(learned.merges) + "\n")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=400, n_positions=64, n_embd=32, n_layer=1, n_head=2)
    )
    hf.save_pretrained(str(checkpoint))
    return checkpoint, hf


def short_fine_tuning(checkpoint, tmp_path, out) -> list[str]:
    """gpt_lm.py's flags for two steps of fine-tuning `checkpoint` on tmp_path/text.txt into `out`."""
    return [
        *("--from-huggingface", str(checkpoint), "--data", str(tmp_path / "text.txt"), "--max-length", "32"),
        *("--steps", "2", "--steps-per-epoch", "2", "--batch-size", "8", "--eval-batches", "2"),
        *("--sample-tokens", "8", "--sample-every", "0", "--verbose", "2", "--output-dir", str(out)),
    ]


def llama_family_checkpoint(tmp_path, initializer_range: float = 0.02):
    """A small random Qwen2 checkpoint (query/key/value biases, grouped keys and values) with a
    tokenizer.json learned on Shakespeare in Llama 3's form (byte-level BPE, a begin-of-text token added
    in front), in tmp_path/checkpoint; the text in tmp_path/text.txt."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from tokenizers import ByteLevelBPETokenizer, processors

    with open(SHAKESPEARE, encoding="utf-8") as file:
        text = file.read()[:100_000]
    (tmp_path / "text.txt").write_text(text)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    learner = ByteLevelBPETokenizer()
    learner.train_from_iterator([text], vocab_size=400, special_tokens=["<|begin_of_text|>"], show_progress=False)
    learner.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    learner.save(str(checkpoint / "tokenizer.json"))
    (checkpoint / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>"})
    )
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=400,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
    )
    hf = transformers.Qwen2ForCausalLM(config)
    hf.save_pretrained(str(checkpoint))
    return checkpoint, hf, text
