"""Data loading: local text files, the offline default, TFDS failures, tokenizers."""

import gzip
import os

import numpy as np
import pytest

from keras_tfm.data import (
    CharacterTokenizer,
    DataError,
    load_images,
    load_or_fit_tokenizer,
    load_text,
    read_text,
    save_tokenizer,
)
from keras_tfm.data import tfds as tfds_module
from tests.checks import bert_vocabulary

pytestmark = pytest.mark.backend_independent  # text, images and tokenizers: NumPy and Python only

SHARED = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "..", "shared", "data"
)


def test_read_text_file_gzip_and_directory(tmp_path):
    (tmp_path / "a.txt").write_text("first file\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as file:
        file.write("second file\n")
    (tmp_path / "ignored.csv").write_text("x,y\n")
    assert read_text(str(tmp_path)) == "first file\n\nsecond file\n"
    assert read_text(str(tmp_path / "b.txt.gz")) == "second file\n"


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xff\xfe\x00binary", "not UTF-8 text"),
        (b"", "is empty"),
        # an IDX file of labels (0-9): every byte is valid UTF-8, and it trained as text
        (bytes([0, 0, 8, 1, 0, 0, 0, 100]) + bytes(i % 10 for i in range(100)), "looks binary, not text"),
    ],
)
def test_read_text_bad_files(tmp_path, content, message):
    path = tmp_path / "input.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=f"^path: '{path}' .*{message}"):
        read_text(str(path))


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "input.txt.gz"
    whole = gzip.compress(" ".join(str(i * i) for i in range(5000)).encode())
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match="corrupt or unreadable"):
        read_text(str(path))


def test_offline_default_is_announced_and_split_90_10():
    messages = []
    splits = load_text(log=messages.append)
    assert "offline default" in messages[0] and "pydoc_data" in splits.source
    total = len(splits.train) + len(splits.validation)
    assert total > 100_000 and abs(len(splits.train) / total - 0.9) < 1e-3


def test_data_and_dataset_together_is_an_error():
    with pytest.raises(DataError, match="either `data` \\(a path\\) or `dataset` \\(a name\\), not both"):
        load_text("a.txt", "tiny_shakespeare")


def test_tfds_without_network_fails_at_once_with_what_to_pass(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(tfds_module, "network_available", lambda timeout=3.0: False)
    with pytest.raises(DataError, match="^dataset: 'tiny_shakespeare' is not downloaded yet .* pass `data`"):
        load_text(dataset="tiny_shakespeare", data_dir=str(tmp_path))


def test_tfds_unknown_name(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    with pytest.raises(DataError, match="^dataset: tensorflow-datasets does not know 'no_such_dataset_xyz'"):
        load_text(dataset="no_such_dataset_xyz", data_dir=str(tmp_path))


def test_character_tokenizer_round_trip_and_reuse(tmp_path):
    tokenizer = load_or_fit_tokenizer("char", "hello world", str(tmp_path), log=lambda m: None)
    assert tokenizer.vocabulary == sorted(set("hello world"))
    ids = tokenizer.encode("low world")
    assert ids.dtype == np.int32 and tokenizer.decode(ids) == "low world"
    # ids past the vocabulary (a model's vocabulary padded to 64) or negative have no text, not a crash
    assert tokenizer.decode([*ids.tolist(), len(tokenizer.vocabulary), 63, -1]) == "low world"
    again = load_or_fit_tokenizer("char", "hello world", str(tmp_path), log=lambda m: None)
    assert isinstance(again, CharacterTokenizer) and again.vocabulary == tokenizer.vocabulary
    with pytest.raises(DataError, match="fitted on other text"):  # the ids would change meaning
        load_or_fit_tokenizer("char", "completely different text", str(tmp_path), log=lambda m: None)
    (tmp_path / "tokenizer.json").write_text('{"kind": "char", "vocab')  # damaged: cut short
    with pytest.raises(
        DataError, match=r"^the tokenizer file '.*tokenizer.json' is damaged .* delete it to fit"
    ) as info:
        load_or_fit_tokenizer("char", "hello world", str(tmp_path), log=lambda m: None)
    assert info.value.argument is None  # the message names the file, not an argument called `path`


def test_a_checkpoints_damaged_tokenizer_json_is_named_with_what_to_do(tmp_path):
    from keras_tfm.data import HuggingFaceTokenizer

    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match=r"the checkpoint's tokenizer file '.*tokenizer.json' is damaged .* download"):
        HuggingFaceTokenizer.from_huggingface(str(tmp_path))


def test_wordpiece_tokenizer_learns_its_vocabulary(tmp_path):
    text = "the cat sat on the mat\nthe dog sat on the log\n" * 20
    tokenizer = load_or_fit_tokenizer("wordpiece", text, str(tmp_path), vocabulary_size=60, log=lambda m: None)
    assert tokenizer.vocabulary[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    ids = tokenizer.encode("the cat sat on the log")
    assert len(ids) == 6 and tokenizer.decode(ids) == "the cat sat on the log"


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_wordpiece_tokenizer_of_a_hugging_face_checkpoint_gives_its_ids(tmp_path, do_lower_case):
    transformers = pytest.importorskip("transformers")
    from keras_tfm.data import WordPieceTokenizer

    lines = [line for line in read_text(os.path.join(SHARED, "wikitext-2", "valid.txt")).splitlines() if line.strip()][
        :200
    ]
    lines += ["Café Déjà-vu, naïve ÉCOLE!", "Tokens 3.5 x2 (brackets) [and] {braces} -- dashes", "ABC def GHI"]
    (tmp_path / "vocab.txt").write_text("\n".join(bert_vocabulary(" ".join(lines))) + "\n")
    hf = transformers.BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=do_lower_case)
    hf.save_pretrained(str(tmp_path))
    ours = WordPieceTokenizer.from_huggingface(str(tmp_path))
    assert ours.lowercase == ours.strip_accents == do_lower_case
    expected = [hf(line, add_special_tokens=False)["input_ids"] for line in lines]
    assert [row.tolist() for row in ours.encode_lines(lines)] == expected
    assert sum(len(row) for row in expected) > 2000
    ours.save_huggingface(str(tmp_path / "written"))  # and back: transformers reads what we write
    written = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "written"))
    assert [written(line, add_special_tokens=False)["input_ids"] for line in lines] == expected
    (tmp_path / "vocab.txt").unlink()
    with pytest.raises(DataError, match="no vocab.txt"):
        WordPieceTokenizer.from_huggingface(str(tmp_path))


def test_character_tokenizer_is_written_for_transformers(tmp_path):
    """transformers' fast tokenizer reads what we write: the same ids (characters outside the
    vocabulary dropped, as ours drops them) and the same text back, regex metacharacters included."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    with open(os.path.join(SHARED, "tinyshakespeare", "input.txt"), encoding="utf-8") as file:
        text = file.read()
    tokenizer = CharacterTokenizer.fit(text[:100_000] + "[]^\\-$.*?+(){}|\t")
    tokenizer.save_huggingface(str(tmp_path))
    written = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(written) == tokenizer.vocabulary_size
    for sample in (text[-5000:], "  two spaces,\n\nblank lines  ", "naïve café 😀 [x]^y\\z-w", "\t$.*?+(){}|"):
        ours = tokenizer.encode(sample).tolist()
        assert written(sample, add_special_tokens=False)["input_ids"] == ours
        assert written.decode(ours) == tokenizer.decode(ours)
    assert "ï" not in tokenizer.vocabulary and "é" not in tokenizer.vocabulary
    assert written.decode(written("naïve café")["input_ids"]) == "nave caf"


def test_byte_pair_tokenizer_learns_merges_round_trips_and_is_reused(tmp_path):
    with open(os.path.join(SHARED, "tinyshakespeare", "input.txt"), encoding="utf-8") as file:
        text = file.read()
    tokenizer = load_or_fit_tokenizer("bpe", text[:200_000], str(tmp_path), vocabulary_size=600, log=lambda m: None)
    assert tokenizer.kind == "bpe" and tokenizer.vocabulary_size == 600
    unseen = text[-2000:] + "\nnaïve café 😀\n"  # bytes never seen in training still encode (byte-level)
    ids = tokenizer.encode(unseen)
    assert ids.dtype == np.int32 and ids.max() < 600 and tokenizer.decode(ids) == unseen
    assert len(ids) < 0.6 * len(unseen.encode("utf-8"))  # the merges compress: fewer tokens than bytes
    transformers = pytest.importorskip("transformers")
    tokenizer.save_huggingface(str(tmp_path / "written"))
    written = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "written"))
    lines = unseen.splitlines(keepends=True)
    assert [written(line)["input_ids"] for line in lines] == [row.tolist() for row in tokenizer.encode_lines(lines)]
    messages = []
    again = load_or_fit_tokenizer("bpe", text[:200_000], str(tmp_path), vocabulary_size=600, log=messages.append)
    assert "reusing" in messages[0] and np.array_equal(again.encode(unseen), ids)
    # fitted on other text, or with another vocabulary size: its ids would mean other things
    with pytest.raises(DataError, match="fitted on other text; give the earlier run's data and settings"):
        load_or_fit_tokenizer("bpe", text[:100_000], str(tmp_path), vocabulary_size=600, log=lambda m: None)
    with pytest.raises(DataError, match="fitted on other `vocabulary_size`;"):
        load_or_fit_tokenizer("bpe", text[:200_000], str(tmp_path), vocabulary_size=500, log=lambda m: None)
    (tmp_path / "deferred").mkdir()
    unsaved = load_or_fit_tokenizer("char", "abc", str(tmp_path / "deferred"), save=False, log=lambda m: None)
    assert not list((tmp_path / "deferred").iterdir())  # written by save_tokenizer, once the run is accepted
    save_tokenizer(unsaved, str(tmp_path / "deferred"))
    assert load_or_fit_tokenizer("char", "abc", str(tmp_path / "deferred"), log=messages.append).vocabulary == (
        unsaved.vocabulary
    )
    assert "reusing" in messages[-1]


def test_sentencepiece_tokenizer_learns_round_trips_is_reused_and_refuses_another_kind(tmp_path):
    pytest.importorskip("sentencepiece")
    with gzip.open(os.path.join(SHARED, "multi30k", "task1", "raw", "train.de.gz"), "rt", encoding="utf-8") as file:
        lines = [next(file).strip() for _ in range(2000)]
    tokenizer = load_or_fit_tokenizer(
        "sentencepiece", "\n".join(lines[:1900]), str(tmp_path), vocabulary_size=500, log=lambda m: None
    )
    assert tokenizer.kind == "sentencepiece" and tokenizer.vocabulary_size == 500
    assert [tokenizer.token_id(t) for t in ("[PAD]", "[UNK]", "[START]", "[END]")] == [0, 1, 2, 3]
    seen = set("".join(lines[:1900]))
    held_out = [line for line in lines[1900:] if set(line) <= seen]  # a character never seen is [UNK] ("⁇")
    assert len(held_out) >= 90
    rows = tokenizer.encode_lines(held_out)
    assert [tokenizer.decode(row) for row in rows] == held_out  # unseen sentences, cased, umlauts and all
    assert "„" in "".join(held_out)  # a rare character (SentencePiece's default coverage would drop it)
    assert tokenizer.token_id("[UNK]") in tokenizer.encode_lines(["ein ☃ im schnee"])[0] and "☃" not in seen
    ids = np.concatenate(rows)
    assert ids.dtype == np.int32 and ids.min() >= 4 and ids.max() < 500  # no special id inside a sentence
    assert len(ids) < 0.4 * sum(len(line) for line in held_out)  # subwords: far fewer than characters
    messages = []
    again = load_or_fit_tokenizer(
        "sentencepiece", "\n".join(lines[:1900]), str(tmp_path), vocabulary_size=500, log=messages.append
    )
    assert "reusing" in messages[0] and np.array_equal(np.concatenate(again.encode_lines(held_out)), ids)
    with pytest.raises(DataError, match="holds the sentencepiece tokenizer of an earlier run .*not wordpiece"):
        load_or_fit_tokenizer("wordpiece", "other text", str(tmp_path), log=lambda m: None)
    (tmp_path / "lower").mkdir()
    lowercased = load_or_fit_tokenizer(
        "sentencepiece",
        "\n".join(lines),
        str(tmp_path / "lower"),
        vocabulary_size=500,
        log=lambda m: None,
        lowercase=True,
    )
    assert lowercased.decode(lowercased.encode("Ein Hund läuft.")) == "ein hund läuft."
    with pytest.raises(DataError, match="^vocabulary_size: SentencePiece cannot train on this text with 5 pieces"):
        load_or_fit_tokenizer(
            "sentencepiece", "\n".join(lines), str(tmp_path / "lower" / "small"), vocabulary_size=5, log=lambda m: None
        )


def test_byte_pair_tokenizer_of_a_hugging_face_checkpoint_gives_its_ids(tmp_path):
    """GPT-2's files (vocab.json, merges.txt with its #version header) give
    the ids of Hugging Face's GPT2Tokenizer."""
    transformers = pytest.importorskip("transformers")
    import json

    from keras_tfm.data import BytePairTokenizer

    with open(os.path.join(SHARED, "tinyshakespeare", "input.txt"), encoding="utf-8") as file:
        text = file.read()
    learned = BytePairTokenizer.fit(text[:200_000], 500)
    (tmp_path / "vocab.json").write_text(json.dumps(learned.vocabulary))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(learned.merges) + "\n")
    hf = transformers.GPT2Tokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    ours = BytePairTokenizer.from_huggingface(str(tmp_path))
    lines = text[-60_000:].splitlines(keepends=True) + [
        "naïve café 😀 it's 1,234 words -- don't\n",
        "  two  spaces,\ta tab and   three   \n",
        "SHOUT'S 12345\n",
    ]
    expected = hf(lines)["input_ids"]
    assert [row.tolist() for row in ours.encode_lines(lines)] == expected
    assert sum(map(len, expected)) > 10_000
    (tmp_path / "merges.txt").unlink()
    with pytest.raises(DataError, match="no merges.txt"):
        BytePairTokenizer.from_huggingface(str(tmp_path))


FASHION = os.path.join(SHARED, "fashion-mnist")


def test_fashion_mnist_idx_directory():
    splits = load_images(FASHION, log=lambda m: None)
    (train_x, train_y), (test_x, test_y) = splits.train, splits.test
    assert train_x.shape == (60000, 28, 28, 1) and test_x.shape == (10000, 28, 28, 1)
    assert train_x.dtype == np.uint8 and set(np.unique(train_y)) == set(range(10))
    assert np.bincount(test_y).tolist() == [1000] * 10  # balanced, as published


def test_npz_and_image_folder(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "d.npz",
        x_train=rng.integers(0, 255, (6, 4, 4), dtype=np.uint8),
        y_train=np.arange(6) % 2,
        x_test=rng.integers(0, 255, (2, 4, 4), dtype=np.uint8),
        y_test=np.array([0, 1]),
    )
    splits = load_images(str(tmp_path / "d.npz"), log=lambda m: None)
    assert splits.train[0].shape == (6, 4, 4, 1) and splits.test[1].tolist() == [0, 1]
    for split in ("train", "test"):
        for label in ("cat", "dog"):
            (tmp_path / "folder" / split / label).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 255, (5, 5, 3), dtype=np.uint8)).save(
                    tmp_path / "folder" / split / label / f"{i}.png"
                )
    splits = load_images(str(tmp_path / "folder"), log=lambda m: None)
    assert splits.class_names == ["cat", "dog"] and splits.train[0].shape == (6, 5, 5, 3)
    assert splits.train[1].tolist() == [0, 0, 0, 1, 1, 1]
    # photos come in many sizes: a test image of another size is resized with --image-size, refused without
    big = rng.integers(0, 255, (7, 9, 3), dtype=np.uint8)
    Image.fromarray(big).save(tmp_path / "folder" / "test" / "dog" / "big.png")
    with pytest.raises(DataError, match=r"differ in size \(\[\(5, 5, 3\), \(7, 9, 3\)\]...\); give `image_size` N"):
        load_images(str(tmp_path / "folder"), log=lambda m: None)
    splits = load_images(str(tmp_path / "folder"), log=lambda m: None, image_size=6)
    assert splits.train[0].shape == (6, 6, 6, 3) and splits.test[0].shape == (7, 6, 6, 3)
    np.testing.assert_array_equal(splits.test[0][-1], np.asarray(Image.fromarray(big).resize((6, 6), Image.BILINEAR)))
    single = load_images(str(tmp_path / "folder" / "test"), log=lambda m: None, image_size=6)  # one folder, split 90/10
    assert single.train[0].shape == (6, 6, 6, 3) and single.test[0].shape == (1, 6, 6, 3)


def test_npz_arrays_that_would_train_wrong_are_refused_or_read_right(tmp_path):
    """A label -1 indexed the last class, 2.7 became 2, images in [0, 1] were divided by 255 again, a
    channels-first array trained a wrong model, and one class scored a test accuracy of 1.0."""
    rng = np.random.default_rng(0)
    good = dict(
        x_train=rng.integers(0, 255, (6, 5, 5, 3), dtype=np.uint8),
        y_train=np.arange(6) % 2,
        x_test=rng.integers(0, 255, (2, 5, 5, 3), dtype=np.uint8),
        y_test=np.array([0, 1]),
    )

    def load(**changes):
        np.savez(tmp_path / "d.npz", **{**good, **changes})
        return load_images(str(tmp_path / "d.npz"), log=lambda m: None)

    for changes, message in (
        ({"y_train": np.array([0, 1, -1, 0, 1, 0])}, r"labels must be class numbers >= 0; received -1"),
        ({"y_train": np.array([0, 1, 2.7, 0, 1, 0])}, r"labels must be whole class numbers; received 2.7"),
        ({"x_train": good["x_train"].transpose(0, 3, 1, 2)}, r"look channels-first \(6, 3, 5, 5\)"),
        ({"x_train": good["x_train"] / 255.0 - 0.5}, r"float images must hold values in \[0, 1\] or \[0, 255\]"),
        (
            {"x_train": good["x_train"][:5]},
            r"expected images .* one label each; received shapes \(5, 5, 5, 3\) and \(6,\)",
        ),
        ({"y_train": np.zeros(6, int), "y_test": np.zeros(2, int)}, r"at least two classes; found \['0'\]"),
        ({"x_test": good["x_test"][:0], "y_test": good["y_test"][:0]}, r"the test split has no images"),
    ):
        with pytest.raises(DataError, match="^data: .*" + message):
            load(**changes)
    scaled = load(x_train=good["x_train"] / 255.0, y_train=np.arange(6.0) % 2)  # floats in [0, 1]; whole labels
    np.testing.assert_allclose(scaled.train[0], good["x_train"], atol=1e-4)
    assert scaled.train[1].dtype == np.int32 and scaled.train[1].tolist() == [0, 1, 0, 1, 0, 1]
    from PIL import Image

    (tmp_path / "one" / "cat").mkdir(parents=True)
    for i in range(4):
        Image.fromarray(good["x_train"][i]).save(tmp_path / "one" / "cat" / f"{i}.png")
    with pytest.raises(DataError, match=r"^data: local images .*at least two classes; found \['cat'\]"):
        load_images(str(tmp_path / "one"), log=lambda m: None)


def test_offline_digits():
    messages = []
    splits = load_images(log=messages.append)
    assert "offline default" in messages[0] and splits.train[0].shape[1:] == (8, 8, 1)
    assert splits.train[0].max() == 255 and len(splits.train[0]) + len(splits.test[0]) == 1797


def test_corrupt_idx_missing_labels_and_a_file_that_is_not_npz(tmp_path):
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + (10).to_bytes(4, "big") * 3 + b"\x00" * 7)
    with pytest.raises(DataError, match="not a readable IDX file .*header says \\(10, 10, 10\\), but 7 values follow"):
        load_images(str(tmp_path), log=lambda m: None)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + (1).to_bytes(4, "big") * 3 + b"\x00")
    with pytest.raises(DataError, match="has no train-labels-idx1-ubyte"):
        load_images(str(tmp_path), log=lambda m: None)
    (tmp_path / "images.txt").write_bytes(b"\x00\x01")  # was a NotADirectoryError from os.listdir
    with pytest.raises(
        DataError,
        match="expected an IDX directory, an .npz file or an image folder; .*images.txt' is a "
        "file without the .npz suffix",
    ):
        load_images(str(tmp_path / "images.txt"), log=lambda m: None)


def test_multi30k_directory_and_tab_separated_pairs(tmp_path):
    from keras_tfm.data import load_parallel

    splits = load_parallel(
        os.path.join(SHARED, "multi30k", "task1", "raw"), source_language="de", target_language="en", log=lambda m: None
    )
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (29000, 1014, 1000)
    assert splits.train[0][1].startswith("Two young, White males")  # English side, cased and raw
    tokenized = load_parallel(os.path.join(SHARED, "multi30k", "task1", "tok"), log=lambda m: None)
    assert (
        tokenized.test[0][1] == splits.test[0][1].lower().replace(".", " .").strip() or tokenized.test[0][1].islower()
    )
    assert len(tokenized.test) == 1000
    tsv = tmp_path / "pairs.txt"
    tsv.write_text("".join(f"go {i}\tve {i}\tCC-BY\n" for i in range(100)))
    splits = load_parallel(str(tsv), swap=True, log=lambda m: None)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (90, 5, 5)
    assert all(s.startswith("ve ") and t.startswith("go ") for s, t in splits.train)


def test_parallel_errors(tmp_path):
    from keras_tfm.data import load_parallel

    (tmp_path / "train.de").write_text("a\nb\n")
    (tmp_path / "train.en").write_text("a\n")
    with pytest.raises(DataError, match="has 2 lines but .* has 1; parallel files must be line-aligned"):
        load_parallel(str(tmp_path), log=lambda m: None)
    bad = tmp_path / "bad.tsv"
    bad.write_text("hello\tbonjour\nno tab here\n")
    with pytest.raises(DataError, match="line 2 of .* has no tab"):
        load_parallel(str(bad), log=lambda m: None)


def test_offline_number_pairs():
    from keras_tfm.data.parallel import number_words, offline_pairs

    assert number_words(312) == "three hundred and twelve"
    assert number_words(40_005) == "forty thousand five"
    pairs = offline_pairs(50)
    assert all(t.replace(" ", "").isdigit() for _, t in pairs) and len({s for s, _ in pairs}) == 50


def test_epoch_batches_are_full_shuffled_per_epoch_and_a_pure_function_of_their_arguments():
    from keras_tfm.data import EpochBatches

    rows = EpochBatches(10, 4, seed=3)
    epoch = [rows(0, step) for step in range(3)]
    assert all(len(batch) == 4 for batch in epoch)
    order = rows.order(0)
    assert sorted(order) == list(range(10))
    np.testing.assert_array_equal(np.concatenate(epoch[:2]), order[:8])
    np.testing.assert_array_equal(epoch[2], np.concatenate([order[8:], order[:2]]))  # wraps around
    np.testing.assert_array_equal(EpochBatches(10, 4, seed=3)(0, 2), epoch[2])  # nothing kept between samplers
    assert not np.array_equal(rows.order(1), order) and not np.array_equal(EpochBatches(10, 4, seed=4).order(0), order)
    np.testing.assert_array_equal(
        EpochBatches(10, 4, seed=[3, 7]).order(0), np.random.default_rng([3, 7, 0]).permutation(10)
    )
    reversed_rows = EpochBatches(10, 4, seed=3, arrange=lambda o: o[::-1])
    np.testing.assert_array_equal(reversed_rows(0, 0), order[::-1][:4])
    with pytest.raises(ValueError, match="batch_size must be >= 1; received 10, 0"):
        EpochBatches(10, 0, seed=0)
