"""LoRA fine-tuning (`Model.enable_lora`): what is frozen, what trains, how it saves and loads, and its errors."""

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import CheckpointError
from keras_tfm.models.lora import enable_lora
from tests.checks import to_numpy

SMALL_GPT = dict(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_length=16)


def small_gpt(seed: int = 0, **overrides):
    """A GPT with token vectors of a trained model's scale: with the initial ones (standard deviation
    0.02) the frozen tied output layer would keep every logit near zero, whatever LoRA learns."""
    keras.utils.set_random_seed(seed)
    model = keras_tfm.GPT(**{**SMALL_GPT, **overrides})
    model.build()
    embeddings = model.token_embedding.embeddings
    embeddings.assign(np.random.default_rng(seed).normal(scale=0.5, size=embeddings.shape).astype("float32"))
    return model


def lora_paths(model) -> set:
    return {w.path.split("/", 1)[1] for w in model.trainable_weights}


def test_lora_starts_where_the_model_was_and_trains_only_its_pairs(rng):
    model = small_gpt()
    ids = rng.integers(0, 50, size=(4, 16))
    before = to_numpy(model(ids))
    frozen = {w.path: to_numpy(w) for w in model.weights}
    model.enable_lora(4)
    np.testing.assert_array_equal(to_numpy(model(ids)), before)  # B starts at zero
    assert lora_paths(model) == {
        f"block_{i}/self_attention/{name}/lora_kernel_{part}"
        for i in range(2)
        for name in ("query", "value")
        for part in "ab"
    }
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == 2 * 2 * (16 * 4 + 4 * 16)
    model.compile(optimizer=keras.optimizers.AdamW(3e-2), loss=keras_tfm.TokenCrossEntropy())
    history = model.fit(ids[:, :-1], ids[:, 1:], epochs=20, batch_size=4, verbose=0).history["loss"]
    assert history[-1] < history[0] - 0.5
    for weight in model.weights:
        if "lora_kernel" not in weight.path and weight.path in frozen:
            np.testing.assert_array_equal(to_numpy(weight), frozen[weight.path], err_msg=weight.path)
    assert np.abs(to_numpy(model.layers[3].self_attention.query_dense.lora_kernel_b)).max() > 0


def test_heads_made_for_the_task_stay_trained():
    small = dict(hidden_dim=16, num_heads=2, intermediate_dim=32)  # the layers' names, not their sizes, matter here
    vit = keras_tfm.vit_tiny(num_classes=3, image_size=16, patch_size=8, num_layers=1, **small)
    vit.enable_lora(2)
    assert {p for p in lora_paths(vit) if "lora" not in p} == {"head/kernel", "head/bias"}
    features = keras_tfm.vit_tiny(image_size=16, patch_size=8, num_layers=1, include_top=False, **small)
    features.enable_lora(2)  # no head: nothing more to train
    assert all("lora_kernel" in p for p in lora_paths(features))
    classifier = keras_tfm.bert_tiny(head="classifier", num_classes=2, num_layers=1, vocabulary_size=40, **small)
    classifier.enable_lora(2, trainable_layer_names=["classifier", "transform"])  # the head's Dense, its pooler
    trained = {p.rsplit("/", 1)[0] for p in lora_paths(classifier) if "lora" not in p}
    assert trained == {"head/classifier", "head/transform/dense"}
    translator = keras_tfm.transformer_small(
        source_vocabulary_size=30, target_vocabulary_size=30, num_encoder_layers=1, num_decoder_layers=1, **small
    )
    translator.enable_lora(
        2, target_layer_names=["query", "key", "value", "self_attention/output", "cross_attention/output"]
    )
    assert {p.split("/")[1] for p in lora_paths(translator)} == {"self_attention", "cross_attention"}
    assert len(lora_paths(translator)) == 3 * 4 * 2  # not the feed-forward's "output"


def test_saved_model_merges_the_pairs_and_lora_files_hold_only_them(tmp_path, rng):
    model = small_gpt()
    model.enable_lora(2, lora_alpha=4)
    for weight in model.trainable_weights:  # as after training
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    ids = rng.integers(0, 50, size=(2, 16))
    expected = to_numpy(model(ids))

    model.save(tmp_path / "merged.keras")
    merged = keras.saving.load_model(tmp_path / "merged.keras")
    np.testing.assert_allclose(to_numpy(merged(ids)), expected, atol=1e-5, rtol=0)
    assert not any("lora" in w.path for w in merged.weights) and len(merged.trainable_weights) == len(merged.weights)

    model.save_lora_weights(tmp_path / "pairs.npz")
    assert (tmp_path / "pairs.npz").stat().st_size < 20_000
    fresh = small_gpt()  # the same base weights (seed 0)
    assert np.abs(to_numpy(fresh(ids)) - expected).max() > 1e-2
    fresh.load_lora_weights(tmp_path / "pairs.npz")  # enables rank-2 LoRA (alpha 4) on query and value itself
    np.testing.assert_array_equal(to_numpy(fresh(ids)), expected)

    other_rank = small_gpt()
    other_rank.enable_lora(3)
    with pytest.raises(ValueError, match="rank-2 LoRA pairs for 4 layers; 'gpt' has rank-3"):
        other_rank.load_lora_weights(tmp_path / "pairs.npz")
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="is not a LoRA file written by save_lora_weights"):
        small_gpt().load_lora_weights(tmp_path / "broken.npz")
    with pytest.raises(CheckpointError, match="no file"):
        small_gpt().load_lora_weights(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="must end in '.npz'"):
        model.save_lora_weights(tmp_path / "pairs.h5")


def test_bad_lora_arguments_are_refused_clearly():
    model = small_gpt()
    trained = len(model.trainable_weights)
    with pytest.raises(ValueError, match="rank must be a positive integer; received rank=0"):
        model.enable_lora(0)
    with pytest.raises(
        ValueError,
        match="target_layer_names names no Dense layer of 'gpt': \\['qkv'\\]; "
        "its Dense layers are named \\['intermediate', 'key', 'output', 'query', 'value'\\] "
        "\\(or by the end of their path",
    ):
        model.enable_lora(2, target_layer_names=["qkv"])
    with pytest.raises(ValueError, match="trainable_layer_names names no layer of 'gpt': \\['head'\\]"):
        model.enable_lora(2, trainable_layer_names=["head"])
    with pytest.raises(ValueError, match="lists of layer names; received a string"):
        model.enable_lora(2, target_layer_names="query")
    assert len(model.trainable_weights) == trained  # the refused calls froze nothing
    with pytest.raises(ValueError, match="has no LoRA layers; call enable_lora"):
        model.save_lora_weights("pairs.npz")
    model.enable_lora(2)
    with pytest.raises(ValueError, match="LoRA is already enabled on 'gpt' \\(rank 2\\)"):
        model.enable_lora(4)
    with pytest.raises(ValueError, match="'unbuilt' is not built yet; build it first"):
        enable_lora(keras_tfm.GPT(**SMALL_GPT, name="unbuilt"), 2)  # the function; the model's method builds first
    unbuilt = keras_tfm.GPT(**SMALL_GPT)
    unbuilt.enable_lora(2)
    assert len(unbuilt.trainable_weights) == 2 * 2 * 2


def test_lora_on_an_int8_model_trains(rng):
    """QLoRA's recipe: quantized frozen kernels, float32 pairs."""
    model = small_gpt()
    model.quantize("int8")
    model.enable_lora(2)
    ids = rng.integers(0, 50, size=(4, 16))
    before = to_numpy(model(ids))
    model.compile(optimizer=keras.optimizers.AdamW(3e-2), loss=keras_tfm.TokenCrossEntropy())
    history = model.fit(ids[:, :-1], ids[:, 1:], epochs=20, batch_size=4, verbose=0).history["loss"]
    assert history[-1] < history[0] - 0.03  # slower than in float32: Keras' int8 layers quantize their inputs too
    assert np.abs(to_numpy(model(ids)) - before).max() > 1e-3
    assert all("lora_kernel" in w.path for w in model.trainable_weights)
