"""`python -m keras_tfm generate`: a prompt continued from the shell, streamed."""

import contextlib
import io
import os
import signal
import subprocess
import sys
import time

import pytest

import keras_tfm
from keras_tfm.cli import generate
from keras_tfm.data import CharacterTokenizer


def saved_language_model(path, max_length: int) -> keras_tfm.DecoderLM:
    """A tiny character-level language model with its tokenizer, saved as a `.keras` file at `path`."""
    model = keras_tfm.DecoderLM(
        vocabulary_size=28, max_length=max_length, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16
    )
    model.tokenizer = CharacterTokenizer.fit("abcdefghijklmnopqrstuvwxyz .")
    model.save(path)
    return model


@pytest.mark.backend_independent
def test_the_command_streams_what_generate_returns(tmp_path):
    model = saved_language_model(tmp_path / "lm.keras", max_length=32)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = generate.main([str(tmp_path / "lm.keras"), "hello", "--max-new-tokens", "9", "--chunk-size", "4"])
    assert status == 0, err.getvalue()
    assert out.getvalue() == model.generate("hello", max_new_tokens=9) + "\n"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = generate.main([str(tmp_path / "lm.keras"), "hello", "--max-new-tokens", "0"])
    assert status == 2 and "error: " in err.getvalue() and "--max-new-tokens" in err.getvalue()


@pytest.mark.backend_independent
def test_ctrl_c_ends_the_command_with_one_line_and_status_130(tmp_path):
    saved_language_model(tmp_path / "lm.keras", max_length=4096)
    command = [sys.executable, "-m", "keras_tfm", "generate", str(tmp_path / "lm.keras"), "hello"]
    command += ["--max-new-tokens", "4000", "--chunk-size", "1"]
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    assert run.stdout.read(5) == "hello"  # the model is loaded and the reply streams
    time.sleep(0.5)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted (Ctrl-C)."
