import atexit
import gc
import os
import shutil
import tempfile

# The suite's models are tiny, so XLA's time goes to compiling, not running: LLVM's optimisation passes
# cost more than they save, and XLA:CPU's MLIR fusion emitters compile three times slower than its
# element-wise ones (tests/models/test_gpt.py on JAX: 50 s of compiling with the first flag alone, 17 s
# with all three; TensorFlow's XLA reads them too). They change how XLA generates code, not what it
# computes. Set before Keras loads a backend; recipe subprocesses inherit them.
os.environ["XLA_FLAGS"] = " ".join(
    [
        os.environ.get("XLA_FLAGS", ""),
        "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true",
        "--xla_cpu_use_fusion_emitters=false",
    ]
).strip()
# JAX keeps what XLA compiles in a cache on disk and reads a program back instead of compiling it again:
# the suite builds the same tiny models in many tests and recipe subprocesses (tests/models/test_gpt.py:
# 17% less CPU on a cold cache). `.ci/test` gives its JAX processes one directory; a plain `pytest`
# gets one of its own, removed at exit. Subprocesses inherit it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="keras_tfm-tests-xla-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# No test reaches the network: Hugging Face Hub ids are read from a local cache only (huggingface_hub reads
# this when it is imported).
os.environ["HF_HUB_OFFLINE"] = "1"

import keras
import numpy as np
import pytest

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    # Grappler, TensorFlow's graph optimizer, rewrites every traced function before its first run: for
    # these tiny models that costs more than it saves (a fifth of tests/models' time). Like the XLA flags
    # above, it changes how a graph runs, not what it computes; the exporters' converters run their own.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {keras.backend.backend()}"


def pytest_collection_modifyitems(config, items):
    """Tests marked `backend_independent` (tokenizers, data readers, flag parsing, BLEU, parameter
    counts) give the same result on every backend. Where KERAS_TFM_BACKEND_INDEPENDENT_ON names a
    backend (`.ci/test` sets it, running one process per backend), only that backend's process runs
    them; a plain `pytest` runs everything."""
    runs_them = os.environ.get("KERAS_TFM_BACKEND_INDEPENDENT_ON")
    if not runs_them or runs_them == keras.backend.backend():
        return
    deselected = [item for item in items if item.get_closest_marker("backend_independent")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("backend_independent")]


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_collection_finish():
    """The modules imported so far (TensorFlow, PyTorch, JAX, transformers: millions of objects) live as long
    as the process: frozen out of the collector, so that each file's full collection below looks at what the
    tests made (0.7 s a collection otherwise, a tenth of the suite's time)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Frees each test file's models and their compiled programs when it ends: `.ci/test` runs six
    suites at once on a 24 GB machine, and JAX keeps every executable of a live jitted function (a
    model's generation loop holds the model, so only a collection frees them)."""
    yield
    gc.collect()
    if keras.backend.backend() == "jax":
        import jax

        jax.clear_caches()
