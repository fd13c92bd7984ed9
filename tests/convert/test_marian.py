"""keras_tfm Translator vs Hugging Face Marian built from small random configurations (no network)."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCABULARY, PAD, EOS = 61, 60, 0
# A checkpoint with its own target vocabulary (`share_encoder_decoder_embeddings=False`); Marian's
# padding id is the same in both, so the target vocabulary must hold PAD too.
TARGET_VOCABULARY = 73
SEPARATE = {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": TARGET_VOCABULARY}


def hf_marian(init_std=0.02, **config):
    torch.manual_seed(0)
    defaults = dict(
        vocab_size=VOCABULARY,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
        init_std=init_std,
    )
    return transformers.MarianMTModel(transformers.MarianConfig(**{**defaults, **config})).eval()


def ragged_sources(rng, lengths):
    """Sources ending in EOS, right-padded with PAD, and the attention mask HF wants."""
    width = max(lengths)
    ids = np.full((len(lengths), width), PAD, "int64")
    for i, n in enumerate(lengths):
        ids[i, : n - 1] = rng.integers(1, PAD, size=n - 1)
        ids[i, n - 1] = EOS
    return ids, (ids != PAD).astype("int64")


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"activation_function": "swish", "scale_embedding": True},
        SEPARATE,
        {**SEPARATE, "tie_word_embeddings": False},
    ],
)
def test_logits_match_with_padded_sources(rng, config):
    hf = hf_marian(**config)
    with torch.no_grad():  # a non-zero final_logits_bias, so the test sees whether it is loaded
        hf.final_logits_bias.copy_(torch.randn_like(hf.final_logits_bias))
    model = keras_tfm.from_huggingface(hf)
    source, source_mask = ragged_sources(rng, [9, 5, 7])
    target_vocabulary = hf.config.decoder_vocab_size
    target = np.concatenate([np.full((3, 1), PAD), rng.integers(1, target_vocabulary, size=(3, 6))], axis=1)
    with torch.no_grad():
        expected = hf(
            input_ids=torch.tensor(source),
            attention_mask=torch.tensor(source_mask),
            decoder_input_ids=torch.tensor(target),
        ).logits.numpy()
    assert expected.shape[-1] == target_vocabulary
    got = to_numpy(model({"source_ids": source.astype("int32"), "target_ids": target.astype("int32")}))
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("config", [{}, SEPARATE])
def test_parameter_count_equals_hugging_face_without_its_fixed_position_tables(config):
    hf = hf_marian(**config)
    model = keras_tfm.from_huggingface(hf)
    # Marian stores its sinusoids as (frozen) parameters; ours are computed, so they are not weights.
    positions = sum(p.numel() for name, p in hf.named_parameters() if "embed_positions" in name)
    output_bias = hf.config.decoder_vocab_size  # a buffer in Hugging Face, a (frozen in effect) weight here
    assert model.count_params() - output_bias == sum(p.numel() for p in hf.parameters()) - positions


@pytest.mark.parametrize("beam_size, config", [(1, {}), (3, {}), (3, SEPARATE)])
def test_translations_match_hugging_face_generate(rng, beam_size, config):
    hf = hf_marian(init_std=0.5, **config)  # peaked logits: the argmax is the model's, not float noise
    model = keras_tfm.from_huggingface(hf)
    source, source_mask = ragged_sources(rng, [8, 4, 6])
    with torch.no_grad():
        expected = hf.generate(
            input_ids=torch.tensor(source),
            attention_mask=torch.tensor(source_mask),
            max_new_tokens=12,
            num_beams=beam_size,
            do_sample=False,
            length_penalty=1.0,
            early_stopping=True,
            forced_eos_token_id=None,
        ).numpy()[:, 1:]
    got = model.translate(source, max_length=12, beam_size=beam_size)
    for row_expected, row_got in zip(expected, got):
        n = len(row_expected)
        np.testing.assert_array_equal(row_got[:n], row_expected)
        assert (row_got[n:] == PAD).all()


@pytest.mark.parametrize("config", [{}, SEPARATE])
def test_loads_a_saved_directory(rng, tmp_path, config):
    hf = hf_marian(**config)
    hf.save_pretrained(tmp_path)
    model = keras_tfm.from_huggingface(str(tmp_path))
    source, source_mask = ragged_sources(rng, [6, 6])
    target = np.concatenate([np.full((2, 1), PAD), rng.integers(1, hf.config.decoder_vocab_size, size=(2, 3))], axis=1)
    with torch.no_grad():
        expected = hf(
            input_ids=torch.tensor(source),
            attention_mask=torch.tensor(source_mask),
            decoder_input_ids=torch.tensor(target),
        ).logits.numpy()
    np.testing.assert_allclose(to_numpy(model((source.astype("int32"), target.astype("int32")))), expected, atol=1e-4)


@pytest.fixture(scope="module")
def marian_checkpoint(tmp_path_factory):
    """A checkpoint laid out as opus-mt's: SentencePiece models learned on Multi30k (German source,
    English target), one shared vocab.json of their pieces, and a small random MarianMTModel."""
    import gzip
    import io
    import json
    import os

    import sentencepiece

    from tests.recipes.helpers import MULTI30K

    directory = tmp_path_factory.mktemp("marian")
    pieces = []
    for side, language in (("source", "de"), ("target", "en")):
        with gzip.open(os.path.join(MULTI30K, f"train.{language}.gz"), "rt", encoding="utf-8") as file:
            lines = [next(file).strip() for _ in range(2000)]
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, vocab_size=200, hard_vocab_limit=False, minloglevel=2
        )
        (directory / f"{side}.spm").write_bytes(model.getvalue())
        processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
        pieces += [processor.IdToPiece(i) for i in range(3, processor.GetPieceSize())]  # after <unk>, <s>, </s>
    vocabulary = {"</s>": 0, "<unk>": 1, **{piece: 0 for piece in pieces}}
    vocabulary = {piece: index for index, piece in enumerate(vocabulary)}
    vocabulary["<pad>"] = len(vocabulary)
    (directory / "vocab.json").write_text(json.dumps(vocabulary))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"separate_vocabs": False, "tokenizer_class": "MarianTokenizer"})
    )
    hf = hf_marian(
        init_std=0.5,
        vocab_size=len(vocabulary),
        pad_token_id=len(vocabulary) - 1,
        decoder_start_token_id=len(vocabulary) - 1,
    )
    hf.save_pretrained(str(directory))
    return directory, hf


SENTENCES = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball im Park", "Qx ☃ Żółw!", ">>en<< Ein Kind."]


@pytest.mark.backend_independent
def test_a_marian_checkpoints_tokenizer_gives_transformers_ids_and_text(marian_checkpoint, tmp_path, rng):
    from keras_tfm.data import MarianTokenizer, load_tokenizer, save_tokenizer

    directory, _ = marian_checkpoint
    ours = MarianTokenizer.from_huggingface(str(directory))
    theirs = transformers.MarianTokenizer.from_pretrained(str(directory))
    for sentence in SENTENCES:
        assert ours.encode_source(sentence).tolist() == theirs(sentence)["input_ids"], sentence
    for _ in range(5):  # any ids, special ones among them
        ids = rng.integers(0, ours.vocabulary_size, 12).tolist()
        assert ours.decode_target(ids) == theirs.decode(ids, skip_special_tokens=True)
    reloaded = load_tokenizer(save_tokenizer(ours, str(tmp_path)))
    assert reloaded.encode_source(SENTENCES[0]).tolist() == ours.encode_source(SENTENCES[0]).tolist()


@pytest.mark.backend_independent  # translation on every backend: the tests above
def test_translate_takes_and_returns_text_with_the_checkpoints_tokenizer(marian_checkpoint):
    from keras_tfm.errors import InputError

    directory, hf = marian_checkpoint
    theirs = transformers.MarianTokenizer.from_pretrained(str(directory))
    model = keras_tfm.from_huggingface(str(directory))
    inputs = theirs(SENTENCES[:2], return_tensors="pt", padding=True)
    for controls in ({}, {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2, "min_new_tokens": 4}):
        with torch.no_grad():
            expected = hf.generate(
                **inputs, max_new_tokens=10, num_beams=1, do_sample=False, forced_eos_token_id=None, **controls
            )
        assert model.translate(SENTENCES[:2], max_length=10, **controls) == theirs.batch_decode(
            expected, skip_special_tokens=True
        )
    assert model.translate(SENTENCES[0], max_length=10) == model.translate(SENTENCES[:1], max_length=10)[0]
    model.tokenizer = None
    with pytest.raises(InputError, match="text needs a tokenizer with both sides") as error:
        model.translate("Ein Hund.")
    assert error.value.argument == "source_ids"
