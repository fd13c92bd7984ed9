"""`python -m keras_tfm generate`: a prompt continued from the shell, streamed."""

import contextlib
import gc
import io
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from keras_tfm.cli import chat, generate, interrupt
from keras_tfm.generation import sliding
from tests.checks import chat_model, saved_language_model


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
    # A shell's background jobs (as CI runs this suite) start with SIGINT ignored, which Python keeps:
    # the command gets the default disposition, as in a terminal.
    run = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert run.stdout.read(5) == "hello"  # the model is loaded
    assert len(run.stdout.read(20)) == 20  # and the reply streams: decoding runs, past its first trace
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130, f"{len(out)} more characters written; standard error: {err[-2000:]!r}"
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted (Ctrl-C)."


@pytest.mark.backend_independent
def test_past_the_context_the_command_crops_it_and_says_so(tmp_path, capsys):
    """On a 32-token model, a 20-token prompt and 40 new tokens: the first 12 are `generate`'s, then the
    window slides; --no-crop-context refuses, as `generate` does."""
    model = saved_language_model(tmp_path / "lm.keras", max_length=32)
    prompt = "to be or not to be that"
    assert generate.main([str(tmp_path / "lm.keras"), prompt, "--max-new-tokens", "40"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("note: the prompt (23 tokens) and 40 new tokens pass the model's context of 32")
    assert len(out) == len(prompt) + 40 + 1
    assert out.startswith(model.generate(prompt, max_new_tokens=9))
    assert generate.main([str(tmp_path / "lm.keras"), prompt, "--max-new-tokens", "40", "--no-crop-context"]) == 2
    assert "--max-new-tokens: prompt length 23 + max_new_tokens 40 exceeds max_length=32" in capsys.readouterr().err
    rounds = list(sliding.windows(list(range(23)), 40, 32))
    assert sum(count for _, count in rounds) == 40 and all(kept + count <= 32 and kept >= 23 for kept, count in rounds)


@pytest.mark.backend_independent
def test_chat_keeps_the_conversation_and_ends_at_end_of_input():
    model = chat_model(max_length=256)
    lines, written = iter(["hello", "", "again"]), []

    def read(prompt):
        written.append(prompt)
        return next(lines)  # StopIteration would end the test: EOFError is the terminal's end of input

    def read_or_end(prompt):
        try:
            return read(prompt)
        except StopIteration:
            raise EOFError from None

    arguments = dict(max_new_tokens=12, chunk_size=4, crop_context=True)
    messages = chat.conversation(model, "be brief", arguments, read=read_or_end, write=written.append)
    first = model.chat(messages[:2], max_new_tokens=12)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == first and messages[4]["content"] == model.chat(messages[:4], max_new_tokens=12)
    assert "".join(written) == f"> {first}\n> > {messages[4]['content']}\n> \n"


@pytest.mark.backend_independent
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux, a terminal to type in")
def test_chat_in_a_terminal_ctrl_c_ends_a_reply_and_ctrl_d_leaves(tmp_path):
    chat_model(max_length=32).save(tmp_path / "chat.keras")
    tmux = ["tmux", "-L", f"keras-tfm-chat-{os.getpid()}"]  # a server of its own, stopped at the end
    command = f"{sys.executable} -m keras_tfm generate {tmp_path / 'chat.keras'} --chat --max-new-tokens 100000"
    command += f" --chunk-size 1; echo exit status $? > {tmp_path / 'status'}"
    subprocess.run([*tmux, "new", "-d", "-x", "200", "-y", "50", command], check=True)

    def screen() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-J", "-S", "-"], capture_output=True, text=True).stdout

    def wait_for(condition, what: str) -> str:
        deadline = time.time() + 90
        while time.time() < deadline:
            if condition(text := screen()):
                return text
            time.sleep(0.2)
        raise AssertionError(f"waited for {what}; the terminal shows:\n{screen()}")

    try:
        wait_for(lambda text: text.startswith(">"), "the first prompt")  # the pane drops trailing spaces
        subprocess.run([*tmux, "send-keys", "hello", "Enter"], check=True)
        wait_for(lambda text: len(text.strip()) > 40, "a long reply")  # it would write 100,000 tokens
        subprocess.run([*tmux, "send-keys", "C-c"], check=True)
        text = wait_for(lambda text: "[stopped]\n>" in text, "the reply to stop and a new prompt")
        assert text.splitlines()[0].startswith("> hello")
        subprocess.run([*tmux, "send-keys", "C-d"], check=True)
        wait_for(lambda text: (tmp_path / "status").exists(), "the command to end")
        assert (tmp_path / "status").read_text().strip() == "exit status 0"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


@pytest.mark.backend_independent
def test_ctrl_c_while_a_reply_streams_is_noted_not_raised_wherever_python_is():
    # a KeyboardInterrupt raised inside a garbage-collection callback (JAX has one) would be lost
    collections, before = [], signal.getsignal(signal.SIGINT)  # SIG_IGN in a shell's background job
    gc.callbacks.append(lambda phase, info: collections.append(phase) or time.sleep(0.01))
    try:
        with interrupt.ctrl_c_between_pieces() as pressed:
            os.kill(os.getpid(), signal.SIGINT)
            gc.collect()
            assert pressed == [signal.SIGINT]  # noted, and nothing raised in the callback
            with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C does not wait for a piece
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
    finally:
        gc.callbacks.pop()
    assert collections and signal.getsignal(signal.SIGINT) is before
