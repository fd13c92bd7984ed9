"""The one token chooser: its warps are transformers' (temperature, top-k, top-p, min-p, in that order),
each row's own settings warp as the same settings for the whole batch do, and the settings object
refuses what would run silently wrong."""

import numpy as np
import pytest
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.generation import GenerationConfig, Sampler
from keras_tfm.generation.sampling import (
    Features,
    RowSettings,
    bias_of,
    choose,
    chooser_of,
    config_settings,
    controlled,
    draw,
    features_of,
    first_largest,
    nucleus,
    row_seeds,
    row_uniforms,
    row_values,
    warp,
)
from keras_tfm.layers.attention import LARGE_NEGATIVE
from tests.checks import one_program

SETTINGS = [
    dict(temperature=0.7),
    dict(temperature=1.3, top_k=5),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=0.9, min_p=0.1),
    dict(temperature=0.8, top_k=12, top_p=0.9, min_p=0.05),
]


def transformers_warped(logits: np.ndarray, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    torch = pytest.importorskip("torch")
    generation = pytest.importorskip("transformers.generation.logits_process")
    warpers = [generation.TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(generation.TopKLogitsWarper(top_k))
    if top_p < 1:
        warpers.append(generation.TopPLogitsWarper(top_p))
    if min_p:
        warpers.append(generation.MinPLogitsWarper(min_p))
    scores = torch.tensor(logits)
    for warper in warpers:
        scores = warper(None, scores)
    return scores.numpy()


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(s))
def test_warps_keep_the_tokens_transformers_keeps_and_each_row_its_own(settings, rng):
    logits = rng.normal(size=(6, 40)).astype("float32") * 3
    expected = transformers_warped(logits, **settings)
    kept = np.isfinite(expected)
    call = config_settings(GenerationConfig(**settings))
    chooser, seeds, positions = chooser_of(call), row_seeds(0, 6), np.zeros(6, "int32")
    ours = choose(logits, None, call._replace(seed=seeds), positions, chooser.features)[1]
    ours = ops.convert_to_numpy(ours)
    np.testing.assert_array_equal(ours > LARGE_NEGATIVE / 2, kept)
    np.testing.assert_allclose(ours[kept], expected[kept], rtol=1e-5)
    # the same settings given per row (as the server's rows carry them) warp alike
    rows = {name: np.full((6, 1), value, "int32" if name == "top_k" else "float32") for name, value in settings.items()}
    temperature = rows.pop("temperature")
    per_row = ops.convert_to_numpy(warp(logits, temperature, **rows))
    np.testing.assert_array_equal(per_row > LARGE_NEGATIVE / 2, kept)


def test_the_searched_nucleus_keeps_what_an_exact_sort_keeps(rng):
    """400 rows of 2,000 logits at scales 0.5 to 6 with top-p 0.05 to 0.999: the nucleus found without a sort
    keeps the tokens a float64 sort's cumulative sum keeps, but where that sum at the boundary is within float32
    rounding (1e-5) of top-p."""
    logits = (rng.normal(size=(400, 2000)) * rng.uniform(0.5, 6, (400, 1))).astype("float32")
    top_p = rng.uniform(0.05, 0.999, (400, 1)).astype("float32")
    kept = ops.convert_to_numpy(nucleus(logits, top_p)) > LARGE_NEGATIVE / 2
    probabilities = np.exp(logits - logits.max(-1, keepdims=True).astype("float64"))
    probabilities /= probabilities.sum(-1, keepdims=True)
    descending = -np.sort(-probabilities, axis=-1)
    before = np.cumsum(descending, axis=-1) - descending
    count = (before < top_p).sum(-1)  # the sort keeps its first `count`, and their ties
    exact = probabilities >= descending[np.arange(400), count - 1][:, None]
    near = np.abs(np.take_along_axis(before, np.stack([count - 1, np.minimum(count, 1999)], 1), 1) - top_p).min(1)
    assert (near < 1e-5).sum() < 8
    np.testing.assert_array_equal(kept[near >= 1e-5], exact[near >= 1e-5])
    assert kept.sum(-1).min() >= 1 and (ops.convert_to_numpy(nucleus(logits, 1.0)) == logits).all()


def test_rows_with_different_settings_choose_as_each_would_alone(rng):
    """Six rows, each with its own settings (two greedy), chosen in one call: each row's token is the one
    it chooses alone with the batch-wide `Sampler` and the same seed and position."""
    logits = rng.normal(size=(6, 40)).astype("float32") * 2
    configs = [GenerationConfig(**s) for s in SETTINGS] + [GenerationConfig()]
    seeds, positions = row_seeds(5, 6), np.arange(6, dtype="int32") + 3
    columns = list(zip(*[row_values(c, 0, dtypes=True) for c in configs]))
    settings = RowSettings(*(np.asarray([v for v, _ in column], column[0][1]) for column in columns))
    settings = settings._replace(seed=seeds)
    features = features_of(settings)
    assert features[:5] == (True, 16, True, True, True)  # rows that sample without a cut beside rows that cut
    chosen = ops.convert_to_numpy(choose(logits, None, settings, positions, features)[0])
    for i, config in enumerate(configs):
        sampler = Sampler(config.temperature, config.top_k, config.top_p, config.min_p)
        alone = sampler(logits[i : i + 1], seeds[i : i + 1], positions[i : i + 1])
        assert chosen[i] == ops.convert_to_numpy(alone)[0]


def test_draws_follow_the_softmax_across_blocks_and_never_take_a_masked_token(rng):
    """40,000 draws (seeds by row, four positions): each allowed token's count within 5 standard deviations of
    its softmax share, none of another, where the allowed tokens sit at the edges of the draw's blocks, one block
    has none and the last is padded; and a chi-square over 1,000 tokens of random logits below its 6-sigma
    bound (999 degrees of freedom)."""
    width, rows = 1000, 10_000
    allowed = np.array([3, 255, 256, 999])  # blocks 0, 0, 1 and 3 of 256 tokens; block 2 has none
    sparse = np.full(width, LARGE_NEGATIVE, "float32")
    sparse[allowed] = [0.0, 1.0, -0.5, 2.0]
    dense = rng.normal(size=width).astype("float32")
    drawing = one_program(draw)
    for logits in (sparse, dense):
        counts = np.zeros(width)
        for position in range(4):
            seeds = ops.convert_to_tensor(row_seeds(position, rows))
            drawn = drawing(
                ops.convert_to_tensor(np.tile(logits, (rows, 1))), seeds, ops.full((rows,), position, "int32")
            )
            counts += np.bincount(ops.convert_to_numpy(drawn), minlength=width)
        share = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        expected = counts.sum() * share
        if logits is sparse:
            assert counts[np.setdiff1d(np.arange(width), allowed)].sum() == 0
            deviation = np.abs(counts[allowed] - expected[allowed]) / np.sqrt(expected[allowed] * (1 - share[allowed]))
            assert deviation.max() < 5, (counts[allowed], expected[allowed])
        else:
            chi_square = ((counts - expected) ** 2 / expected).sum()
            assert chi_square < 999 + 6 * np.sqrt(2 * 999), chi_square


def test_a_draw_never_picks_a_masked_token_whatever_its_noise():
    """Rows whose noise reaches the top of its range at some token (seeds 905 and 3389 at position 7, tokens 1612
    and 1582 of 8192: each a 2**-24 chance): the draw keeps to the tokens a mask (a grammar, top-k) left."""
    seeds, positions = ops.convert_to_tensor([905, 3389], "int32"), ops.convert_to_tensor([7, 7], "int32")
    uniforms = ops.convert_to_numpy(row_uniforms(seeds, positions, 8192))
    assert uniforms.max() < 1 and uniforms.min() > 0 and uniforms.argmax(-1).tolist() == [1612, 1582]
    warped = np.full((2, 8192), LARGE_NEGATIVE, "float32")
    warped[:, 20:30] = np.linspace(-1.0, 1.0, 10)  # ten tokens allowed
    chosen = draw(ops.convert_to_tensor(warped), seeds, positions)
    assert set(ops.convert_to_numpy(chosen).tolist()) <= set(range(20, 30))


def test_the_greedy_choice_is_argmax_with_its_ties_and_stays_in_range_past_a_nan(rng):
    """Greedy rows take the first of their largest scores, as argmax does, also where several tie, at either
    end of the vocabulary and in a row of one value; a row with a NaN still gets a token of the vocabulary."""
    scores = rng.normal(size=(6, 1000)).astype("float32")
    scores[1, [3, 700]] = 9.0  # a tie: the first
    scores[2, -1] = 9.0
    scores[3] = LARGE_NEGATIVE  # every token masked but one value
    scores[4, 0] = 9.0
    chosen = ops.convert_to_numpy(one_program(first_largest)(ops.convert_to_tensor(scores)))
    np.testing.assert_array_equal(chosen, scores.argmax(-1))
    assert chosen.dtype == np.int32 and chosen[1] == 3
    scores[5, 10] = np.nan
    chosen = ops.convert_to_numpy(first_largest(ops.convert_to_tensor(scores)))
    assert 0 <= chosen[5] < 1000 and (chosen[:5] == scores[:5].argmax(-1)).all()


@pytest.mark.backend_independent
def test_the_settings_object_refuses_bad_values_by_name():
    for name, value, expected in [
        ("temperature", -1, "a finite number >= 0"),
        ("top_p", 0, r"a number in \(0, 1\]"),
        ("min_p", 1.5, r"a number in \[0, 1\]"),
        ("top_k", 2.5, "an integer >= 0"),
        ("max_new_tokens", 0, "an integer >= 1"),
        ("stop_token_ids", [[1, 2]], r"a token id or a flat list of token ids \(such as 2 or \[2, 32000\]\), or None"),
        ("seed", "x", "an integer, or None"),
        ("logit_bias", {-1: 5.0}, r"a mapping of token ids to finite numbers, such as \{50256: -100\}, or None"),
    ]:
        with pytest.raises(InputError, match=f"{name}: `{name}` must be {expected}; received"):
            GenerationConfig(**{name: value})
    with pytest.raises(InputError, match="num_return_sequences: greedy decoding has one continuation"):
        GenerationConfig(num_return_sequences=2)
    with pytest.raises(InputError, match="top_q: generate: unknown decoding setting 'top_q'; the settings are"):
        GenerationConfig.of(None, "generate", top_q=0.5)
    with pytest.raises(InputError, match="temperature: generate: `temperature` must be"):
        GenerationConfig.of(GenerationConfig(), "generate", temperature=float("nan"))
    config = GenerationConfig.of(GenerationConfig(temperature=0.5, seed=1), "generate", top_k=3, seed=None)
    assert (config.temperature, config.top_k, config.seed) == (0.5, 3, 1)  # None overrides nothing
    assert GenerationConfig(logit_bias={7: 1, 2: -3.5}).logit_bias == ((2, -3.5), (7, 1.0))  # hashable, by id
    np.testing.assert_array_equal(row_seeds(-1, 2), np.array([2**32 - 1, 0x9E3779B9 - 1], np.uint32).astype("int32"))


def test_logit_bias_adds_to_the_scores_as_transformers_sequence_bias_does(rng):
    """transformers' `SequenceBiasLogitsProcessor` with one-token sequences is OpenAI's `logit_bias`."""
    torch = pytest.importorskip("torch")
    generation = pytest.importorskip("transformers.generation.logits_process")
    logits = rng.normal(size=(3, 40)).astype("float32")
    bias = {4: -100.0, 17: 2.5, 39: 0.75}
    expected = generation.SequenceBiasLogitsProcessor({(k,): v for k, v in bias.items()})(
        torch.zeros((3, 1), dtype=torch.long), torch.tensor(logits)
    )
    config = GenerationConfig(logit_bias=bias)
    ours = controlled(logits, None, config_settings(config), Features(biased=True), bias_of(config.logit_bias, 40))
    np.testing.assert_allclose(ops.convert_to_numpy(ours), expected.numpy(), rtol=1e-6)


def test_a_stop_waits_for_min_new_tokens_unless_nothing_else_is_allowed(rng):
    """Three rows whose likeliest token is the stop: one before its minimum (the stop is forbidden), one before it
    whose mask (a grammar's end) allows the stop alone (it stays: waiting would choose a forbidden token), one past
    it."""
    logits = rng.normal(size=(3, 10)).astype("float32")
    logits[:, 4] = 5.0
    bias = np.zeros((3, 10), "float32")
    bias[1, :4], bias[1, 5:] = LARGE_NEGATIVE, LARGE_NEGATIVE
    settings = config_settings(GenerationConfig(min_new_tokens=3))
    scores = controlled(ops.convert_to_tensor(logits), None, settings, Features(biased=True, min_new_tokens=True),
                        ops.convert_to_tensor(bias), new_tokens=ops.convert_to_tensor([1, 1, 3], "int32"),
                        stop_token_ids=ops.convert_to_tensor([4], "int32"))  # fmt: skip
    scores = ops.convert_to_numpy(scores)
    assert scores.argmax(-1).tolist() == [np.where(np.arange(10) == 4, -np.inf, logits[0]).argmax(), 4, 4]
    np.testing.assert_array_equal(scores[0, :4], logits[0, :4])
    np.testing.assert_array_equal(scores[2], logits[2])


def test_new_sampling_and_control_values_replay_one_program_and_choose_as_a_fresh_one():
    """A notebook that tries temperatures, top-k values up to one power of two, top-p, penalties, biases and
    minimums compiles once (the numbers are the loop's inputs), and each call chooses what a model compiled for
    those numbers alone chooses: on every backend's compiled loop (XLA, PyTorch's replayed trace)."""
    import keras

    import keras_tfm

    keras.utils.set_random_seed(0)
    model = keras_tfm.GPT(vocabulary_size=64, max_length=32, num_layers=1, num_heads=2, hidden_dim=16)
    prompts = [[5, 6, 7], [8, 9]]
    tries = [
        dict(temperature=0.6, top_k=20, top_p=0.9, repetition_penalty=1.3, logit_bias={5: 2.0}, min_new_tokens=2),
        dict(temperature=1.7, top_k=30, top_p=0.6, repetition_penalty=0.7, logit_bias={9: -4.0}, min_new_tokens=5),
        dict(temperature=1.1, top_k=17, top_p=0.99, repetition_penalty=2.0, logit_bias={3: 5.0}, min_new_tokens=1),
    ]
    chosen = [model.generate(prompts, max_new_tokens=6, seed=4, stop_token_ids=[2], **each) for each in tries]
    assert len(model.compiled_decoding()) == 1
    assert len({tuple(np.asarray(ids).ravel()) for ids in chosen}) == len(tries)  # the numbers change the tokens
    for each, ids in zip(tries, chosen):
        fresh = keras_tfm.GPT.from_config(model.get_config())
        fresh.build()
        fresh.set_weights(model.get_weights())
        fresh_ids = fresh.generate(prompts, max_new_tokens=6, seed=4, stop_token_ids=[2], **each)
        np.testing.assert_array_equal(np.asarray(fresh_ids), np.asarray(ids))
