"""DecoderLM: the shared checks, cached decoding with grouped keys and values and a sliding window, and
the named sizes (their parameter counts are transformers' own for the same configuration)."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_tfm
from tests.checks import run_layer_checks, to_numpy
from tests.models.test_gpt import full_forward_greedy, peaked


def tiny_lm(**overrides):
    config = dict(
        vocabulary_size=40,
        max_length=32,
        num_layers=1,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=16,
        intermediate_dim=24,
        sliding_window=5,  # shorter than the sequences below
        query_key_norm=True,
        attention_use_bias=True,
        attention_output_use_bias=False,
        rotary_embedding=dict(max_wavelength=100.0, scaling="llama3", scaling_factor=4.0, original_max_length=8),
    )
    return keras_tfm.DecoderLM(**{**config, **overrides})


def test_decoder_lm_passes_common_checks(tmp_path, rng):
    ids = rng.integers(0, 40, size=(2, 12)).astype("int32")
    # mixed precision: GPT's checks (the same CausalLM) and the Llama-form block in the every-layer model
    run_layer_checks(
        lambda **kw: tiny_lm(tie_embeddings=False, dropout=0.1, **kw), (ids,), tmp_path=tmp_path, mixed_precision=False
    )


def test_cached_decoding_of_ragged_prompts_equals_full_forward_greedy():
    model = peaked(tiny_lm())
    prompts = [[3, 17, 5, 9, 11, 2, 30], [7, 8]]
    batch = model.generate(prompts, max_new_tokens=12)
    for row, prompt in zip(batch, prompts):
        n = len(prompt) + 12
        assert row[:n].tolist() == full_forward_greedy(model, prompt, 12)
    assert model.empty_cache(1, 8)[0].shape == (1, 2, 2, 8, 4)  # only the key/value heads are cached


def test_a_pytorch_decoding_trace_keeps_its_values_and_drops_its_shape_arithmetic():
    if keras.backend.backend() != "torch":
        pytest.skip("PyTorch's traced decoding step")
    import torch

    from keras_tfm.generation import compiled

    model = tiny_lm()
    model(np.zeros((1, 4), "int32"))
    token, index = ops.convert_to_tensor([[3], [9]], "int32"), ops.convert_to_tensor(4, "int32")
    cache = tuple(
        ops.convert_to_tensor(np.random.default_rng(i).normal(size=c.shape), "float32")
        for i, c in enumerate(model.empty_cache(2, 12))
    )
    eager_logits, eager_cache = model.call_with_cache(token, cache, index)
    copies = tuple(ops.copy(c) for c in cache)  # the trace writes its cache in place
    traced = compiled.torch_trace(model.call_with_cache, model, (token, copies, index))
    nodes = [node.kind() for node in traced.graph.nodes()]
    assert "aten::size" not in nodes and len(nodes) < 700  # ~350; ~2,000 with the shapes read at run time
    with torch.no_grad():
        logits, new_cache = traced(token, tuple(ops.copy(c) for c in cache), index)
    np.testing.assert_array_equal(to_numpy(logits), to_numpy(eager_logits))
    for ours, expected in zip(new_cache, eager_cache):
        np.testing.assert_array_equal(to_numpy(ours), to_numpy(expected))


def test_beam_search_and_sampling_decode_from_the_grouped_cache():
    model = peaked(tiny_lm())
    prompt = [3, 17, 5, 9]
    beams = model.generate([prompt], max_new_tokens=6, num_beams=3)[0]
    greedy = model.generate([prompt], max_new_tokens=6)[0]

    def log_probability(row):
        logits = to_numpy(model(row[None]))[0].astype("float64")
        log_probs = (
            logits
            - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
            - logits.max(-1, keepdims=True)
        )
        return sum(log_probs[t - 1, row[t]] for t in range(len(prompt), len(row)))

    assert log_probability(beams) >= log_probability(greedy) - 1e-4
    first = model.generate([prompt], max_new_tokens=6, temperature=1.0, seed=3)
    assert np.array_equal(first, model.generate([prompt], max_new_tokens=6, temperature=1.0, seed=3))
    samples = model.generate([prompt, [7]], max_new_tokens=6, temperature=2.0, seed=3, num_return_sequences=3)
    assert samples.shape == (6, 10) and len({tuple(row) for row in samples[:3]}) > 1  # three draws of prompt 1
    assert all(row[:4].tolist() == prompt for row in samples[:3]) and all(row[0] == 7 for row in samples[3:])
    two_best = model.generate([prompt], max_new_tokens=6, num_beams=3, num_return_sequences=2)
    assert two_best.shape == (2, 10) and np.array_equal(two_best[0], beams)


@pytest.mark.backend_independent  # generation on every backend: the tests above
def test_text_in_text_out_with_the_models_tokenizer_which_its_keras_file_keeps(tmp_path):
    from keras_tfm.data import CharacterTokenizer

    tokenizer = CharacterTokenizer.fit("abcdefghijklmnopqrstuvwxyz .")
    model = peaked(tiny_lm(vocabulary_size=tokenizer.vocabulary_size))
    with pytest.raises(ValueError, match="^token_ids: .*`model.tokenizer` is None"):
        model.generate("hello", max_new_tokens=6)
    model.tokenizer = tokenizer
    text = model.generate("hello", max_new_tokens=6)
    ids = model.generate([tokenizer.encode("hello").tolist()], max_new_tokens=6)[0]
    assert isinstance(text, str) and text == tokenizer.decode(ids) and text.startswith("hello") and len(text) == 11
    assert model.generate(["hello", "a b"], max_new_tokens=6) == [text, model.generate("a b", max_new_tokens=6)]
    first_new = int(ids[5])
    assert model.generate("hello", max_new_tokens=6, stop_token_ids=first_new) == "hello" + tokenizer.decode(
        [first_new]
    )
    with pytest.raises(ValueError, match="^token_ids: .*at least one token"):
        model.generate(["hello", ""], max_new_tokens=2)
    model.save(tmp_path / "lm.keras")
    loaded = keras_tfm.load_model(str(tmp_path / "lm.keras"))
    assert loaded.tokenizer.vocabulary == tokenizer.vocabulary
    assert loaded.generate("hello", max_new_tokens=6) == text


SIZES = {
    "smollm2_135m": 134_515_008,
    "smollm2_360m": None,
    "qwen2_5_0_5b": 494_032_768,
    "qwen3_0_6b": None,
    "llama3_2_1b": 1_235_814_400,
    "llama3_8b": None,
    "mistral_7b": None,
}


@pytest.mark.backend_independent
@pytest.mark.parametrize("size", sorted(SIZES))
def test_a_named_size_has_the_parameters_of_its_transformers_model(size):
    """Counted without making the whole model: one block and the embeddings of a one-token vocabulary
    are built; the rest is blocks of the same shape and vocabulary rows."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from keras_tfm.convert.llama import huggingface_config

    model = getattr(keras_tfm, size)()
    assert not model.built  # constructing a size costs nothing
    config = huggingface_config(model)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    expected = sum(p.numel() for p in hf.parameters())
    one_block = getattr(keras_tfm, size)(num_layers=1, vocabulary_size=1)
    small = one_block.count_params()
    block = sum(int(np.prod(w.shape)) for w in one_block.blocks[0].weights)
    rows = (model.vocabulary_size - 1) * model.hidden_dim * (1 if model.tie_embeddings else 2)
    assert small + (model.num_layers - 1) * block + rows == expected
    if SIZES[size] is not None:  # the published count
        assert expected == SIZES[size]


def test_nearby_prompt_lengths_and_token_counts_share_one_compiled_loop(rng):
    """Prompts of 9 to 12 tokens and 17 to 20 new tokens decode with one compiled loop (its room rounded up;
    rows end at their own limits), and each call gives the tokens of greedy decoding without a cache."""
    model = peaked(tiny_lm(max_length=64))
    calls, original = [], model.call_with_cache

    def counted(*args, **kwargs):  # runs when a loop is traced (and at every prefill on PyTorch)
        calls.append(1)
        return original(*args, **kwargs)

    model.call_with_cache = counted

    def traced(length: int, new: int, checked: bool = False) -> int:
        prompt, before = rng.integers(1, 40, length).tolist(), len(calls)
        ids = np.asarray(model.generate([prompt], max_new_tokens=new, stop_token_ids=()))
        count = len(calls) - before
        assert ids.shape == (1, length + new)
        assert not checked or ids[0].tolist() == full_forward_greedy(model, prompt, new)
        return count

    eager = 1 if keras.backend.backend() == "torch" else 0  # PyTorch's prefill runs op by op at every call
    assert traced(10, 20, checked=True) > eager
    assert [traced(11, 20), traced(9, 17, checked=True), traced(12, 18)] == [eager] * 3
    assert traced(20, 8) > eager  # farther: a program of its own


def test_stream_yields_what_generate_adds_chunk_by_chunk():
    from keras_tfm.data import CharacterTokenizer

    tokenizer = CharacterTokenizer.fit("abcdefghijklmnopqrstuvwxyz .")
    model = peaked(tiny_lm(vocabulary_size=tokenizer.vocabulary_size))
    model.tokenizer = tokenizer
    prompt = tokenizer.encode("hello").tolist()
    expected = model.generate([prompt], max_new_tokens=11)[0, 5:]
    chunks = list(model.stream(prompt, max_new_tokens=11, chunk_size=4))
    assert [len(chunk) for chunk in chunks] == [1, 4, 4, 2]  # the first token as soon as it is chosen
    np.testing.assert_array_equal(np.concatenate(chunks), expected)
    stop = int(expected[5])  # a stop token ends the stream after it, as it ends generate's row
    stopped = list(model.stream(prompt, max_new_tokens=11, chunk_size=4, stop_token_ids=stop))
    np.testing.assert_array_equal(np.concatenate(stopped), expected[: list(expected).index(stop) + 1])
    pieces = list(model.stream("hello", max_new_tokens=11, chunk_size=3))
    assert len(pieces) == 5 and "hello" + "".join(pieces) == model.generate("hello", max_new_tokens=11)
    sampled = np.concatenate(list(model.stream(prompt, max_new_tokens=11, temperature=1.0, seed=5)))
    np.testing.assert_array_equal(sampled, model.generate([prompt], max_new_tokens=11, temperature=1.0, seed=5)[0, 5:])
    # controls that read each row's past: its tokens by position carry from chunk to chunk
    controls = dict(no_repeat_ngram_size=2, min_new_tokens=3, logit_bias={0: -2.0})
    controlled = model.generate([prompt], max_new_tokens=16, stop_token_ids=(), **controls)[0, 5:]
    assert not np.array_equal(controlled[:11], expected)  # the controls change the tokens
    streamed = list(model.stream(prompt, max_new_tokens=16, chunk_size=2, stop_token_ids=(), **controls))
    np.testing.assert_array_equal(np.concatenate(streamed), controlled)
    with pytest.raises(ValueError, match="^token_ids: .*streams one prompt; received 2"):
        next(model.stream([prompt, prompt], max_new_tokens=2))
    with pytest.raises(ValueError, match="^chunk_size: "):
        next(model.stream(prompt, max_new_tokens=2, chunk_size=0))
