"""A checkpoint's tokenizer.json gives transformers' ids."""

from __future__ import annotations

import pytest

from keras_tfm.errors import DataError
from tests.recipes.helpers import llama_family_checkpoint


@pytest.mark.backend_independent
def test_a_checkpoints_tokenizer_json_gives_transformers_ids(tmp_path):
    transformers = pytest.importorskip("transformers")
    from keras_tfm.data import HuggingFaceTokenizer, load_tokenizer, save_tokenizer

    checkpoint, _, text = llama_family_checkpoint(tmp_path)
    ours = HuggingFaceTokenizer.from_huggingface(str(checkpoint))
    theirs = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    sample = text[:2000] + " naïve café — 東京\n\n"
    assert ours.encode(sample).tolist() == theirs(sample, add_special_tokens=False)["input_ids"]
    assert ours.encode(sample, add_special_tokens=True).tolist() == theirs(sample)["input_ids"]
    assert ours.encode(sample, add_special_tokens=True)[0] == 0  # Llama 3's <|begin_of_text|> in front
    assert ours.decode(ours.encode(sample)) == sample and ours.vocabulary_size == 400
    reloaded = load_tokenizer(save_tokenizer(ours, str(tmp_path)))
    assert reloaded.encode(sample).tolist() == ours.encode(sample).tolist()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="^from_huggingface: no tokenizer.json in"):
        HuggingFaceTokenizer.from_huggingface(str(tmp_path / "empty"))
