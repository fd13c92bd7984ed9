"""The BERT recipe: pretraining then fine-tuning, its masks, fine-tuning a checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest

from keras_tfm.errors import DataError
from tests.recipes.helpers import MOVIE_REVIEWS, labelled_reviews, recipe, recipe_args, recipe_function, saved_weight


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_bert_recipe_pretrains_then_finetunes(tmp_path):
    out = tmp_path / "run"
    done = recipe(
        "bert_mlm.py",
        "--steps",
        "4",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "32",
        "--num-layers",
        "1",
        "--hidden-dim",
        "32",
        "--num-heads",
        "2",
        "--intermediate-dim",
        "64",
        "--sequence-length",
        "32",
        "--vocabulary-size",
        "500",
        "--finetune",
        str(labelled_reviews(tmp_path / "labelled")),
        "--finetune-epochs",
        "1",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pretrained = json.loads((out / "metrics.json").read_text())
    assert pretrained["steps"] == 4 and pretrained["masked_tokens_evaluated"] > 0
    assert np.isclose(pretrained["validation_perplexity"], np.exp(pretrained["validation_loss"]), rtol=1e-4)
    finetuned = json.loads((out / "finetune" / "metrics.json").read_text())
    assert finetuned["model"] == "bert_mini" and 0.0 <= finetuned["validation_accuracy"] <= 1.0
    assert "['neg', 'pos']" in done.stdout
    for stage in (out, out / "finetune"):
        assert (stage / "learning_curves.png").exists() and (stage / "checkpoint" / "state.json").exists()
    # each stage's model and the WordPiece tokenizer, for transformers users
    transformers = pytest.importorskip("transformers")
    from keras_tfm.data import load_tokenizer

    for stage, hf_class in (
        (out, transformers.BertForMaskedLM),
        (out / "finetune", transformers.BertForSequenceClassification),
    ):
        assert json.loads((stage / "metrics.json").read_text())["huggingface_checkpoint"] == str(stage / "huggingface")
        hf, loading = hf_class.from_pretrained(stage / "huggingface", output_loading_info=True)
        assert not loading["missing_keys"] and not loading["unexpected_keys"]
        embeddings = hf.state_dict()["bert.embeddings.word_embeddings.weight"].numpy()
        np.testing.assert_array_equal(embeddings, saved_weight(stage / "checkpoint", embeddings.shape))
    assert hf.config.id2label == {0: "neg", 1: "pos"}  # the fine-tuned classifier's class names
    line = "An unexpectedly moving film, with a plot that twists."
    ours = load_tokenizer(str(out / "tokenizer.json")).encode(line).tolist()
    assert (
        transformers.AutoTokenizer.from_pretrained(out / "huggingface")(line, add_special_tokens=False)["input_ids"]
        == ours
    )


def test_dynamic_masks_follow_the_bert_recipe():
    """The recipe's masker: 15% selected, never special tokens, 80/10/10
    [MASK]/random/unchanged, the same masks for the same seed (resume) and new ones for a new step."""
    from keras_tfm.data.masking import DynamicMasker, pack_sequences

    pad, cls, sep, mask = 0, 2, 3, 4
    rng = np.random.default_rng(0)
    rows = pack_sequences(rng.integers(10, 1000, 400 * 126), 128, cls, sep)
    assert rows.shape == (400, 128) and (rows[:, 0] == cls).all() and (rows[:, -1] == sep).all()
    masker = DynamicMasker(1000, mask, [pad, cls, sep], pad, mask_rate=0.15, mask_positions=40)
    inputs, labels, weights = masker(rows, [0, 1, 2])
    selected = weights > 0
    positions = inputs["mask_positions"][selected]
    assert abs(selected.sum() / (400 * 126) - 0.15) < 0.01 and selected.sum(1).max() <= 40
    assert not np.isin(positions, [0, 127]).any()  # [CLS] and [SEP] are never selected
    rows_index = np.nonzero(selected)[0]
    new, original = inputs["token_ids"][rows_index, positions], rows[rows_index, positions]
    assert np.array_equal(labels[selected], original)
    shares = [(new == mask).mean(), ((new != mask) & (new != original)).mean(), (new == original).mean()]
    assert abs(shares[0] - 0.8) < 0.03 and abs(shares[1] - 0.1) < 0.03 and abs(shares[2] - 0.1) < 0.03
    assert np.array_equal(masker(rows, [0, 1, 2])[0]["mask_positions"], inputs["mask_positions"])
    assert not np.array_equal(masker(rows, [0, 1, 3])[0]["mask_positions"], inputs["mask_positions"])


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_bert_recipe_fine_tunes_a_hugging_face_checkpoint(tmp_path):
    """--from-huggingface: no pretraining; the checkpoint's tokenizer, weights and pooler, a new head."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from keras_tfm.data import read_text
    from tests.checks import bert_vocabulary

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "vocab.txt").write_text("\n".join(bert_vocabulary(read_text(MOVIE_REVIEWS)[:200_000])) + "\n")
    transformers.BertTokenizer(str(checkpoint / "vocab.txt")).save_pretrained(str(checkpoint))
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len((checkpoint / "vocab.txt").read_text().split()),
        hidden_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=40,
    )
    hf = transformers.BertForPreTraining(config)
    hf.save_pretrained(str(checkpoint))
    with pytest.raises(DataError, match="^from_huggingface: give --finetune PATH"):
        recipe_function("bert_mlm.py", "finetune_checkpoint")(
            recipe_args(from_huggingface=str(checkpoint), finetune=None)
        )

    out = tmp_path / "run"
    # Learning rate 0: the weights stay the checkpoint's, to be compared below.
    labelled = labelled_reviews(tmp_path / "labelled")
    done = recipe(
        "bert_mlm.py",
        "--from-huggingface",
        str(checkpoint),
        "--finetune",
        str(labelled),
        "--sequence-length",
        "32",
        "--batch-size",
        "32",
        "--finetune-epochs",
        "1",
        "--finetune-learning-rate",
        "0",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (out / "checkpoint").exists()  # no pretraining stage
    metrics = json.loads((out / "finetune" / "metrics.json").read_text())
    assert metrics["model"] == f"from_huggingface {checkpoint}" and 0.0 <= metrics["validation_accuracy"] <= 1.0
    with torch.device("meta"):
        two_classes = transformers.BertForSequenceClassification(config)
    assert f"{sum(p.numel() for p in two_classes.parameters()):,} parameters" in done.stdout
    embeddings = hf.state_dict()["bert.embeddings.word_embeddings.weight"].numpy()
    np.testing.assert_allclose(
        saved_weight(out / "finetune" / "checkpoint", embeddings.shape), embeddings, atol=1e-6, rtol=0
    )
