import os

# The suite's models are tiny, so XLA's time goes to compiling, not running: LLVM's optimisation passes
# cost more than they save (JAX's model and layer tests take a quarter less time without them). Set
# before Keras loads a backend; recipe subprocesses inherit it.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
# No test reaches the network: Hugging Face Hub ids are read from a local cache only (huggingface_hub reads
# this when it is imported).
os.environ["HF_HUB_OFFLINE"] = "1"

import keras
import numpy as np
import pytest


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {keras.backend.backend()}"


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def rng():
    return np.random.default_rng(0)
