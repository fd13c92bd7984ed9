"""Loading a checkpoint holds the model and little more: no random initial values drawn for weights the
checkpoint replaces, no float32 copy of a bfloat16 tensor, no whole state dict."""

import json
import os
import subprocess
import sys

import keras
import ml_dtypes
import numpy as np
import pytest

from keras_tfm.convert import safetensors_files, variables
from tests.checks import to_numpy

WORKER = """
import gc
import sys
import numpy as np
import keras_tfm
from keras_tfm.convert import safetensors_files, variables
def status(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key)) * 1024
big, tiny = sys.argv[1:3]
keras_tfm.from_huggingface(tiny, dtype="bfloat16")  # what any load allocates once (modules, compiled ops)
keras_tfm.from_huggingface(tiny, dtype="bfloat16", quantize="int8")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from here
baseline = status("VmRSS")
model = keras_tfm.from_huggingface(big, dtype="bfloat16")
rise = status("VmHWM") - baseline
stored = safetensors_files.SafetensorsWeights([big + "/model.safetensors"])["model.embed_tokens.weight"]
same = bool((np.asarray(model.token_embedding.embeddings).view("uint16") == stored.view("uint16")).all())
del model
gc.collect()
variables.return_freed_memory()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
baseline = status("VmRSS")
model = keras_tfm.from_huggingface(big, dtype="bfloat16", quantize="int8")
print(rise, same, status("VmHWM") - baseline, sum(w.dtype == "int8" for w in model.weights), "tensorflow" in sys.modules)
"""


def write_llama(directory, hidden: int, layers: int, vocabulary: int) -> int:
    """A Llama checkpoint of random bfloat16 weights (4x wide feed-forward); returns its weights' bytes."""
    shapes = {"model.embed_tokens.weight": (vocabulary, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,)})
        shapes.update({p + f"self_attn.{n}_proj.weight": (hidden, hidden) for n in "qo"})
        shapes.update({p + f"self_attn.{n}_proj.weight": (hidden // 4, hidden) for n in "kv"})
        shapes.update({p + f"mlp.{n}_proj.weight": (4 * hidden, hidden) for n in ("gate", "up")})
        shapes[p + "mlp.down_proj.weight"] = (hidden, 4 * hidden)
    rng = np.random.default_rng(0)
    arrays = {name: rng.standard_normal(shape, np.float32) * 0.02 for name, shape in shapes.items()}
    safetensors_files.write(arrays, os.path.join(directory, "model.safetensors"), "bfloat16")
    config = dict(
        model_type="llama", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=2, intermediate_size=4 * hidden, vocab_size=vocabulary, tie_word_embeddings=True,
        max_position_embeddings=512, torch_dtype="bfloat16",
    )  # fmt: skip
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return 2 * sum(int(np.prod(shape)) for shape in shapes.values())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process's peak from /proc")
def test_loading_raises_the_peak_memory_by_at_most_1_3x_the_weights(tmp_path):
    (tmp_path / "big").mkdir(), (tmp_path / "tiny").mkdir()
    weights = write_llama(tmp_path / "big", hidden=512, layers=32, vocabulary=1024)  # 233 MB, no tensor over 2 MB
    write_llama(tmp_path / "tiny", hidden=64, layers=1, vocabulary=320)
    environment = {**os.environ, "KERAS_BACKEND": keras.backend.backend()}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(tmp_path / "big"), str(tmp_path / "tiny")],
        capture_output=True, text=True, env=environment, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rise, same, quantized_rise, int8_weights, tensorflow_imported = done.stdout.split()[-5:]
    assert same == "True"  # the checkpoint's bits, not zeros left from the build
    assert int(rise) <= 1.3 * weights, f"the peak rose by {int(rise) / weights:.2f}x the weights"
    # quantized while loading: the int8 model (half the bfloat16 one), one layer in float and what quantizing
    # compiles for each shape (JAX: 0.76x), never the float model (with it the peak would pass 1.5x)
    assert int(int8_weights) == 1 + 7 * 32  # the embedding and every dense layer
    assert int(quantized_rise) <= 0.85 * weights, f"the peak rose by {int(quantized_rise) / weights:.2f}x bfloat16"
    # Keras' get_config would import TensorFlow where installed (+460 MB) to look for its objects
    assert tensorflow_imported == str(keras.backend.backend() == "tensorflow")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process's peak from /proc")
def test_assign_copies_a_large_bfloat16_array_without_a_float32_detour():
    rows, columns = 4100, 8192  # 64 MB of bfloat16: TensorFlow assigns it in slices
    array = (np.arange(rows * columns, dtype=np.float32).reshape(rows, columns) % 251 - 125).astype(ml_dtypes.bfloat16)
    with variables.checkpoint_values():  # as a model is built for its checkpoint
        variable = keras.Variable(initializer="glorot_uniform", shape=(rows, columns), dtype="bfloat16")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        variables.assign(variable, array)
        passing = _status("VmHWM") - _status("VmRSS")  # a zeros variable's pages count once written: not this
    # Keras' own assign widened it to float32 first: twice the array (three times on PyTorch), then freed.
    if keras.backend.backend() != "jax":  # its threads run earlier tests' work late: the peak is not this one's
        assert passing <= 0.3 * array.nbytes, f"assigning needed {passing / array.nbytes:.2f}x the array on the way"
    np.testing.assert_array_equal(to_numpy(variable).astype("float32"), array.astype("float32"))
    for dtype in ("bfloat16", "float32"):  # a checkpoint's (out, in) weight as a kernel: a strided view
        kernel = keras.Variable(np.zeros((columns, rows), dtype), dtype=dtype)
        variables.assign(kernel, array.T)
        np.testing.assert_array_equal(to_numpy(kernel).astype("float32"), array.T.astype("float32"))


def _status(key: str) -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key)) * 1024


def test_a_model_built_for_a_checkpoint_draws_initial_values_only_for_what_it_does_not_replace():
    with variables.checkpoint_values():
        dense = keras.layers.Dense(3, kernel_initializer="ones", bias_initializer=keras.initializers.Constant(7.0))
        dense.build((None, 2))
        assert not to_numpy(dense.kernel).any() and not to_numpy(dense.bias).any()  # zeros: nothing drawn
        variables.assign(dense.kernel, np.full((2, 3), 5.0, "float32"))
    np.testing.assert_array_equal(to_numpy(dense.kernel), np.full((2, 3), 5.0))  # the checkpoint's
    np.testing.assert_array_equal(to_numpy(dense.bias), np.full(3, 7.0))  # never assigned: its initializer's
    with pytest.raises(RuntimeError), variables.checkpoint_values():
        failed = keras.layers.Dense(3, kernel_initializer="ones")
        failed.build((None, 2))
        raise RuntimeError  # a converter that fails: its model is thrown away, nothing more is drawn
    assert not to_numpy(failed.kernel).any()
    fresh = keras.layers.Dense(3, kernel_initializer="ones")  # after the block, Keras initializes as usual
    fresh.build((None, 2))
    assert to_numpy(fresh.kernel).all()
