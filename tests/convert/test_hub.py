"""Checkpoints named by their Hugging Face Hub id, read from a local Hugging Face cache (offline: the
cache is written here in the layout huggingface_hub keeps, as a download would leave it)."""

import argparse
import json

import numpy as np
import pytest

import keras_tfm
from keras_tfm.data import DataError
from keras_tfm.errors import CheckpointError
from keras_tfm.training import checkpoint_config
from tests.checks import to_numpy
from tests.convert.test_gpt2 import hf_gpt2  # the GPT-2 tests' small random model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding models saved with `save_pretrained`, reached offline: returns
    `add(model_id, hf_model, **save_pretrained_arguments)`."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def add(model_id, hf_model, **save_arguments):
        repository = cache / ("models--" + model_id.replace("/", "--"))
        (repository / "refs").mkdir(parents=True)
        (repository / "refs" / "main").write_text(COMMIT)
        hf_model.save_pretrained(str(repository / "snapshots" / COMMIT), **save_arguments)
        return repository / "snapshots" / COMMIT

    return add


@pytest.mark.parametrize("safetensors", [True, False])
def test_a_hub_id_loads_from_the_local_cache(rng, hub_cache, safetensors):
    hf = hf_gpt2()
    hub_cache("tester/tiny-gpt2", hf, safe_serialization=safetensors)
    model = keras_tfm.from_huggingface("tester/tiny-gpt2")
    ids = rng.integers(0, 97, size=(2, 9))
    with torch.no_grad():
        expected = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(to_numpy(model(ids)), expected, atol=1e-4, rtol=0)


def test_image_preprocessing_reads_a_hub_id(hub_cache):
    snapshot = hub_cache(
        "tester/tiny-vit",
        transformers.ViTModel(
            transformers.ViTConfig(
                image_size=32,
                patch_size=8,
                num_hidden_layers=1,
                num_attention_heads=2,
                hidden_size=16,
                intermediate_size=32,
            )
        ),
    )
    transformers.ViTImageProcessor(size={"height": 48, "width": 48}).save_pretrained(str(snapshot))
    side, _ = keras_tfm.convert.image_preprocessing("tester/tiny-vit")
    assert side == 48


def test_ids_that_are_neither_cached_nor_directories_are_named(hub_cache, tmp_path):
    with pytest.raises(
        CheckpointError,
        match="'tester/absent' is neither a local directory nor a Hugging Face "
        "Hub model found in the local cache or on the Hub",
    ):
        keras_tfm.from_huggingface("tester/absent")
    with pytest.raises(CheckpointError, match=r"there is no directory .* \(nor is it a Hugging Face Hub model id\)"):
        keras_tfm.from_huggingface(str(tmp_path / "absent"))  # a path, not an id: the Hub is not asked
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match="is a file; expected a checkpoint directory or a Hugging Face Hub"):
        keras_tfm.from_huggingface(str(tmp_path / "file.txt"))


def test_recipes_take_a_hub_id(hub_cache):
    snapshot = hub_cache("tester/tiny-gpt2", hf_gpt2())
    args = argparse.Namespace(from_huggingface="tester/tiny-gpt2", model="small")
    checkpoint = checkpoint_config(args, "gpt2", {}, "reason")
    assert checkpoint.config["n_layer"] == 2
    assert checkpoint.directory == str(snapshot)  # the tokenizer files are read from there next
    assert (checkpoint.name, checkpoint.base_model_name) == ("tester/tiny-gpt2", "tester/tiny-gpt2")
    with pytest.raises(DataError, match="^from_huggingface: 'tester/absent' is neither"):
        checkpoint_config(argparse.Namespace(from_huggingface="tester/absent", model="small"), "gpt2", {}, "reason")


def test_tokenizers_read_a_hub_id(hub_cache):
    pytest.importorskip("keras_hub")
    from keras_tfm.data import BytePairTokenizer

    snapshot = hub_cache("tester/tiny-gpt2", hf_gpt2())
    learned = BytePairTokenizer.fit("the quick brown fox jumps over the lazy dog. " * 40, 300)
    (snapshot / "vocab.json").write_text(json.dumps(learned.vocabulary))
    (snapshot / "merges.txt").write_text("#version: 0.2\n" + "\n".join(learned.merges) + "\n")
    hf = transformers.GPT2Tokenizer(str(snapshot / "vocab.json"), str(snapshot / "merges.txt"))
    lines = ["the lazy dog jumps", "a quick brown fox."]
    ours = BytePairTokenizer.from_huggingface("tester/tiny-gpt2")
    assert [row.tolist() for row in ours.encode_lines(lines)] == hf(lines)["input_ids"]
    with pytest.raises(DataError, match="^from_huggingface: 'tester/absent' is neither a local directory"):
        BytePairTokenizer.from_huggingface("tester/absent")
