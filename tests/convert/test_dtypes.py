"""Checkpoints in their own dtype: bfloat16 safetensors read one tensor at a time into a model of the dtype
asked for (`from_huggingface(dtype=...)`), and written back in the model's dtype."""

import json

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.convert import safetensors_files
from keras_tfm.errors import CheckpointError, InputError
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IDS = np.array([[1, 5, 9, 13, 22, 40, 7, 3]])


@pytest.fixture(scope="module")
def bfloat16_checkpoint(tmp_path_factory):
    """A small random Llama saved by transformers in bfloat16, in two shards, and its float32 logits."""
    directory = tmp_path_factory.mktemp("bf16")
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    hf.save_pretrained(directory, max_shard_size="100KB")
    with torch.no_grad():
        bfloat16_logits = hf(torch.tensor(IDS)).logits.float().numpy()
        float32_logits = hf.float()(torch.tensor(IDS)).logits.numpy()
    return directory, float32_logits, bfloat16_logits


def test_a_bfloat16_checkpoint_loads_in_the_dtype_asked_for_and_saves_in_its_own(bfloat16_checkpoint, tmp_path):
    directory, float32_logits, bfloat16_logits = bfloat16_checkpoint
    assert len(list(directory.glob("*.safetensors"))) > 1  # shards, read lazily
    widened = keras_tfm.from_huggingface(str(directory))  # float32 by default: the same values, widened
    assert widened.dtype_policy.name == "float32"
    np.testing.assert_allclose(to_numpy(widened(IDS)), float32_logits, atol=1e-4, rtol=0)
    keras.config.set_dtype_policy("mixed_bfloat16")  # as a recipe's --precision mixed sets it
    try:
        mixed = keras_tfm.from_huggingface(str(directory))
    finally:
        keras.config.set_dtype_policy("float32")
    assert mixed.dtype_policy.name == "mixed_bfloat16" and {w.dtype for w in mixed.weights} == {"float32"}

    model = keras_tfm.from_huggingface(str(directory), dtype="auto")  # the checkpoint's own: bfloat16
    assert model.dtype_policy.name == "bfloat16" and {w.dtype for w in model.weights} == {"bfloat16"}
    error = np.abs(to_numpy(model(IDS)).astype("float32") - float32_logits).max()
    their_error = np.abs(bfloat16_logits - float32_logits).max()  # transformers' own bfloat16 rounding
    assert 0 < error < 3 * their_error + 1e-3, (error, their_error)

    keras_tfm.save_huggingface(model, str(tmp_path / "again"))
    assert json.loads((tmp_path / "again" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "again")
    original = transformers.AutoModelForCausalLM.from_pretrained(directory)
    assert again.dtype == torch.bfloat16
    for name, value in original.state_dict().items():  # bfloat16 in, bfloat16 out: every bit kept
        assert torch.equal(again.state_dict()[name], value), name


@pytest.mark.backend_independent
def test_a_bad_dtype_or_a_truncated_file_is_refused_by_name(bfloat16_checkpoint, tmp_path):
    directory, _, _ = bfloat16_checkpoint
    with pytest.raises(
        InputError,
        match=r"expected one of float32, bfloat16, float16, mixed_float16, mixed_bfloat16, auto; received 'int8'",
    ) as error:
        keras_tfm.from_huggingface(str(directory), dtype="int8")
    assert error.value.argument == "dtype"
    shard = sorted(directory.glob("*.safetensors"))[0]
    truncated = tmp_path / "model.safetensors"
    truncated.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(
        CheckpointError, match=r"cannot read '.*model.safetensors': truncated: its tensor '.*' ends at byte"
    ):
        safetensors_files.SafetensorsWeights([str(truncated)])
    assert safetensors_files.checkpoint_dtype([str(shard)]) == "bfloat16"


@pytest.mark.backend_independent
def test_a_checkpoint_larger_than_the_memory_left_is_refused_before_loading(bfloat16_checkpoint, monkeypatch):
    directory, _, _ = bfloat16_checkpoint
    values = safetensors_files.SafetensorsWeights(sorted(map(str, directory.glob("*.safetensors")))).values_count()
    monkeypatch.setattr(safetensors_files, "available_memory", lambda: 3 * values)  # room for bfloat16 only
    with pytest.raises(CheckpointError, match=r"need .* GiB as float32, and this machine has .* dtype='bfloat16'"):
        keras_tfm.from_huggingface(str(directory))
    assert keras_tfm.from_huggingface(str(directory), dtype="bfloat16").dtype_policy.name == "bfloat16"
    monkeypatch.setattr(safetensors_files, "available_memory", lambda: 1.5 * values)  # room for int8 only
    with pytest.raises(CheckpointError, match=r"as bfloat16, .* free some \(or quantize='int8', half of it\)"):
        keras_tfm.from_huggingface(str(directory), dtype="bfloat16")
    assert any(w.dtype == "int8" for w in keras_tfm.from_huggingface(str(directory), quantize="int8").weights)
    monkeypatch.setattr(safetensors_files, "available_memory", lambda: 0.3 * values)
    with pytest.raises(CheckpointError, match=r"as int4") as error:
        keras_tfm.from_huggingface(str(directory), quantize="int4")
    assert error.value.argument == "quantize"
