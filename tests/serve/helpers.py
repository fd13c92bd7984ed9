"""What the server's tests share: a server on a free port of localhost, and small readers of its answers."""

from __future__ import annotations

import socket
import threading
import time

import pytest

uvicorn = pytest.importorskip("uvicorn")

MESSAGES = [{"role": "user", "content": "speak"}]


class Server:
    """`create_app(model, ...)` on uvicorn, on a free port of localhost, in a thread."""

    def __init__(self, model, name: str = "tiny", port: int | None = None, **settings):
        from keras_tfm.serve import create_app
        from keras_tfm.serve.__main__ import _draining_server

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port or 0))
            self.port = probe.getsockname()[1]
        self.app = create_app(model, name, **settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = _draining_server()(config)  # the command's: a shutdown answers those waiting at once
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


def answer_of(messages) -> dict:
    return dict(model="tiny", messages=messages, max_tokens=8, temperature=0)


def slowed(engine, monkeypatch, seconds: float) -> None:
    """Every chunk of the engine's decoding takes `seconds` longer."""
    advance = engine._advance

    def slow_advance():
        time.sleep(seconds)
        advance()

    monkeypatch.setattr(engine, "_advance", slow_advance)


@pytest.mark.backend_independent
def accumulated(deltas: list[dict]) -> tuple[str, list[tuple]]:
    """A streamed message's content and its calls `(id, name, arguments)`, put together as clients do."""
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content") or ""
        for call in delta.get("tool_calls") or ():
            entry = calls.setdefault(call["index"], ["", "", ""])
            function = call.get("function") or {}
            entry[0] += call.get("id") or ""
            entry[1] += function.get("name") or ""
            entry[2] += function.get("arguments") or ""
    return content, [tuple(calls[index]) for index in sorted(calls)]
