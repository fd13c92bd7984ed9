import numpy as np
import pytest

import keras_tfm
from tests.checks import assert_close, run_layer_checks, to_numpy

PAD, START, END = 0, 1, 2


def tiny_translator(**overrides):
    config = dict(
        source_vocabulary_size=30,
        target_vocabulary_size=25,
        num_encoder_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_length=24,
        dropout=0.0,
    )
    return keras_tfm.Translator(**{**config, **overrides})


def peaked(model):
    model.build()
    model.set_weights([w * 6.0 if w.ndim == 2 else w for w in model.get_weights()])
    return model


def sources(rng, lengths):
    ids = np.zeros((len(lengths), max(lengths)), "int32")
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(3, 30, size=n)
    return ids


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {
            "norm_first": True,
            "positions": "learned",
            "tie_embeddings": False,
            "share_embeddings": True,
            "target_vocabulary_size": 30,
            "use_output_bias": True,
        },
    ],
)
def test_translator_passes_common_checks(tmp_path, rng, variant):
    source = sources(rng, [7, 4])
    target = rng.integers(3, 25, size=(2, 6)).astype("int32")
    run_layer_checks(  # mixed precision does not depend on these options: checked once, on the first
        lambda **kw: tiny_translator(**{**variant, "dropout": 0.1, **kw}),
        (source, target),
        tmp_path=tmp_path,
        mixed_precision=not variant,
    )


def test_source_padding_is_ignored_and_target_is_causal(rng):
    model = tiny_translator()
    source = sources(rng, [5])
    padded = np.concatenate([source, np.zeros((1, 4), "int32")], axis=1)
    target = rng.integers(3, 25, size=(1, 7)).astype("int32")
    assert_close(model((source, target)), model((padded, target)))
    changed = target.copy()
    changed[:, 4:] = 3
    assert_close(to_numpy(model((source, target)))[:, :4], to_numpy(model((source, changed)))[:, :4])


def full_forward_greedy(model, source, steps):
    target = np.zeros((1, steps + 1), "int32")
    target[0, 0] = START
    for t in range(steps):
        token = to_numpy(model((source, target)))[0, t].argmax()
        target[0, t + 1] = token
        if token == END:
            break
    return target[0, 1:]


def test_cached_greedy_translation_equals_full_forward_greedy(rng):
    model = peaked(tiny_translator())
    for length in (3, 8):
        source = sources(rng, [length])
        assert model.translate(source, max_length=10)[0].tolist() == full_forward_greedy(model, source, 10).tolist()


def test_a_quantized_model_translates_as_its_full_forward_passes(rng):
    # its reloaded .keras file gives the same logits: tests/models/test_base.py
    model = peaked(tiny_translator())
    model.quantize("int8")
    source = sources(rng, [6])
    assert model.translate(source, max_length=10)[0].tolist() == full_forward_greedy(model, source, 10).tolist()


@pytest.mark.parametrize("beam_size", [1, 4])
def test_ragged_batch_translates_each_sentence_as_if_alone(rng, beam_size):
    model = peaked(tiny_translator(norm_first=True))
    batch = [list(rng.integers(3, 30, size=n)) for n in (6, 2)]
    together = model.translate(batch, max_length=8, beam_size=beam_size)
    assert together.shape == (2, 8)
    for row, sentence in zip(together, batch):
        assert row.tolist() == model.translate([sentence], max_length=8, beam_size=beam_size)[0].tolist()


@pytest.mark.parametrize("beam_size", [1, 3])
def test_one_sentence_translates_as_a_batch_of_one(rng, beam_size):
    model = peaked(tiny_translator())
    sentence = [int(t) for t in rng.integers(3, 30, size=5)]
    expected = model.translate([sentence], max_length=7, beam_size=beam_size)
    assert expected.shape == (1, 7)
    for one in (sentence, np.array(sentence, "int32")):
        np.testing.assert_array_equal(model.translate(one, max_length=7, beam_size=beam_size), expected)


def test_beam_search_scores_at_least_greedy(rng):
    model = peaked(tiny_translator())
    source = sources(rng, [6, 5, 7, 4])

    def log_probability(translation, row):
        n = next((i + 1 for i, t in enumerate(translation) if t == END), len(translation))
        target = np.concatenate([[START], translation[: n - 1]])[None].astype("int32")
        logits = to_numpy(model((source[row : row + 1], target)))[0].astype("float64")
        log_probs = (
            logits
            - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
            - logits.max(-1, keepdims=True)
        )
        return log_probs[np.arange(n), translation[:n]].sum(), n

    greedy = model.translate(source, max_length=6)
    beam = model.translate(source, max_length=6, beam_size=4, length_penalty=0.0)
    for row in range(4):
        assert log_probability(beam[row], row)[0] >= log_probability(greedy[row], row)[0] - 1e-4


def test_sizes_and_errors():
    small = keras_tfm.transformer_small(source_vocabulary_size=8000, target_vocabulary_size=6000)
    small.build()
    encoder_layer = 4 * (256 * 256 + 256) + (256 * 512 + 512) + (512 * 256 + 256) + 2 * 2 * 256
    decoder_layer = encoder_layer + 4 * (256 * 256 + 256) + 2 * 256  # + cross-attention and its LayerNorm
    assert small.count_params() == (8000 + 6000) * 256 + 3 * encoder_layer + 3 * decoder_layer == 7_537_664
    base = keras_tfm.transformer_base()
    assert (base.num_encoder_layers, base.hidden_dim, base.intermediate_dim, base.num_heads) == (6, 512, 2048, 8)
    big = keras_tfm.transformer_big()
    assert (big.hidden_dim, big.intermediate_dim, big.num_heads, big.dropout) == (1024, 4096, 16, 0.3)
    with pytest.raises(ValueError, match="share_embeddings=True needs one vocabulary"):
        tiny_translator(share_embeddings=True)
    model = tiny_translator()
    with pytest.raises(ValueError, match="source length 30 exceeds the model's max_length=24"):
        model.translate(np.ones((1, 30), "int32"))
    with pytest.raises(ValueError, match="every source needs at least one token that is not pad_token_id=0; row 1"):
        model.translate([[5, 6], []])
    with pytest.raises(
        ValueError,
        match=r"`source_ids` must be \(batch, length\), one sentence \(length,\) or a list "
        r"of lists; received shape \(1, 1, 3\)",
    ):
        model.translate(np.ones((1, 1, 3), "int32"))
    with pytest.raises(ValueError, match=r"`source_ids` must hold at least one source; received shape \(0, 3\)"):
        model.translate(np.zeros((0, 3), "int32"))
    with pytest.raises(ValueError, match=r"source_ids: must hold ids in \[0, vocabulary_size=30\); received 30"):
        model.translate(np.array([[5, 30, 0]]))
    with pytest.raises(ValueError, match="positions must be 'sinusoidal' or 'learned'"):
        tiny_translator(positions="rotary")
    with pytest.raises(ValueError, match="`length_penalty` must be a finite number; received nan"):
        model.translate([[5, 6]], beam_size=2, length_penalty=float("nan"))
    with pytest.raises(ValueError, match="`beam_size` must be an integer >= 1; received 0"):
        model.translate([[5, 6]], beam_size=0)
    with pytest.raises(ValueError, match="`max_length` must be an integer >= 1; received 0"):
        model.translate([[5, 6]], max_length=0)


@pytest.mark.backend_independent  # translation itself on every backend: the tests above
def test_a_translator_with_its_two_tokenizers_translates_text_and_keeps_them_in_its_keras_file(tmp_path):
    from keras_tfm.data import TranslationTokenizer, WordPieceTokenizer
    from keras_tfm.errors import InputError

    source = WordPieceTokenizer.fit("ein hund läuft\nzwei hunde laufen\n" * 20, vocabulary_size=60)
    target = WordPieceTokenizer.fit("a dog runs\ntwo dogs run\n" * 20, vocabulary_size=60, lowercase=False)
    model = keras_tfm.transformer_small(
        source_vocabulary_size=source.vocabulary_size,
        target_vocabulary_size=target.vocabulary_size,
        num_encoder_layers=1,
        num_decoder_layers=1,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
        start_token_id=target.token_id("[START]"),
        end_token_id=target.token_id("[END]"),
    )
    ids = model.translate([source.encode("ein hund läuft").tolist()], max_length=6)[0].tolist()
    with pytest.raises(InputError, match="text needs a tokenizer with both sides"):
        model.translate("ein hund läuft")
    model.tokenizer = TranslationTokenizer(source, target)
    end = target.token_id("[END]")
    expected = target.decode([i for i in (ids[: ids.index(end)] if end in ids else ids) if i])
    assert model.translate("ein hund läuft", max_length=6) == expected
    assert model.translate(["ein hund läuft", "zwei hunde"], max_length=6)[0] == expected
    model.save(tmp_path / "translator.keras")
    loaded = keras_tfm.load_model(tmp_path / "translator.keras")
    assert isinstance(loaded.tokenizer, TranslationTokenizer)
    assert loaded.translate("ein hund läuft", max_length=6) == expected
