"""The translator recipe: BLEU of a short run, SentencePiece."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from tests.recipes.helpers import MULTI30K, recipe


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_translator_recipe_short_run_reports_bleu(tmp_path):
    out = tmp_path / "run"
    done = recipe(
        "translator.py",
        "--steps",
        "4",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "16",
        "--num-layers",
        "1",
        "--hidden-dim",
        "32",
        "--intermediate-dim",
        "64",
        "--num-heads",
        "2",
        "--sequence-length",
        "16",
        "--vocabulary-size",
        "100",
        "--bleu-sentences",
        "8",
        "--beam-size",
        "2",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "generated English number words" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test_sentences"] == 8 and 0.0 <= metrics["test_bleu_lowercase"] <= 100.0
    assert metrics["bleu_signature"].startswith("BLEU = ")
    assert len((out / "translations.txt").read_text().splitlines()) == 8
    assert (out / "learning_curves.png").exists() and (out / "tokenizer_source.json").exists()


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_translator_recipe_with_sentencepiece_scores_a_test_source_that_encodes_to_nothing(tmp_path):

    data = tmp_path / "multi30k"  # the layout of ../shared/data/multi30k, a few of its lines
    data.mkdir()
    for split, lines in (("train", 64), ("val", 8), ("test_2016_flickr", 3)):
        for language in ("de", "en"):
            with gzip.open(os.path.join(MULTI30K, f"{split}.{language}.gz"), "rt", encoding="utf-8") as file:
                text = [next(file) for _ in range(lines)]
            if split.startswith("test"):  # a source of control characters only: no subword
                text.append("\x07\x01\n" if language == "de" else "A dog.\n")
            (data / f"{split}.{language}").write_text("".join(text), encoding="utf-8")
    out = tmp_path / "run"
    done = recipe(
        "translator.py",
        "--data",
        str(data),
        "--tokenizer",
        "sentencepiece",
        "--steps",
        "1",
        "--batch-size",
        "8",
        "--num-layers",
        "1",
        "--hidden-dim",
        "16",
        "--intermediate-dim",
        "16",
        "--num-heads",
        "2",
        "--sequence-length",
        "12",
        "--vocabulary-size",
        "200",
        "--beam-size",
        "1",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr  # translate() refused the empty source: a traceback
    rows = [line.split("\t") for line in (out / "translations.txt").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 4 and rows[-1] == ["\x07\x01", "A dog.", ""]
    assert json.loads((out / "metrics.json").read_text())["test_sentences"] == 4
    assert json.loads((out / "tokenizer_target.json").read_text())["kind"] == "sentencepiece"
