"""Ctrl-C while a reply streams: noted, and acted on between pieces.

Python raises `KeyboardInterrupt` wherever the main thread happens to be when the signal arrives; inside
a garbage-collection callback (JAX registers one) it is printed as "Exception ignored" and lost, and the
reply goes on. While a reply streams, Ctrl-C only sets a flag that the writing loop reads after each
piece; a second Ctrl-C raises at once, for a step that takes long to reach its next piece.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def ctrl_c_between_pieces() -> Iterator[list]:
    """Yields a list that a Ctrl-C appends to (empty: not pressed); a second Ctrl-C raises
    `KeyboardInterrupt`. Off the main thread, where no signal handler can be set, it stays empty."""
    pressed: list = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return

    def note(signum, frame):
        pressed.append(signum)
        if len(pressed) > 1:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def pieces_until_ctrl_c(pieces: Iterable[str]) -> Iterator[str]:
    """`pieces` as they come; after the piece during which Ctrl-C was pressed, `KeyboardInterrupt`."""
    with ctrl_c_between_pieces() as pressed:
        for piece in pieces:
            yield piece
            if pressed:
                raise KeyboardInterrupt
