"""Quiet backends: TensorFlow's start-up logging kept off the user's terminal unless asked for.

Importing TensorFlow (which Keras does for the tensorflow backend, and to seed it or read data on the
others) prints a dozen lines from its native libraries (oneDNN, CUDA drivers not found, CPU
instructions, XLA service) that say nothing is wrong. Some are written before TensorFlow reads
`TF_CPP_MIN_LOG_LEVEL`, so the variable alone (set to 3 unless the user set it) cannot hide them: the first import of `tensorflow` runs
with the process's standard error captured, and every captured line that is not one of those known
notices is written back. `KERAS_TFM_BACKEND_LOGS=1` (or a `TF_CPP_MIN_LOG_LEVEL` of the user's own)
shows everything.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile

# Native log lines that report the machine, not a problem: absl's INFO/WARNING records, its note
# about records before its initialization, TensorFlow's CPU-instruction advice, and the failed CUDA
# initialization of a GPU build on a machine without a GPU.
NOTICES = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called|[IW]\d{4} \d\d:\d\d:\d\d"
    r"|To enable the following instructions:|E\d{4} .*(cuInit|cuda_platform|cuda_dnn|cuda_blas|cuda_fft))"
)


def showing_everything() -> bool:
    """Whether the user asked for the backends' own logging."""
    asked = os.environ.get("KERAS_TFM_BACKEND_LOGS", "") not in ("", "0")
    return asked or os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0"


@contextlib.contextmanager
def native_notices_filtered():
    """Captures what native code writes to file descriptor 2 inside the block, then writes back every
    line but the known notices. A file, not a pipe: nothing blocks however much is written."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not NOTICES.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` once, for whoever imports it first, and imports it with the notices filtered."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):  # only an import runs it; `importlib.util.find_spec` probes do not
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            with native_notices_filtered():
                execute(module)
                # The CUDA platform is initialized at the first device query: its notice comes now.
                module.config.list_physical_devices("GPU")

        spec.loader.exec_module = exec_module
        return spec


def quiet_tensorflow() -> None:
    """Hides TensorFlow's start-up notices from here on (see the module's description); call it before
    anything imports TensorFlow. Where TensorFlow was imported already (`import keras` first, on its
    backend), its import's lines are written, but the CUDA notice of the first operation is still hidden.
    Does nothing if the user asked for logs."""
    if showing_everything():
        return
    if "tensorflow" in sys.modules:
        with native_notices_filtered():  # the device query the first operation would make, now
            sys.modules["tensorflow"].config.list_physical_devices("GPU")
        return
    # Records after start-up too: TensorFlow's native errors that matter reach Python as exceptions
    # with the same message, the rest are notices at the ERROR level (oneDNN's fallback for int64, ...);
    # FATAL records, which precede a crash, still show.
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    if level is None or (level == "1" and "jax" in sys.modules):  # JAX sets 1 when it is imported
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if not any(isinstance(finder, _QuietTensorFlow) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())


quiet_tensorflow()
