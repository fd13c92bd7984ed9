import gzip
import os

import pytest

from keras_tfm import metrics as bleu

pytestmark = pytest.mark.backend_independent  # sacreBLEU and sacremoses on strings

MULTI30K = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "multi30k", "task1")


@pytest.mark.parametrize("language", ["en", "de"])
def test_moses_pipeline_remakes_multi30k_tokenized_references(language):
    """The comparable score is only comparable if hypotheses go through the pipeline that made the
    references: raw test sentences must come out exactly as the `tok/*.lc.norm.tok.*` lines."""
    with gzip.open(os.path.join(MULTI30K, "raw", f"test_2016_flickr.{language}.gz"), "rt", encoding="utf-8") as file:
        raw = file.read().splitlines()
    with open(os.path.join(MULTI30K, "tok", f"test_2016_flickr.lc.norm.tok.{language}"), encoding="utf-8") as file:
        tokenized = file.read().splitlines()
    assert bleu.moses_lowercase_tokenize(raw, language) == tokenized


def test_detokenize_joins_wordpiece_output():
    assert bleu.detokenize(['A man \' s dog , in " blue " .', "We don ' t ."], "en") == [
        'A man\'s dog, in "blue".',
        "We don't.",
    ]


def test_scores_cased_lowercased_and_tokenized():
    references = ["A dog runs on the grass.", "Two men's hats are red."]
    perfect = bleu.bleu_scores(references, references, "en", bleu.moses_lowercase_tokenize(references, "en"))
    for name in ("test_bleu", "test_bleu_lowercase", "test_bleu_tokenized_lowercase"):
        assert perfect[name] == pytest.approx(100.0)
    lowered = bleu.bleu_scores([r.lower() for r in references], references, "en")
    assert lowered["test_bleu_lowercase"] == pytest.approx(100.0) and lowered["test_bleu"] < 90
    with pytest.raises(ValueError, match="tokenized_references: expected 2 lines .* received 1"):
        bleu.bleu_scores(references, references, "en", ["one line"])
