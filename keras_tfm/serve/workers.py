"""The server's worker threads (the decoding engine's, the embedding batcher's), closed before the
interpreter ends. A daemon thread still running at exit is stopped wherever it is: inside the runtime's
C++ (a JAX array being freed after the last chunk) that aborts the process ("terminate called after
throwing an instance of ..."). `create_app`'s lifespan closes its worker; this covers an engine made
without one, in a user's own process."""

from __future__ import annotations

import atexit
import weakref

_OPEN: weakref.WeakSet = weakref.WeakSet()


def close_at_exit(worker) -> None:
    """Has `worker.close()` (it must stop the worker's thread and may be called again) run at exit."""
    _OPEN.add(worker)


@atexit.register
def close_open_workers() -> None:
    for worker in list(_OPEN):
        worker.close()
