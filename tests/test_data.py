"""Data loading: local text files, the offline default, TFDS failures, tokenizers."""

import gzip

import numpy as np
import pytest

from keras_tfm.data import CharacterTokenizer, DataError, load_or_fit_tokenizer, load_text, read_text
from keras_tfm.data import tfds as tfds_module


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
    ],
)
def test_read_text_bad_files(tmp_path, content, message):
    path = tmp_path / "input.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=f"--data: '{path}' .*{message}"):
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
    with pytest.raises(DataError, match="either --data PATH or --dataset NAME"):
        load_text("a.txt", "tiny_shakespeare")


def test_tfds_without_network_fails_at_once_with_what_to_pass(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(tfds_module, "network_available", lambda timeout=3.0: False)
    with pytest.raises(DataError, match="--dataset 'tiny_shakespeare' is not downloaded yet .* pass --data PATH"):
        load_text(dataset="tiny_shakespeare", data_dir=str(tmp_path))


def test_tfds_unknown_name(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    with pytest.raises(DataError, match="--dataset 'no_such_dataset_xyz': tensorflow-datasets does not know it"):
        load_text(dataset="no_such_dataset_xyz", data_dir=str(tmp_path))


def test_character_tokenizer_round_trip_and_reuse(tmp_path):
    tokenizer = load_or_fit_tokenizer("char", "hello world", str(tmp_path), log=lambda m: None)
    assert tokenizer.vocabulary == sorted(set("hello world"))
    ids = tokenizer.encode("low world")
    assert ids.dtype == np.int32 and tokenizer.decode(ids) == "low world"
    again = load_or_fit_tokenizer("char", "completely different text", str(tmp_path), log=lambda m: None)
    assert isinstance(again, CharacterTokenizer) and again.vocabulary == tokenizer.vocabulary


def test_wordpiece_tokenizer_from_keras_hub(tmp_path):
    pytest.importorskip("keras_hub")
    text = "the cat sat on the mat\nthe dog sat on the log\n" * 20
    tokenizer = load_or_fit_tokenizer("wordpiece", text, str(tmp_path), vocabulary_size=60, log=lambda m: None)
    assert tokenizer.vocabulary[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    ids = tokenizer.encode("the cat sat on the log")
    assert len(ids) == 6 and tokenizer.decode(ids) == "the cat sat on the log"
