"""Every layer together: jit-compiled learning, mixed precision, and `.keras` files across backends."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_tfm import layers
from tests.checks import all_layers_model, to_numpy

BACKENDS = ["tensorflow", "jax", "torch"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def copy_task(rng, n=64, vocabulary_size=50, length=8):
    ids = rng.integers(1, vocabulary_size, size=(n, length)).astype("int32")
    ids[: n // 2, -2:] = 0  # some padding, so the masks are exercised
    images = rng.normal(size=(n, 16, 16, 3)).astype("float32")
    return {"ids": ids, "images": images}, ids


@pytest.mark.slow
def test_jit_compiled_fit_drives_loss_down(rng):
    """Learning to copy the input tokens: an untrained model is near ln(50) = 3.9 nats.

    XLA on JAX and TensorFlow. On PyTorch, Keras' jit_compile means torch.compile, which the runtime
    does not use (it recompiles at every layer boundary: 160 s here for this model, then steps slower
    than eager), so PyTorch trains eagerly as the recipes do. Gradients clipped to norm 1, as the
    recipes do: without it Adam at this rate spiked in the last epochs on JAX (0.15 -> 0.53 after the
    attention there moved to the einsum path, seed unchanged)."""
    inputs, targets = copy_task(rng)
    model = all_layers_model()
    model.compile(
        optimizer=keras.optimizers.Adam(5e-3, clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=keras.backend.backend() != "torch",
    )
    before = {w.path: to_numpy(w).copy() for w in model.trainable_weights}
    history = model.fit(inputs, targets, epochs=34, batch_size=16, verbose=0)
    losses = history.history["loss"]
    assert losses[0] > 3.0
    assert losses[-1] < 0.5, losses
    unmoved = [w.path for w in model.trainable_weights if np.array_equal(to_numpy(w), before[w.path])]
    assert len(before) > 50 and not unmoved  # every layer's weights train (each layer's own checks do not fit)


def test_mixed_precision_training_runs(rng):
    """float16 with loss scaling, every layer. Each layer's (and model's) bfloat16 and float16 outputs: the
    common checks; training under bfloat16: `tests/layers/test_remat.py` (a GPT, with and without remat)."""
    policy = "mixed_float16"
    keras.config.set_dtype_policy(policy)
    inputs, targets = copy_task(rng, n=16)
    model = all_layers_model()
    assert model.output.dtype == keras.DTypePolicy(policy).compute_dtype
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(inputs, targets, epochs=2, batch_size=8, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


LOAD_ON_OTHER_BACKEND = """
import sys, numpy as np, keras
import keras_tfm
data = np.load(sys.argv[1] + "/io.npz")
model = keras.saving.load_model(sys.argv[1] + "/model.keras")
out = keras.ops.convert_to_numpy(model({"ids": data["ids"], "images": data["images"]}))
print(keras.backend.backend(), np.abs(out - data["out"]).max())
np.testing.assert_allclose(out, data["out"], atol=1e-4)
"""


def test_keras_file_saved_here_loads_on_the_next_backend(rng, tmp_path):
    this = keras.backend.backend()
    other = BACKENDS[(BACKENDS.index(this) + 1) % 3]
    inputs, _ = copy_task(rng, n=4)
    model = all_layers_model()
    out = to_numpy(model(inputs))
    model.save(tmp_path / "model.keras")
    np.savez(tmp_path / "io.npz", out=out, **inputs)
    env = dict(os.environ, KERAS_BACKEND=other, PYTHONPATH=REPO)
    result = subprocess.run(
        [sys.executable, "-c", LOAD_ON_OTHER_BACKEND, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.startswith(other)


def test_a_quantized_model_of_every_layer_keeps_its_outputs_and_its_keras_file_loads_again(rng, tmp_path):
    # int8 here; int4, whose own settings must come back too: tests/models/test_base.py (GPT)
    inputs, _ = copy_task(rng, n=4)
    model = all_layers_model()
    expected = to_numpy(model(inputs))
    with layers.quantization.one_garbage_collection():  # Keras' own collects after each kernel: 40 s here
        model.quantize("int8")
    embedding = next(layer for layer in model.layers if isinstance(layer, layers.TokenEmbedding))
    assert embedding.quantization_mode == "int8"  # Keras quantizes no subclass of its embeddings by itself
    out = to_numpy(model(inputs))
    assert np.abs(out - expected).max() <= 0.1 * np.abs(expected).max()
    # each block names its quantized sub-layers in its config: before, they came back as float layers
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert sum(layer.quantization_mode == "int8" for layer in loaded._flatten_layers()) == sum(
        layer.quantization_mode == "int8" for layer in model._flatten_layers()
    )
    np.testing.assert_allclose(to_numpy(loaded(inputs)), out, atol=1e-6)
