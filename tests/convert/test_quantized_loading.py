"""`from_huggingface(..., quantize=...)`: the model `model.quantize(...)` makes after a float load, built
quantized from the start (its peak memory: tests/convert/test_loading_memory.py)."""

import numpy as np
import pytest

import keras_tfm
from keras_tfm.convert import quantized_loading
from keras_tfm.errors import InputError
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def llama_directory(tmp_path_factory, tied: bool):
    directory = tmp_path_factory.mktemp("llama")
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


# int8 with a separate lm_head (a Dense); int4 with the head tied to the token embedding (its reverse)
@pytest.mark.parametrize("mode, tied", [("int8", False), ("int4", True)])
def test_quantizing_while_loading_gives_what_quantize_after_loading_gives(tmp_path_factory, monkeypatch, mode, tied):
    directory = llama_directory(tmp_path_factory, tied)
    after = keras_tfm.from_huggingface(str(directory))
    after.quantize(mode)
    # 40 channels of 64 float32 inputs a block: the key/value layers (32 outputs) whole, the embedding and
    # the head (100 rows) in blocks of 40, 40 and 20
    monkeypatch.setattr(quantized_loading, "BLOCK_BYTES", 40 * 64 * 4)
    loaded = keras_tfm.from_huggingface(str(directory), quantize=mode)
    expected = {w.path.split("/", 1)[1]: w for w in after.weights}
    received = {w.path.split("/", 1)[1]: w for w in loaded.weights}
    assert sorted(received) == sorted(expected) and len(received) == len(after.weights)
    for path, weight in expected.items():
        assert received[path].dtype == weight.dtype, path
        np.testing.assert_array_equal(to_numpy(received[path]), to_numpy(weight), err_msg=path)
    assert sum(w.dtype == "int8" for w in loaded.weights) >= 1 + 7 * 2  # the embedding and every dense layer
    ids = np.array([[1, 5, 9, 13, 22]])
    np.testing.assert_array_equal(to_numpy(loaded(ids)), to_numpy(after(ids)))


@pytest.mark.backend_independent
def test_quantize_refuses_a_mode_it_has_not_and_new_float_weights(tmp_path_factory):
    directory = llama_directory(tmp_path_factory, tied=True)
    with pytest.raises(InputError, match=r"expected None or one of int8, int4; received 'int2'") as error:
        keras_tfm.from_huggingface(str(directory), quantize="int2")
    assert error.value.argument == "quantize"
    with pytest.raises(InputError, match=r"quantize='int8' with num_classes: a new head .* float weights to train"):
        keras_tfm.from_huggingface(str(directory), quantize="int8", num_classes=3)
