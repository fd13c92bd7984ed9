"""keras_tfm GPT vs Hugging Face GPT-2 built from small random configurations (no network)."""

import json
import os

import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import CheckpointError
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_gpt2(initializer_range=0.02, **config):
    torch.manual_seed(0)
    defaults = dict(
        n_layer=2,
        n_head=4,
        n_embd=32,
        vocab_size=97,
        n_positions=40,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=initializer_range,
    )
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**defaults, **config})).eval()


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("config", [{}, {"tie_word_embeddings": False}, {"n_inner": 48, "activation_function": "relu"}])
def test_logits_and_parameter_count_match(rng, config):
    hf = hf_gpt2(**config)
    model = keras_tfm.from_huggingface(hf)
    ids = rng.integers(0, 97, size=(3, 17))
    np.testing.assert_allclose(to_numpy(model(ids)), hf_logits(hf, ids), atol=1e-4, rtol=0)
    assert model.count_params() == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize(
    "option, value",
    [("scale_attn_by_inverse_layer_idx", True), ("scale_attn_weights", False), ("add_cross_attention", True)],
)
def test_options_that_change_the_computation_are_refused(option, value):
    # each loaded silently before, giving other logits (the cross-attention weights were left over)
    with pytest.raises(ValueError, match=f"GPT-2 checkpoints with {option}={value!r} are not supported"):
        keras_tfm.from_huggingface(hf_gpt2(**{option: value}))


def test_upcast_attention_option_gives_the_same_logits(rng):
    hf = hf_gpt2(reorder_and_upcast_attn=True)  # the same arithmetic, with float32 attention logits
    ids = rng.integers(0, 97, size=(2, 9))
    np.testing.assert_allclose(to_numpy(keras_tfm.from_huggingface(hf)(ids)), hf_logits(hf, ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_fine_tuning_drops_out_at_the_checkpoints_rate(rng, rate):
    hf = hf_gpt2(resid_pdrop=rate, embd_pdrop=rate, attn_pdrop=rate)
    model = keras_tfm.from_huggingface(hf)
    assert model.dropout == rate  # was 0.0 whatever the checkpoint said
    ids = rng.integers(0, 97, size=(2, 9))
    inference, training = to_numpy(model(ids)), to_numpy(model(ids, training=True))
    np.testing.assert_allclose(inference, hf_logits(hf, ids), atol=1e-4, rtol=0)
    assert np.allclose(training, inference, atol=1e-5) == (rate == 0.0)


def test_attention_dropout_is_the_checkpoints_own():
    model = keras_tfm.from_huggingface(hf_gpt2(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.25))
    assert (model.dropout, model.attention_dropout) == (0.1, 0.25)  # attn_pdrop was taken as resid_pdrop
    assert {block.self_attention.dropout for block in model.blocks} == {0.25}
    assert {block.dropout for block in model.blocks} == {0.1}
    assert keras_tfm.GPT.from_config(model.get_config()).attention_dropout == 0.25


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("safe_serialization", [True, False])
def test_loads_a_saved_directory(rng, tmp_path, safe_serialization, sharded):
    hf = hf_gpt2()
    hf.save_pretrained(
        tmp_path, safe_serialization=safe_serialization, **({"max_shard_size": "20KB"} if sharded else {})
    )
    assert any(name.endswith(".index.json") for name in os.listdir(tmp_path)) == sharded
    model = keras_tfm.from_huggingface(str(tmp_path))
    ids = rng.integers(0, 97, size=(2, 9))
    np.testing.assert_allclose(to_numpy(model(ids)), hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_gpt2_model_without_head_loads(rng):
    torch.manual_seed(0)
    base = transformers.GPT2Model(hf_gpt2().config).eval()
    model = keras_tfm.from_huggingface(base)
    ids = rng.integers(0, 97, size=(1, 5))
    with torch.no_grad():
        hidden = base(torch.tensor(ids)).last_hidden_state
        expected = (hidden @ base.wte.weight.T).numpy()
    np.testing.assert_allclose(to_numpy(model(ids)), expected, atol=1e-4, rtol=0)


def test_greedy_generate_matches_hugging_face(rng):
    hf = hf_gpt2(initializer_range=0.5)  # peaked logits: argmax decided by the model, not float noise
    model = keras_tfm.from_huggingface(hf)
    prompts = rng.integers(1, 97, size=(2, 5))
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(prompts),
            attention_mask=torch.ones_like(torch.tensor(prompts)),
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        ).numpy()
    np.testing.assert_array_equal(model.generate(prompts, max_new_tokens=12, stop_token_ids=()), expected)


def test_directory_errors(tmp_path):
    shard = "model-00001-of-00002.safetensors"
    steps = [  # (files written, or None to delete, before the call), the error, its message
        ({}, CheckpointError, "no config.json"),
        ({"config.json": "{not json"}, CheckpointError, "not valid JSON"),
        (
            {"config.json": '{"model_type": "gpt2"}'},
            CheckpointError,
            "neither model.safetensors nor pytorch_model.bin",
        ),
        ({"model.safetensors": "corrupt"}, CheckpointError, "cannot read"),
        (
            {"model.safetensors": None, "model.safetensors.index.json": '{"metadata": {}}'},
            CheckpointError,
            "has no 'weight_map'",
        ),
        (
            {"model.safetensors.index.json": f'{{"weight_map": {{"wte.weight": "{shard}"}}}}'},
            CheckpointError,
            f"shard '{shard}', listed in .* is missing",
        ),
        ({"config.json": '{"model_type": "gemma"}'}, CheckpointError, "unsupported model_type 'gemma'"),
    ]
    for files, error, message in steps:
        for name, text in files.items():
            if text is None:
                (tmp_path / name).unlink()
            else:
                (tmp_path / name).write_text(text)
        with pytest.raises(error, match=message):
            keras_tfm.from_huggingface(str(tmp_path))


def test_a_config_without_a_field_names_the_file_and_the_field(tmp_path):
    """It was a bare KeyError: 'n_embd'."""
    hf_gpt2().save_pretrained(str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    del config["n_embd"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json' lacks the field 'n_embd', which a 'gpt2' checkpoint needs"):
        keras_tfm.from_huggingface(str(tmp_path))


@pytest.mark.parametrize("num_beams", [2, 4])
def test_beam_search_matches_hugging_face(rng, num_beams):
    hf = hf_gpt2(initializer_range=0.3)
    model = keras_tfm.from_huggingface(hf)
    prompts = rng.integers(1, 97, size=(2, 4))
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(prompts),
            attention_mask=torch.ones_like(torch.tensor(prompts)),
            max_new_tokens=8,
            num_beams=num_beams,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
            early_stopping=False,
        ).numpy()
    np.testing.assert_array_equal(model.generate(prompts, max_new_tokens=8, num_beams=num_beams), expected)


def test_beam_search_at_nearby_lengths_shares_one_program_and_matches_hugging_face(rng):
    """Prompts 3 to 5 wide and 6 to 8 new tokens run one compiled beam loop (its room rounded up, as the row
    loop's), and each call still gives transformers' beams: ranked with a length penalty, where one beam takes the
    padding id (0), a token like any other that counts in the beam's length."""
    model = keras_tfm.from_huggingface(hf := hf_gpt2(initializer_range=0.3))
    calls, original = [], model.call_with_cache
    model.call_with_cache = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)

    def traced(width: int, new: int) -> int:
        prompts, before = rng.integers(1, 97, size=(2, width)), len(calls)
        with torch.no_grad():
            expected = hf.generate(torch.tensor(prompts), attention_mask=torch.ones(prompts.shape, dtype=torch.long),
                                   max_new_tokens=new, num_beams=3, do_sample=False, pad_token_id=0,
                                   eos_token_id=None, early_stopping=False, length_penalty=-1.0).numpy()  # fmt: skip
        got = model.generate(prompts, max_new_tokens=new, num_beams=3, stop_token_ids=(), length_penalty=-1.0)
        np.testing.assert_array_equal(got, expected)
        return len(calls) - before

    first, again = traced(4, 8), traced(4, 8)  # again: what a call runs outside its compiled loop
    assert first > again
    assert [traced(5, 7), traced(3, 6)] == [again] * 2


@pytest.mark.backend_independent
def test_a_checkpoint_with_weights_no_layer_takes_is_refused():
    from keras_tfm.convert.weights import WeightReader

    w = WeightReader({"wte.weight": np.zeros(2), "extra.weight": np.zeros(2), "h.0.attn.bias": np.zeros(2)})
    w("wte.weight")
    with pytest.raises(ValueError, match=r"from_huggingface: GPT-2 weights not converted: \['extra.weight', 'h.0.attn"):
        w.check_all_used("from_huggingface", "GPT-2")
    with pytest.raises(ValueError, match=r"not converted: \['extra.weight'\]"):
        w.check_all_used("from_huggingface", "GPT-2", ignore=lambda name: name.endswith(".attn.bias"))
    w("extra.weight")
    w.check_all_used("from_huggingface", "GPT-2", ignore=lambda name: name.endswith(".attn.bias"))
