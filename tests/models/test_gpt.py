import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import InputError
from tests.checks import assert_close, count_of_size, run_layer_checks, to_numpy


def tiny_gpt(**overrides):
    config = dict(vocabulary_size=40, max_length=24, num_layers=1, num_heads=2, hidden_dim=16)
    return keras_tfm.GPT(**{**config, **overrides})


def peaked(model):
    """Scale up random weights so logits are far apart and argmax is not decided by float noise."""
    model.build()
    model.set_weights([w * 8.0 if w.ndim == 2 else w for w in model.get_weights()])
    return model


def full_forward_greedy(model, prompt, steps):
    """Greedy decoding without a cache: the whole sequence through the model at every step (right
    padding keeps one input shape; causal attention keeps it from touching real positions)."""
    ids = np.zeros((1, len(prompt) + steps), "int32")
    ids[0, : len(prompt)] = prompt
    for t in range(len(prompt), len(prompt) + steps):
        ids[0, t] = to_numpy(model(ids))[0, t - 1].argmax()
    return ids[0].tolist()


@pytest.mark.parametrize("tie_embeddings", [True])  # the untied head is CausalLM's: test_decoder_lm checks it
def test_gpt_passes_common_checks(tmp_path, rng, tie_embeddings):
    ids = rng.integers(0, 40, size=(2, 12)).astype("int32")
    run_layer_checks(lambda **kw: tiny_gpt(tie_embeddings=tie_embeddings, dropout=0.1, **kw), (ids,), tmp_path=tmp_path)


def test_fit_with_dropout_and_predict_at_several_lengths(rng):
    # Keras' `fit` has an unknown batch size; TensorFlow retraces `fit` and `predict` with an
    # unknown length too once it has seen a second one (the third length runs that trace; the other
    # backends compile each length alike). Dropout takes attention's unfused path.
    model = tiny_gpt(dropout=0.1)
    model.compile(keras.optimizers.Adam(1e-3), keras_tfm.TokenCrossEntropy())
    for length in (12, 16, 9) if keras.backend.backend() == "tensorflow" else (12, 9):
        ids = rng.integers(1, 40, size=(6, length + 1)).astype("int32")
        history = model.fit(ids[:, :-1], ids[:, 1:], batch_size=4, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])
        assert_close(model.predict(ids[:, :-1], batch_size=6, verbose=0), model(ids[:, :-1]), atol=1e-5)


def test_logits_are_causal(rng):
    model = tiny_gpt()
    ids = rng.integers(0, 40, size=(2, 10)).astype("int32")
    changed = ids.copy()
    changed[:, 6:] = (changed[:, 6:] + 1) % 40
    assert_close(to_numpy(model(ids))[:, :6], to_numpy(model(changed))[:, :6], atol=1e-5)


def test_cached_greedy_equals_full_forward_greedy():
    model = peaked(tiny_gpt())
    prompt = [3, 17, 5, 9]
    generated = model.generate([prompt], max_new_tokens=10)[0]
    assert generated.tolist() == full_forward_greedy(model, prompt, 10)


def test_a_quantized_model_generates_as_its_full_forward_passes():
    # its reloaded .keras file gives the same logits: tests/models/test_base.py
    model, twin = peaked(tiny_gpt()), tiny_gpt()
    twin.set_weights(model.get_weights())
    prompt = [3, 17, 5, 9]
    model.generate([prompt], max_new_tokens=10, return_scores=True)  # compiled with the float kernels
    model.quantize("int8")
    twin.quantize("int8")
    assert model.generate([prompt], max_new_tokens=10)[0].tolist() == full_forward_greedy(model, prompt, 10)
    scores = model.generate([prompt], max_new_tokens=10, return_scores=True)[1]
    assert_close(scores, twin.generate([prompt], max_new_tokens=10, return_scores=True)[1], atol=1e-5)


def test_generate_after_enable_lora_decodes_with_the_pairs():
    model = tiny_gpt()
    model.build()
    prompt = [3, 17, 5, 9]
    model.generate([prompt], max_new_tokens=6)  # compiled before the pairs existed
    model.enable_lora(rank=2)
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.Dense) and layer.lora_enabled:
            layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.5, "float32"))
    output, scores = model.generate([prompt], max_new_tokens=6, return_scores=True)
    log_probs = keras.ops.log_softmax(model(output[:, :-1]), axis=-1)
    expected = np.take_along_axis(to_numpy(log_probs)[0, 3:], output[0, 4:, None], axis=-1)[:, 0]
    assert_close(scores[0], expected, atol=1e-4)


@pytest.mark.parametrize("sampling", [dict(), dict(num_beams=2), dict(temperature=1.0, seed=1)])
def test_the_prefill_fills_the_cache_without_computing_logits(sampling):
    model = tiny_gpt()
    model.build()
    ids = np.array([[3, 17, 5, 9, 11, 2]], "int32")
    no_logits, cache = model.call_with_cache(ids, model.empty_cache(1, 8), 0, output_logits=False)
    logits, expected = model.call_with_cache(ids, model.empty_cache(1, 8), 0)
    assert no_logits is None and tuple(logits.shape) == (1, 6, 40)
    for layer_cache, expected_layer_cache in zip(cache, expected):
        assert_close(layer_cache, expected_layer_cache, atol=1e-6)
    # generate computes logits, and the last block's feed-forward network, for one new position at
    # a time, never for the prompt
    lengths, logits_of = [], model._logits
    model._logits = lambda hidden: lengths.append(int(hidden.shape[1])) or logits_of(hidden)
    last_feed_forward, feed_forward_of = [], model.blocks[-1].feed_forward.call
    model.blocks[-1].feed_forward.call = lambda hidden, **kwargs: (
        last_feed_forward.append(int(hidden.shape[1])) or feed_forward_of(hidden, **kwargs)
    )
    model.generate([[3, 17, 5, 9, 11, 2], [7, 8]], max_new_tokens=3, **sampling)
    assert lengths and set(lengths) == {1}
    assert last_feed_forward and set(last_feed_forward) == {1}


def test_prompts_of_different_lengths_decode_as_if_alone():
    model = peaked(tiny_gpt())
    prompts = [[3, 17], [5, 9, 11, 2, 30], [7]]
    batch = model.generate(prompts, max_new_tokens=6)
    assert batch.shape == (3, 5 + 6)
    for row, prompt in zip(batch, prompts):
        alone = model.generate([prompt], max_new_tokens=6)[0]
        n = len(prompt) + 6
        assert row[:n].tolist() == alone.tolist()
        assert np.all(row[n:] == 0)


def test_padded_array_with_mask_equals_list_of_prompts():
    model = peaked(tiny_gpt())
    ids = np.array([[3, 17, 0, 0], [5, 9, 11, 2]], "int32")
    mask = ids != 0
    from_array = model.generate(ids, max_new_tokens=4, padding_mask=mask)
    from_lists = model.generate([[3, 17], [5, 9, 11, 2]], max_new_tokens=4)
    np.testing.assert_array_equal(from_array, from_lists)


def test_one_prompt_generates_as_a_batch_of_one():
    model = peaked(tiny_gpt())
    expected = model.generate([[3, 17, 5]], max_new_tokens=4)
    assert expected.shape == (1, 7)
    for one in ([3, 17, 5], np.array([3, 17, 5], "int32")):
        np.testing.assert_array_equal(model.generate(one, max_new_tokens=4), expected)


def test_stop_tokens_end_a_row_and_pad_the_rest():
    model = peaked(tiny_gpt())
    free = model.generate([[3, 17, 5]], max_new_tokens=8)[0]
    stop = int(free[4])  # the second generated token
    stopped = model.generate([[3, 17, 5]], max_new_tokens=8, stop_token_ids=[stop], pad_token_id=39)[0]
    first = 3 + list(free[3:]).index(stop)
    assert stopped[: first + 1].tolist() == free[: first + 1].tolist()
    assert np.all(stopped[first + 1 :] == 39)
    one_id = model.generate([[3, 17, 5]], max_new_tokens=8, stop_token_ids=stop, pad_token_id=39)[0]
    assert one_id.tolist() == stopped.tolist()


def test_sampling_is_reproducible_with_a_seed_and_varies_without():
    model = tiny_gpt()
    prompt = [[1, 2, 3]]
    a = model.generate(prompt, max_new_tokens=12, temperature=1.0, seed=7)
    b = model.generate(prompt, max_new_tokens=12, temperature=1.0, seed=7)
    c = model.generate(prompt, max_new_tokens=12, temperature=1.0, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # top_k beyond the vocabulary (40) limits nothing, as in Hugging Face
    np.testing.assert_array_equal(model.generate(prompt, max_new_tokens=12, temperature=1.0, top_k=100, seed=7), a)


def test_top_k_one_and_tiny_top_p_are_greedy():
    model = peaked(tiny_gpt())
    greedy = model.generate([[1, 2, 3]], max_new_tokens=8)
    np.testing.assert_array_equal(
        model.generate([[1, 2, 3]], max_new_tokens=8, temperature=1.0, top_k=1, seed=1), greedy
    )
    np.testing.assert_array_equal(
        model.generate([[1, 2, 3]], max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=1), greedy
    )


def test_top_k_samples_only_among_the_k_best():
    from keras_tfm.generation import Sampler

    logits = np.log(np.array([[0.05, 0.4, 0.3, 0.05, 0.2]] * 500, "float32"))
    seeds, positions = np.arange(500, dtype="int32"), np.zeros(500, "int32")
    tokens = to_numpy(Sampler(temperature=1.0, top_k=2)(logits, seeds, positions))
    assert set(tokens.tolist()) == {1, 2}
    tokens = to_numpy(Sampler(temperature=1.0, top_p=0.65)(logits, seeds, positions))
    assert set(tokens.tolist()) == {1, 2}  # 0.4 + 0.3 reaches 0.65
    tokens = to_numpy(Sampler(temperature=1.0, top_p=0.75)(logits, seeds, positions))
    assert set(tokens.tolist()) == {1, 2, 4}
    tokens = to_numpy(Sampler(temperature=1.0, min_p=0.6)(logits, seeds, positions))
    assert set(tokens.tolist()) == {1, 2}  # 0.3 >= 0.6 * 0.4 > 0.2


def test_bad_generation_arguments():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="exceeds max_length=24"):
        model.generate([[1] * 20], max_new_tokens=5)
    with pytest.raises(ValueError, match="empty prompt"):
        model.generate([[1, 2], []], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"token_ids: must hold at least one prompt; received shape \(0, 3\)"):
        model.generate(np.zeros((0, 3), "int32"), max_new_tokens=2)
    with pytest.raises(ValueError, match="`top_p` must be a number in"):
        model.generate([[1]], max_new_tokens=2, top_p=0.0)
    # Each ran (NaN scores, or another row's tokens changed on JAX by an id outside the table).
    for settings, message in (
        ({"temperature": float("nan")}, "`temperature` must be a finite number >= 0; received nan"),
        ({"top_k": 2.5}, "`top_k` must be an integer >= 0; received 2.5"),
        ({"num_beams": 2, "length_penalty": float("nan")}, "`length_penalty` must be a finite number; received nan"),
        ({"pad_token_id": 40}, r"`pad_token_id` must be an id in \[0, vocabulary_size=40\); received 40"),
        ({"pad_token_id": -1}, r"`pad_token_id` must be an id in \[0, vocabulary_size=40\); received -1"),
        ({"num_beams": 1.5}, "`num_beams` must be an integer >= 1; received 1.5"),
    ):
        with pytest.raises(ValueError, match=message):
            model.generate([[1]], max_new_tokens=2, **settings)
    with pytest.raises(ValueError, match="`max_new_tokens` must be an integer >= 1; received 2.0"):
        model.generate([[1]], max_new_tokens=2.0)
    with pytest.raises(ValueError, match="padding on the right"):
        model.generate(np.array([[0, 1, 2]]), padding_mask=np.array([[0, 1, 1]], bool), max_new_tokens=2)
    with pytest.raises(ValueError, match="max_length=24"):
        model(np.zeros((1, 25), "int32"))
    # Prompts are checked before compiled code, where JAX would read an unknown id silently.
    with pytest.raises(ValueError, match=r"token_ids: must hold ids in \[0, vocabulary_size=40\); received 40"):
        model.generate([[1, 2], [3, 40]], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"token_ids: must hold ids in \[0, vocabulary_size=40\); received -1"):
        model.generate(np.array([[1, -1, 0]]), padding_mask=np.array([[1, 1, 0]], bool), max_new_tokens=2)
    with pytest.raises(ValueError, match="token_ids: must hold integer token ids; received float64"):
        model.generate(np.array([[1.5, 2.0]]), max_new_tokens=2)
    with pytest.raises(InputError, match=r"stop_token_ids: must hold ids in \[0, vocabulary_size=40\); received 41"):
        model.generate([[1]], max_new_tokens=2, stop_token_ids=41)
    with pytest.raises(InputError, match=r"logit_bias: must name ids in \[0, vocabulary_size=40\); received 40"):
        model.generate([[1]], max_new_tokens=2, logit_bias={3: 1.0, 40: -100})
    # Stop ids are one id or a flat list of them; text and ids are not mixed; a stream has one prompt.
    for stops in ([[1, 2]], 1.5, "3", [1, "3"], [True]):
        with pytest.raises(
            InputError, match=r"stop_token_ids: GPT.generate: `stop_token_ids` must be a token id or a flat list of"
        ) as info:
            model.generate([[1]], max_new_tokens=2, stop_token_ids=stops)
        assert info.value.argument == "stop_token_ids"
    with pytest.raises(
        InputError, match="token_ids: expected text .* or token ids .*; received a list of list and str"
    ):
        model.generate(["ab", [1, 2]], max_new_tokens=2)
    for prompts in (["ab", "cd"], [[1, 2], [3, 4]], np.array([[1, 2], [3, 4]])):
        with pytest.raises(InputError, match="token_ids: GPT.stream: streams one prompt"):
            next(model.stream(prompts, max_new_tokens=2))


@pytest.mark.parametrize(
    "size, layers_, hidden",
    [(keras_tfm.gpt2_medium, 24, 1024), (keras_tfm.gpt2_xl, 48, 1600), (keras_tfm.gpt_shakespeare_char, 6, 384)],
)
def test_size_functions_configure_the_one_class(size, layers_, hidden):
    model = size(vocabulary_size=11)
    assert isinstance(model, keras_tfm.GPT)
    assert (model.num_layers, model.hidden_dim, model.vocabulary_size) == (layers_, hidden, 11)


@pytest.mark.backend_independent
def test_gpt2_small_has_the_published_parameter_count():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    hf_count = sum(p.numel() for p in hf.parameters())
    assert count_of_size(keras_tfm.gpt2_small, 12, 50257) == hf_count == 124_439_808


def test_generation_sees_weight_updates_after_compiling():
    model = peaked(tiny_gpt())
    before = model.generate([[3, 17, 5]], max_new_tokens=6)
    weights = model.get_weights()
    model.set_weights([w[::-1].copy() if w.ndim == 2 else w for w in weights])  # a different model
    after = model.generate([[3, 17, 5]], max_new_tokens=6)
    assert after[0].tolist() == full_forward_greedy(model, [3, 17, 5], 6)
    assert not np.array_equal(before, after)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_reused_decoding_loop_reads_each_calls_prompts_stops_and_padding(num_beams):
    """The compiled (on PyTorch: traced) loop is replayed for calls of the same shapes; nothing of
    the first call may stick in it."""
    model = peaked(tiny_gpt())

    def twin():
        other = tiny_gpt()
        other.build()
        other.set_weights(model.get_weights())
        return other

    second_prompts = [[2], [30, 4, 6]]
    stop = int(twin().generate(second_prompts, max_new_tokens=5, num_beams=num_beams)[1, 3])  # its first new token
    kwargs = dict(max_new_tokens=5, num_beams=num_beams, stop_token_ids=[stop], pad_token_id=38)
    model.generate([[3, 17, 5], [8]], max_new_tokens=5, num_beams=num_beams, stop_token_ids=[1], pad_token_id=39)
    replayed = model.generate(second_prompts, **kwargs)
    np.testing.assert_array_equal(replayed, twin().generate(second_prompts, **kwargs))
    assert np.all(replayed[0, 6:] == 38)  # this call's padding after the short prompt's 5 new tokens
    if num_beams == 1:  # greedy stops at its first new token (beam search may choose another)
        assert replayed[1, 3] == stop and np.all(replayed[1, 4:] == 38)


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy():
    model = tiny_gpt()

    def log_likelihood(ids, prompt_length):
        logits = to_numpy(model(np.array([ids], "int32")))[0]
        log_probs = (
            logits
            - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
            - logits.max(-1, keepdims=True)
        )
        return sum(log_probs[t - 1, ids[t]] for t in range(prompt_length, len(ids)))

    prompt = [3, 17, 5]
    greedy = model.generate([prompt], max_new_tokens=6)[0].tolist()
    beam = model.generate([prompt], max_new_tokens=6, num_beams=4)[0].tolist()
    assert beam[:3] == prompt
    assert log_likelihood(beam, 3) >= log_likelihood(greedy, 3) - 1e-5
    assert model.generate([prompt], max_new_tokens=6, num_beams=1)[0].tolist() == greedy


def test_beam_search_batches_ragged_prompts_and_stops():
    model = peaked(tiny_gpt())
    prompts = [[3, 17], [5, 9, 11, 2, 30]]
    batch = model.generate(prompts, max_new_tokens=5, num_beams=3)
    for row, prompt in zip(batch, prompts):
        alone = model.generate([prompt], max_new_tokens=5, num_beams=3)[0]
        assert row[: len(prompt) + 5].tolist() == alone.tolist()
    every_id_stops = list(range(39))
    stopped = model.generate(prompts, max_new_tokens=5, num_beams=3, stop_token_ids=every_id_stops, pad_token_id=39)
    for row, prompt in zip(stopped, prompts):
        n = len(prompt)
        assert row[:n].tolist() == prompt and row[n] != 39 and np.all(row[n + 1 :] == 39)


INT8_ON_OTHER_BACKEND = """
import sys, numpy as np, keras
import keras_tfm
data = np.load(sys.argv[1] + "/io.npz")
out = keras.ops.convert_to_numpy(keras.saving.load_model(sys.argv[1] + "/int8.keras")(data["ids"]))
print(keras.backend.backend(), float(np.abs(out - data["int8"]).max()))
"""


@pytest.mark.backend_independent
def test_an_int8_model_on_another_backend_differs_by_less_than_quantization_itself(rng, tmp_path):
    """int8 layers quantize their inputs on the fly (abs-max, per row): a float difference of 1e-7 between
    backends moves an input across a rounding boundary, which changes that product by a whole
    quantization step. So an int8 model's logits differ across backends by far more than a float
    model's 1e-6, but by less than quantizing changed them in the first place."""
    import os
    import subprocess
    import sys

    keras.utils.set_random_seed(0)
    model = keras_tfm.GPT(vocabulary_size=1000, max_length=32, num_layers=2, num_heads=12, hidden_dim=768)
    ids = rng.integers(0, 1000, (2, 32))
    float_logits = to_numpy(model(ids))
    model.quantize("int8")
    int8_logits = to_numpy(model(ids))
    model.save(tmp_path / "int8.keras")
    np.savez(tmp_path / "io.npz", ids=ids, int8=int8_logits)
    other = "jax" if keras.backend.backend() != "jax" else "torch"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run(
        [sys.executable, "-c", INT8_ON_OTHER_BACKEND, str(tmp_path)],
        env=dict(os.environ, KERAS_BACKEND=other, PYTHONPATH=root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    backend, difference = result.stdout.split()[-2:]
    quantization_error = np.abs(int8_logits - float_logits).max()
    assert backend == other and float(difference) < quantization_error, (difference, quantization_error)
