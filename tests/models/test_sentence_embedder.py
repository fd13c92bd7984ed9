"""Sentence embeddings against sentence-transformers on the same checkpoints (small random BERTs written here):
its files read and written, its vectors given, its contrastive loss trained."""

import json
import os
import shutil

import keras
import numpy as np
import pytest

import keras_tfm
from tests.checks import bert_vocabulary

sentence_transformers = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")

CORPUS = "The cat sat on the mat. A dog runs fast in the park! Hello world, from a small random encoder."
TEXTS = [
    "The cat sat on the mat.",
    "",  # [CLS] [SEP] alone
    "hello world " * 30,  # past max_seq_length: cut as sentence-transformers cuts it
    "A DOG runs fast",
    "unknownword zzz",
    "the",
    "Hello, world! The park.",
]


def encoder_checkpoint(directory, hidden_dim: int = 32) -> str:
    """A random BertModel and its WordPiece tokenizer (tokenizer.json), as transformers saves them."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.txt"), "w") as file:
        file.write("\n".join(bert_vocabulary(CORPUS)) + "\n")
    tokenizer = transformers.BertTokenizerFast(os.path.join(directory, "vocab.txt"), do_lower_case=False)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=hidden_dim, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=2 * hidden_dim, max_position_embeddings=64,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def st_checkpoint(
    directory, pooling="mean", normalize=True, max_seq_length=12, lowercase=False, prompts=None, dense=()
):
    """A sentence-transformers directory as its current version writes it (`dense`: its Dense modules'
    `(in_features, out_features, bias, activation)`)."""
    from sentence_transformers import SentenceTransformer, models

    bert = encoder_checkpoint(os.path.join(directory, "bert"))
    modules = [models.Transformer(bert, max_seq_length=max_seq_length, do_lower_case=lowercase)]
    modules += [models.Pooling(32, pooling_mode=pooling)]
    modules += [models.Dense(*sizes, bias=bias, activation_function=activation) for *sizes, bias, activation in dense]
    modules += [models.Normalize()] * normalize
    SentenceTransformer(modules=modules, device="cpu", prompts=prompts).save(os.path.join(directory, "st"))
    return os.path.join(directory, "st")


def legacy_st_checkpoint(directory) -> str:
    """A directory as sentence-transformers 2 wrote them (all-MiniLM-L6-v2's layout): the model at the top,
    `sentence_transformers.models.*` types, the pooling's `pooling_mode_*` flags, `max_seq_length` in
    sentence_bert_config.json."""
    encoder_checkpoint(directory)
    files = {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ],
        "sentence_bert_config.json": {"max_seq_length": 10, "do_lower_case": True},
        "1_Pooling/config.json": {
            "word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_max_tokens": True,
            "pooling_mode_mean_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        },
    }  # fmt: skip
    for name, content in files.items():
        os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
        with open(os.path.join(directory, name), "w") as file:
            json.dump(content, file)
    return str(directory)


def assert_same_vectors(ours, expected):
    cosine = (ours * expected).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(expected, axis=-1)
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(ours, expected, atol=1e-5)


CASES = {
    "mean, normalized": dict(pooling="mean"),
    "weighted, last, sqrt; e5 prompts": dict(
        pooling=("weightedmean", "lasttoken", "mean_sqrt_len_tokens"),
        normalize=False,
        prompts={"query": "query: ", "passage": "passage: "},
    ),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """Each case's checkpoint, written once for the tests that read it."""
    return {case: st_checkpoint(tmp_path_factory.mktemp("case"), **settings) for case, settings in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_embeddings_are_sentence_transformers_on_its_checkpoint(checkpoints, case):
    settings = CASES[case]
    directory = checkpoints[case]
    reference = sentence_transformers.SentenceTransformer(directory, device="cpu")
    embedder = keras_tfm.from_huggingface(directory)
    assert isinstance(embedder, keras_tfm.SentenceEmbedder) and embedder.max_sequence_length == 12
    assert embedder.pooling == tuple(np.atleast_1d(settings["pooling"])) and embedder.normalize == settings.get(
        "normalize", True
    )
    assert_same_vectors(embedder.embed(TEXTS, batch_size=3), reference.encode(TEXTS))
    assert_same_vectors(embedder.embed(TEXTS[0]), reference.encode(TEXTS[0]))  # one text: one vector
    if "prompts" in settings:
        assert_same_vectors(embedder.embed(TEXTS, prompt_name="query"), reference.encode(TEXTS, prompt_name="query"))
        assert_same_vectors(embedder.embed(TEXTS, prompt="Q: "), reference.encode(TEXTS, prompt="Q: "))


def test_sentence_transformers_2_files_load_lowercased_and_cut(tmp_path):
    directory = legacy_st_checkpoint(tmp_path)
    embedder = keras_tfm.from_huggingface(directory)
    assert (embedder.pooling, embedder.normalize, embedder.max_sequence_length, embedder.lowercase) == (
        ("cls", "max"), False, 10, True,
    )  # fmt: skip
    reference = sentence_transformers.SentenceTransformer(directory, device="cpu")
    assert_same_vectors(embedder.embed(TEXTS, batch_size=4), reference.encode(TEXTS))


def test_a_saved_embedder_is_read_by_sentence_transformers_and_by_keras(tmp_path):
    """Dense modules too (LaBSE's tanh projection; a second one without bias or activation)."""
    import torch

    dense = [(64, 24, True, torch.nn.Tanh()), (24, 16, False, torch.nn.Identity())]
    directory = st_checkpoint(tmp_path, pooling=("max", "mean"), lowercase=True, dense=dense)
    embedder = keras_tfm.from_huggingface(directory)
    assert embedder.projections == [
        {"units": 24, "activation": "tanh", "use_bias": True}, {"units": 16, "activation": "linear", "use_bias": False}
    ]  # fmt: skip
    expected = embedder.embed(TEXTS)
    assert expected.shape == (len(TEXTS), 16)
    lowered = [text.lower() for text in TEXTS]  # sentence-transformers 6 reads its own lowercasing back without it
    reference = sentence_transformers.SentenceTransformer(directory, device="cpu")
    assert_same_vectors(embedder.embed(lowered), reference.encode(lowered))
    keras_tfm.save_huggingface(embedder, str(tmp_path / "saved"))
    keras_tfm.save_huggingface(embedder, str(tmp_path / "saved"), overwrite=True)  # its module folders replaced
    reference = sentence_transformers.SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert_same_vectors(expected, reference.encode(TEXTS))
    assert_same_vectors(keras_tfm.from_huggingface(str(tmp_path / "saved")).embed(TEXTS), expected)
    embedder.save(str(tmp_path / "embedder.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "embedder.keras"))
    assert loaded.get_config() == embedder.get_config() and loaded.pooling == ("max", "mean")
    assert_same_vectors(loaded.embed(TEXTS), expected)
    config = json.load(open(tmp_path / "saved" / "3_Dense" / "config.json"))
    json.dump({**config, "activation_function": "torch.nn.modules.activation.Softplus"},
              open(tmp_path / "saved" / "3_Dense" / "config.json", "w"))  # fmt: skip
    with pytest.raises(ValueError, match=r"3_Dense'.*activation 'torch.nn.modules.activation.Softplus' from 24"):
        keras_tfm.from_huggingface(str(tmp_path / "saved"))


def test_fit_with_in_batch_negatives_learns_which_texts_pair(checkpoints):
    """Each text's pair is its words each replaced by another word (a fixed mapping, a "translation"): the
    two share no word, so at first the pair scores like any other text of the batch (loss near ln 8 = 2.08
    for batches of 8); trained with the default loss (in-batch negatives), far below that."""
    words = sorted(set(CORPUS.lower().replace(".", "").replace("!", "").replace(",", "").split()))
    rng = np.random.default_rng(0)
    translated = dict(zip(words, np.roll(words, 7)))
    anchors = [list(rng.choice(words, 4, replace=False)) for _ in range(64)]
    pairs = [(" ".join(text), " ".join(translated[word] for word in text)) for text in anchors]
    embedder = keras_tfm.from_huggingface(checkpoints["mean, normalized"])
    inputs = embedder.tokenize(pairs)
    assert inputs["token_ids"].shape[:2] == (64, 2)
    embedder.compile(optimizer=keras.optimizers.Adam(3e-3))  # the default loss: MultipleNegativesRankingLoss
    before = embedder.evaluate(inputs, batch_size=8, verbose=0)
    embedder.fit(inputs, batch_size=8, epochs=10, shuffle=True, verbose=0)
    after = embedder.evaluate(inputs, batch_size=8, verbose=0)
    assert before > 1.8 and after < 0.7, (before, after)


def test_bad_inputs_are_refused_by_name(checkpoints, tmp_path):
    shutil.copytree(checkpoints["weighted, last, sqrt; e5 prompts"], tmp_path / "st")
    embedder = keras_tfm.from_huggingface(str(tmp_path / "st"))
    for texts in ([], [1, 2], None, [("a", "b")]):
        with pytest.raises(ValueError, match=r"texts: embed: expected"):
            embedder.embed(texts)
    with pytest.raises(ValueError, match=r"batch_size: embed: expected an integer >= 1; received 0"):
        embedder.embed(["a"], batch_size=0)
    with pytest.raises(ValueError, match=r"prompt_name: embed: expected one of \['passage', 'query'\]; received 'doc'"):
        embedder.embed(["a"], prompt_name="doc")
    with pytest.raises(ValueError, match=r"give `prompt_name` or `prompt`, not both"):
        embedder.embed(["a"], prompt_name="query", prompt="q: ")
    with pytest.raises(ValueError, match=r"expected rows of 2 texts each; received rows of \[1, 2\]"):
        embedder.tokenize([("a", "b"), ("c",)])
    bare = keras_tfm.SentenceEmbedder(embedder.encoder)
    with pytest.raises(ValueError, match=r"tokenizer: SentenceEmbedder: this embedder has no tokenizer"):
        bare.embed(["a"])
    with pytest.raises(ValueError, match=r"encoder: SentenceEmbedder: expected a token encoder"):
        keras_tfm.SentenceEmbedder(keras.layers.Dense(3))
    modules = os.path.join(tmp_path, "st", "modules.json")
    listed = json.load(open(modules))
    json.dump(
        listed + [{"idx": 3, "path": "3_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}],
        open(modules, "w"),
    )
    with pytest.raises(
        ValueError, match=r"module 'sentence_transformers.models.LayerNorm' is not supported; supported"
    ):
        keras_tfm.from_huggingface(os.path.join(tmp_path, "st"))
    with pytest.raises(
        ValueError, match=r"projections: SentenceEmbedder: expected each a dict .*; received \{'units': 0\}"
    ):
        keras_tfm.SentenceEmbedder(embedder.encoder, projections=[{"units": 0}])
    with pytest.raises(ValueError, match=r"received \{'units': 4, 'activation': 'softplus2'\}"):
        keras_tfm.SentenceEmbedder(embedder.encoder, projections=[{"units": 4, "activation": "softplus2"}])
    elu = keras_tfm.SentenceEmbedder(embedder.encoder, projections=[{"units": 4, "activation": "elu"}])
    with pytest.raises(ValueError, match=r"activation 'elu' has no sentence-transformers Dense module"):
        keras_tfm.save_huggingface(elu, str(tmp_path / "elu"))


def test_a_roberta_encoder_embeds_as_sentence_transformers(tmp_path):
    """The same path for another encoder family: RoBERTa (positions from 2, a byte-level BPE with <s> ... </s>)."""
    from sentence_transformers import SentenceTransformer, models
    from tokenizers import ByteLevelBPETokenizer, processors

    learner = ByteLevelBPETokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    learner.train_from_iterator([CORPUS] * 5, vocab_size=300, special_tokens=specials, show_progress=False)
    learner._tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=learner._tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        mask_token="<mask>", cls_token="<s>", sep_token="</s>",
    )  # fmt: skip
    config = transformers.RobertaConfig(
        vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=34, type_vocab_size=1, pad_token_id=1,
    )  # fmt: skip
    transformers.RobertaModel(config).save_pretrained(tmp_path / "roberta")
    tokenizer.save_pretrained(tmp_path / "roberta")
    modules = [models.Transformer(str(tmp_path / "roberta"), max_seq_length=16), models.Pooling(32, "mean")]
    SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "st"))
    embedder = keras_tfm.from_huggingface(str(tmp_path / "st"))
    assert embedder.encoder.position_offset == 2
    reference = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    assert_same_vectors(embedder.embed(TEXTS, batch_size=3), reference.encode(TEXTS))


def test_a_modernbert_encoder_embeds_as_sentence_transformers(tmp_path):
    """ModernBERT (no segments, rotary positions, local attention over 4 tokens on each side) under [CLS] pooling."""
    from sentence_transformers import SentenceTransformer, models

    directory = encoder_checkpoint(tmp_path / "bert")
    sizes = json.load(open(os.path.join(directory, "config.json")))
    config = transformers.ModernBertConfig(
        vocab_size=sizes["vocab_size"], hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=48, local_attention=8, pad_token_id=0, bos_token_id=None, eos_token_id=None,
        cls_token_id=None, sep_token_id=None,
    )  # fmt: skip
    transformers.ModernBertModel(config).save_pretrained(directory)
    modules = [models.Transformer(directory, max_seq_length=16), models.Pooling(32, "cls"), models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "st"))
    embedder = keras_tfm.from_huggingface(str(tmp_path / "st"))
    assert isinstance(embedder.encoder, keras_tfm.ModernBert)
    reference = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    assert_same_vectors(embedder.embed(TEXTS, batch_size=3), reference.encode(TEXTS))
