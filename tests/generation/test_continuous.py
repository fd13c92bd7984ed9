"""Continuous batching's device side: rows at their own positions step as each would alone, rows that
join a running cache (and move when it is resized) continue as `generate` does, and each row draws from
its own distribution with its own random stream."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_tfm
from keras_tfm.errors import InputError
from keras_tfm.generation import compiled, continuous, sampling
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.rows import RowState
from keras_tfm.generation.sampling import RowSettings, bias_of, choose, features_of, row_values
from keras_tfm.layers.attention import LARGE_NEGATIVE
from tests.checks import one_program

VOCABULARY = 50


def decoder_lm():
    model = keras_tfm.DecoderLM(
        vocabulary_size=VOCABULARY, num_layers=2, num_heads=4, num_key_value_heads=2, hidden_dim=32,
        intermediate_dim=64, max_length=64, sliding_window=6, query_key_norm=True,
    )  # fmt: skip
    model.build()
    return model


def gpt():
    model = keras_tfm.GPT(vocabulary_size=VOCABULARY, num_layers=2, num_heads=4, hidden_dim=32, max_length=64)
    model.build()
    return model


def prefilled_cache(model, ids: np.ndarray):
    """The cache `continuous.prefill` fills with the right-padded prompts `ids`."""
    return continuous.prefill(model)(ops.convert_to_tensor(ids), ops.zeros((len(ids),), "int32"))[0]


@pytest.mark.parametrize("make", [decoder_lm, gpt], ids=["rotary_window", "learned_positions"])
def test_rows_at_their_own_positions_step_as_each_alone(make, rng):
    model = make()
    step = compiled.compile_function(model.call_with_cache, model)  # eager JAX compiles every op per shape
    prompts = [rng.integers(0, VOCABULARY, n).astype("int32") for n in (3, 8, 13)]  # 13 > the window
    alone, caches = [], []
    for prompt in prompts:  # what follows a prompt in the cache is overwritten or masked: pad them alike
        _, cache = step(np.pad(prompt, (0, 16 - len(prompt)))[None], model.empty_cache(1, 16), 0)
        logits, _ = step(prompt[None, -1:], cache, ops.convert_to_tensor(len(prompt) - 1, "int32"))
        alone.append(ops.convert_to_numpy(logits)[0, -1])
        caches.append(cache)
    joined = tuple(ops.concatenate(layer, axis=0) for layer in zip(*caches))
    positions = ops.convert_to_tensor(np.array([len(p) - 1 for p in prompts], "int32"))
    logits, _ = step(np.array([[p[-1]] for p in prompts], "int32"), joined, positions)
    np.testing.assert_allclose(ops.convert_to_numpy(logits)[:, -1], np.stack(alone), atol=1e-5)
    with pytest.raises(InputError, match=r"one position per row; received shape \(3,\) for `value` of shape"):
        model.call_with_cache(np.zeros((3, 2), "int32"), joined, positions)
    with pytest.raises(InputError, match=r"per row.* shape \(batch,\).*received shape \(2,\)"):
        model.call_with_cache(np.zeros((3, 1), "int32"), joined, positions[:2])


def settings(rows, temperature=0.0, top_p=1.0, penalty=1.0, seed=0, top_k=0, min_p=0.0, frequency=0.0, presence=0.0):
    values = [np.broadcast_to(np.asarray(v, d), (rows,)).copy() for v, d in
              ((temperature, "float32"), (top_k, "int32"), (top_p, "float32"), (min_p, "float32"),
               (penalty, "float32"), (frequency, "float32"), (presence, "float32"), (0, "int32"),
               (seed, "int32"))]  # fmt: skip
    return continuous.RowSettings(*(ops.convert_to_tensor(v) for v in values))


def test_rows_that_join_a_running_cache_continue_as_generate_does(rng):
    """Two prompts decode in a cache of four rows (the second with OpenAI's frequency and presence
    penalties, prefilled but for its last three tokens, which its first chunk feeds); a third (with a
    repetition penalty) joins after one chunk; the cache then shrinks to two rows and grows in length.
    Every row's greedy tokens are `generate`'s for its prompt alone."""
    model = decoder_lm()
    prompts = [rng.integers(0, VOCABULARY, n).astype("int32") for n in (4, 9, 6)]
    penalties = [1.0, 1.0, 1.5]
    counted = [(0.0, 0.0), (0.7, 0.4), (0.0, 0.0)]
    expected = [
        model.generate(
            [p.tolist()], 12, stop_token_ids=(), repetition_penalty=r, frequency_penalty=f, presence_penalty=q
        )[0, len(p) : len(p) + 12]
        for p, r, (f, q) in zip(prompts, penalties, counted)
    ]
    cache, seen = model.empty_cache(4, 32), ops.zeros((4, VOCABULARY), "int32")
    tokens, positions, slots, got = np.zeros(4, "int32"), np.zeros(4, "int32"), {}, {}
    fed = continuous.nothing_fed(4, 4)

    def admit(cache, seen, index, slot, prefilled=None):
        prompt = prompts[index]
        prefilled = len(prompt) - 1 if prefilled is None else prefilled
        ids = np.pad(prompt[:prefilled], (0, 32 - prefilled))[None]
        filled = prefilled_cache(model, ids)
        seen_row = np.zeros((1, VOCABULARY), "int32")
        seen_row[0, prompt] = 1
        tokens[slot], positions[slot], slots[index], got[index] = prompt[prefilled], prefilled, slot, []
        rest = prompt[prefilled + 1 :]
        fed[0][slot, : len(rest)], fed[1][slot] = rest, len(rest)
        return continuous.admit(cache, seen, filled, [0], [slot], seen_row)

    cache, seen = admit(cache, seen, 0, 3)
    cache, seen = admit(cache, seen, 1, 1, prefilled=6)
    for chunk in range(3):
        if chunk == 1:
            cache, seen = admit(cache, seen, 2, 0)
        if chunk == 2:  # row 3 (prompt 0) leaves; rows 0 and 1 move to a cache of 2 rows, 48 positions
            kept = [0, 1]
            cache, seen = continuous.resized(cache, seen, kept, 2, 48)
            tokens, positions, fed = tokens[kept], positions[kept], continuous.nothing_fed(2, 4)
            slots = {index: kept.index(slot) for index, slot in slots.items() if slot in kept}
        rows = len(tokens)
        penalty, frequency, presence = np.ones(rows, "float32"), np.zeros(rows, "float32"), np.zeros(rows, "float32")
        for index, slot in slots.items():
            penalty[slot], (frequency[slot], presence[slot]) = penalties[index], counted[index]
        features = continuous.Features(penalty=bool((penalty != 1).any()), counts=bool(frequency.any()))
        decode = continuous.decode_chunk(model, features, 4)
        cache, seen, generated = decode(
            cache,
            ops.convert_to_tensor(tokens),
            ops.convert_to_tensor(positions),
            seen,
            settings(rows, penalty=penalty, frequency=frequency, presence=presence),
            tuple(ops.convert_to_tensor(part) for part in fed),
        )
        generated = ops.convert_to_numpy(generated)
        tokens, positions = generated[:, -1].copy(), positions + 4
        for index, slot in slots.items():
            got[index].extend(generated[slot, fed[1][slot] :].tolist())
        fed = continuous.nothing_fed(len(tokens), 4)
        if chunk == 0:  # its seen counts: its prompt's tokens marked, the two tokens it chose counted
            counts = np.zeros(VOCABULARY, "int32")
            counts[prompts[1]] = 1
            np.add.at(counts, got[1], 2)
            np.testing.assert_array_equal(ops.convert_to_numpy(seen)[slots[1]], counts)
    np.testing.assert_array_equal(got[0], expected[0][:8])
    np.testing.assert_array_equal(got[1], expected[1][:10])  # two of its first chunk's steps fed its prompt
    np.testing.assert_array_equal(got[2], expected[2][:8])


def test_each_row_draws_from_its_own_distribution_and_stream():
    """4,000 rows of the same logits, seeds 0 ... 3,999: the tokens' frequencies are the softmax's (within
    four standard deviations); top-p keeps the smallest nucleus; a greedy row takes the argmax; a row's
    draw depends on its seed and position only, not on the rows beside it."""
    probabilities = np.array([0.1, 0.2, 0.3, 0.15, 0.25], "float32")
    rows = 4000
    logits = np.tile(np.log(probabilities), (rows, 1))
    positions = ops.convert_to_tensor(np.full(rows, 7, "int32"))
    sampled = continuous.Features(sampling=True)
    seeds = np.arange(rows)

    def choose(logits, seen, row_settings, positions, features):  # one program per call's shapes
        run = one_program(lambda *inputs: sampling.choose(inputs[0], seen, inputs[1], inputs[2], features))
        return run(logits, row_settings, positions)

    drawn = ops.convert_to_numpy(choose(logits, None, settings(rows, 1.0, seed=seeds), positions, sampled)[0])
    tolerance = 4 * np.sqrt(probabilities * (1 - probabilities) / rows)
    assert np.all(np.abs(np.bincount(drawn, minlength=5) / rows - probabilities) < tolerance)
    nucleus = continuous.Features(sampling=True, nucleus=True)
    cut = ops.convert_to_numpy(choose(logits, None, settings(rows, 1.0, 0.7, seed=seeds), positions, nucleus)[0])
    kept = np.array([0, 0.2, 0.3, 0, 0.25]) / 0.75  # 0.3 + 0.25 + 0.2 is the first mass past 0.7
    assert np.all(np.abs(np.bincount(cut, minlength=5) / rows - kept) < 4 * np.sqrt(kept * (1 - kept) / rows) + 1e-9)
    mixed = settings(3, temperature=np.array([1.0, 0.0, 1.0]), seed=np.array([11, 0, 12]))
    three = choose(logits[:3], None, mixed, positions[:3], sampled)[0]
    alone = choose(logits[:1], None, settings(1, 1.0, seed=11), positions[:1], sampled)[0]
    assert ops.convert_to_numpy(three)[1] == 2 and ops.convert_to_numpy(three)[0] == ops.convert_to_numpy(alone)[0]
    later = choose(logits, None, settings(rows, 1.0, seed=seeds), positions + 1, sampled)[0]
    assert np.mean(ops.convert_to_numpy(later) == drawn) < 0.35  # another position, another draw


def test_rows_that_all_cut_read_the_widths_largest_and_choose_as_a_sort_does(rng):
    """Rows of top-k 3, 16 and 9 with a nucleus read their cut from the 16 largest logits (the width
    `features_of` gives them) and choose what a sort of the whole vocabulary gives; a row that samples without
    a cut beside rows that cut keeps every token (`uncut`)."""
    logits = ops.convert_to_tensor(rng.normal(size=(3, VOCABULARY)).astype("float32") * 3)
    positions = ops.convert_to_tensor(np.arange(3, dtype="int32"))
    rows = settings(3, 1.0, 0.9, seed=np.array([1, 2, 3]), top_k=np.array([3, 16, 9]))
    features = features_of(RowSettings(*(ops.convert_to_numpy(value) for value in rows)))
    assert features.top_k == 16 and features.nucleus
    for seed in range(20):
        rows = rows._replace(seed=ops.convert_to_tensor(np.array([1, 2, 3]) + 3 * seed, "int32"))
        narrow = choose(logits, None, rows, positions, features)[0]
        whole = choose(logits, None, rows, positions, features._replace(top_k=VOCABULARY))[0]  # a sort
        np.testing.assert_array_equal(ops.convert_to_numpy(narrow), ops.convert_to_numpy(whole))
    keeps_all = settings(2, 1.0, seed=0, top_k=np.array([5, 0]))
    features = features_of(RowSettings(*(ops.convert_to_numpy(value) for value in keeps_all)))
    assert (features.top_k, features.uncut) == (8, True)
    assert features_of(RowSettings(*(ops.convert_to_numpy(value) for value in settings(2, 0.0, top_k=5)))).top_k == 0


def test_admitted_rows_hold_their_prompts_keys_and_values_then_zeros_and_the_others_are_kept(rng):
    """`admit` replaces whole rows of every layer's cache (JAX's program, PyTorch's write where they lie,
    TensorFlow's graph): the prefilled positions, zeros past them (a stale entry could be NaN, which a masked
    product still reads), and the other rows as they were."""
    cache = tuple(rng.normal(size=(3, 2, 2, 8, 4)).astype("float32") for _ in range(2))
    filled = tuple(rng.normal(size=(2, 2, 2, 5, 4)).astype("float32") for _ in range(2))
    seen, seen_rows = rng.integers(0, 3, (3, 6)).astype("int32"), rng.integers(0, 3, (2, 6)).astype("int32")
    given = keras.tree.map_structure(ops.convert_to_tensor, (cache, seen))
    written, written_seen = continuous.admit(*given, filled, [1, 0], [2, 0], seen_rows)
    for layer, before, new in zip(written, cache, filled, strict=True):
        expected = before.copy()
        expected[[2, 0]] = np.pad(new[[1, 0]], ((0, 0), (0, 0), (0, 0), (0, 3), (0, 0)))
        np.testing.assert_array_equal(ops.convert_to_numpy(layer), expected)
    np.testing.assert_array_equal(ops.convert_to_numpy(written_seen), np.stack([seen_rows[1], seen[1], seen_rows[0]]))


def test_a_host_bias_constrains_its_rows_at_each_step(rng):
    """`logit_bias`'s and constrained decoding's hook: a chunk takes a bias per row from the host; a row
    allowed one token (every other at LARGE_NEGATIVE) takes it, a row of zero bias chooses as without."""
    model = decoder_lm()
    prompts = [rng.integers(0, VOCABULARY, 5).astype("int32") for _ in range(2)]
    filled = prefilled_cache(model, np.stack([np.pad(p, (0, 3)) for p in prompts]))

    def admitted():  # a chunk and `admit` spend the cache and `seen` they are given (JAX reuses their buffers)
        empty = model.empty_cache(2, 32), ops.zeros((2, VOCABULARY), "int32")
        written = continuous.admit(*empty, filled, [0, 1], [0, 1], np.zeros((2, 50), "int32"))
        if keras.backend.backend() == "jax":
            assert all(layer.is_deleted() for layer in empty[0]) and empty[1].is_deleted()
        if keras.backend.backend() == "torch":  # written into the tensors it was given
            assert all(new is old for new, old in zip(written[0], empty[0])) and written[1] is empty[1]
        return written

    tokens, positions = ops.convert_to_tensor([p[-1] for p in prompts]), ops.convert_to_tensor(np.full(2, 4, "int32"))
    row_settings = settings(2, temperature=np.array([0.0, 1.0]), seed=np.array([0, 9]))
    free = continuous.decode_chunk(model, continuous.Features(sampling=True), 1)
    cache, seen = admitted()
    nothing = tuple(ops.convert_to_tensor(part) for part in continuous.nothing_fed(2, 1))
    _, _, expected = free(cache, tokens, positions, seen, row_settings, nothing)
    if keras.backend.backend() == "jax":  # the chunk wrote its results into the buffers it was given
        assert cache[0].is_deleted() and seen.is_deleted()
    expected = ops.convert_to_numpy(expected)
    only = (expected[0, 0] + 1) % VOCABULARY  # not the token row 0 takes unmasked
    bias = np.zeros((2, VOCABULARY), "float32")
    bias[0] = LARGE_NEGATIVE
    bias[0, only] = 0.0
    biased = continuous.decode_chunk(model, continuous.Features(sampling=True, biased=True), 1)
    cache, seen = admitted()
    _, _, chosen = biased(cache, tokens, positions, seen, row_settings, nothing, ops.convert_to_tensor(bias))
    chosen = ops.convert_to_numpy(chosen)
    assert chosen[0, 0] == only and chosen[1, 0] == expected[1, 0]


def test_a_rows_stop_token_waits_for_its_min_new_tokens_across_chunks(rng):
    """Two rows whose stop token is all but forced (a bias of 100): the row of no minimum takes it at once, the
    row of minimum 3 takes three other tokens first, over chunks of two steps, as `generate` does."""
    model = decoder_lm()
    model.generation_config = {"eos_token_id": 7}
    prompt = rng.integers(0, VOCABULARY, 5).astype("int32")
    configs = [GenerationConfig(logit_bias={7: 100.0}, min_new_tokens=minimum) for minimum in (0, 3)]
    state = RowState.empty(model, 2, 32, steps=2)
    filled = prefilled_cache(model, np.stack([prompt[:4]] * 2))
    state.admit(filled, [0, 1], [0, 1], np.zeros((2, VOCABULARY), "int32"))
    for row, config in enumerate(configs):
        state.start(row, prompt, 4, row_values(config, 0))
    features = features_of(RowSettings(*state.settings))._replace(biased=True)
    chunk = continuous.decode_chunk(model, features, 2)
    bias = ops.convert_to_tensor(np.stack([bias_of(config.logit_bias, VOCABULARY) for config in configs]))
    taken = np.zeros((2, 0), "int32")
    for _ in range(3):  # the first chunk returns at the rows' first token: one step, then two each
        cache, seen, generated = chunk(*state.chunk_inputs(2, bias))
        taken = np.concatenate([taken, state.advance(cache, seen, ops.convert_to_numpy(generated))[0]], axis=1)
    assert taken.shape == (2, 5) and taken[0, 0] == 7 and 7 not in taken[1, :3] and taken[1, 3] == 7
    expected = model.generate(prompt[None], max_new_tokens=4, logit_bias={7: 100.0}, min_new_tokens=3)
    np.testing.assert_array_equal(np.asarray(expected)[0, 5:], taken[1, :4])


def test_rows_whose_first_token_comes_from_the_prefill_continue_as_a_step_would(rng):
    """Prompts prefilled whole (5 and 3 tokens, right-padded to 8): each row's first token is chosen from the
    prefill's logits at its prompt's last token (`first_tokens`: a repetition penalty on its prompt, a seeded
    nucleus draw keyed by that token's position), then chunks of two steps go on from it. Each row's tokens are
    those of the same rows started a step earlier, their first chunk feeding the prompt's last token (the
    path `generate`'s loop takes, tested against it above)."""
    model = decoder_lm()
    prompts = [rng.integers(0, VOCABULARY, n).astype("int32") for n in (5, 3)]
    configs = [GenerationConfig(repetition_penalty=1.3), GenerationConfig(temperature=1.0, top_p=0.9)]
    seeds = [11, 12]
    ids = np.stack([np.pad(p, (0, 8 - len(p))) for p in prompts])
    filled, logits = continuous.prefill(model)(ops.convert_to_tensor(ids), ops.convert_to_tensor(np.array([4, 2])))
    assert [layer.shape for layer in filled] == [(2, 2, 2, 32, 8)] * 2  # 8 wide, in a cache of the shortest length
    settings = continuous.settings_of(configs, seeds)
    features = features_of(settings)
    seen = np.zeros((2, VOCABULARY), "int32")
    for row, prompt in enumerate(prompts):
        seen[row, prompt] = 1
    chunk = continuous.decode_chunk(model, features, 2)

    def decoded(first) -> np.ndarray:  # 7 new tokens of each row, its first chosen by `first_tokens` or a step
        state = RowState.empty(model, 2, 32, steps=2)
        state.admit(filled, [0, 1], [0, 1], seen + 2 * np.eye(VOCABULARY, dtype="int32")[first] * (first >= 0)[:, None])
        for row, prompt in enumerate(prompts):
            settings = row_values(configs[row], seeds[row])
            state.start(
                row, prompt, len(prompt) - (first[row] < 0), settings, None if first[row] < 0 else int(first[row])
            )
        taken = first[:, None][:, : int((first >= 0).all())]
        while taken.shape[1] < 7:
            cache, seen_after, generated = chunk(*state.chunk_inputs(2))
            taken = np.concatenate(
                [taken, state.advance(cache, seen_after, ops.convert_to_numpy(generated))[0]], axis=1
            )
        return taken[:, :7]

    positions = ops.convert_to_tensor(np.array([4, 2], "int32"))
    as_tensors = RowSettings(*(ops.convert_to_tensor(column) for column in settings))
    (first,) = continuous.first_tokens(model, features)(logits, ops.convert_to_tensor(seen), as_tensors, positions)
    np.testing.assert_array_equal(decoded(ops.convert_to_numpy(first).astype("int32")), decoded(np.array([-1, -1])))


def test_openai_penalties_are_the_formula_on_the_models_logits(rng):
    """`generate` with OpenAI's penalties: greedy on the full forward pass's logits less `count *
    frequency + (count > 0) * presence`, the counts of the tokens generated (the prompt's not counted)."""
    model = decoder_lm()
    prompt = rng.integers(0, VOCABULARY, 5).astype("int32")
    ids, counts = np.zeros((1, 15), "int32"), np.zeros(VOCABULARY)  # one input shape: one trace on JAX
    ids[0, :5] = prompt
    for t in range(5, 15):  # right padding: causal attention keeps it from the real positions
        logits = ops.convert_to_numpy(model(ids))[0, t - 1]
        ids[0, t] = token = int(np.argmax(logits - 1.5 * counts - 0.5 * (counts > 0)))
        counts[token] += 1
    got = model.generate([prompt.tolist()], 10, stop_token_ids=(), frequency_penalty=1.5, presence_penalty=0.5)
    np.testing.assert_array_equal(got[0], ids[0])
    assert not np.array_equal(model.generate([prompt.tolist()], 10, stop_token_ids=())[0], ids[0])  # they changed it


@pytest.mark.backend_independent
def test_a_chunk_after_a_row_starts_runs_only_until_its_first_new_token():
    """A started row's first token comes after the prompt tokens its chunk feeds (its prompt's last, and those
    past the prefill), not after a whole chunk; later chunks run every step."""
    state = RowState((np.zeros((2, 2, 1, 16, 4), "float32"),), np.zeros((2, 5), "int32"), steps=4)
    state.start(0, [1, 2, 3, 4, 4], 4, row_values(GenerationConfig(), 0))  # feeds its last token: one step
    assert state.chunk_inputs(4)[5][3] == 1 == state.running
    state.start(1, [1, 2, 3, 4, 4], 2, row_values(GenerationConfig(), 0))  # feeds 3, then 4 and 4: three steps
    assert state.chunk_inputs(4)[5][3] == 3
    taken, fed = state.advance(state.cache, state.seen, np.arange(8, dtype="int32").reshape(2, 4))
    assert taken.tolist() == [[0, 1, 2], [4, 5, 6]] and fed.tolist() == [0, 2]
    assert state.positions.tolist() == [7, 5] and state.tokens.tolist() == [2, 6] and state.made.tolist() == [3, 1]
    assert state.chunk_inputs(4)[5][3] == 4


def test_rows_that_end_by_themselves_stop_the_loop_once_all_have(rng):
    """`generate`'s loop: a row ends at a stop token or its limit, and the loop runs no step once every row has
    (the columns after are never written)."""
    model = gpt()
    prompts = rng.integers(0, VOCABULARY, (3, 5)).astype("int32")
    lengths, steps = np.array([5, 3, 4], "int32"), 6
    greedy = features_of(RowSettings(*(ops.convert_to_numpy(value) for value in settings(3))))
    run = continuous.decode_rows(model, greedy, steps, continuous.Loop(ends=True))

    def generated(stops, limits):
        tensors = (ops.convert_to_tensor(np.array(part, "int32")) for part in (prompts, lengths, limits, stops))
        prompt_ids, prompt_lengths, limits, stops = tensors
        out = run(prompt_ids, prompt_lengths, settings(3), limits, stops, ())
        return ops.convert_to_numpy(out[0])

    free = generated([-1], [steps] * 3)
    assert (free[:, 1:] != 0).any()  # what the later columns would hold
    stopped = generated(np.unique(free[:, 0]), [steps] * 3)  # every row's first token stops it
    np.testing.assert_array_equal(stopped[:, 0], free[:, 0])
    assert (stopped[:, 1:] == 0).all()
    limited = generated([-1], [2, 3, 1])  # the loop runs until the longest limit
    np.testing.assert_array_equal(limited[:, :3], free[:, :3])
    assert (limited[:, 3:] == 0).all()
