"""keras_tfm BERT vs Hugging Face BERT built from small random configurations (no network)."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import count_of_size, to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
CONFIG = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    vocab_size=60,
    max_position_embeddings=24,
    num_labels=3,
)


def hf_bert(cls, **config):
    torch.manual_seed(0)
    return cls(transformers.BertConfig(**{**CONFIG, **config})).eval()


def inputs(rng):
    ids = rng.integers(1, 60, size=(2, 11))
    segments = np.concatenate([np.zeros((2, 6), int), np.ones((2, 5), int)], axis=1)
    mask = np.ones((2, 11), bool)
    mask[0, 8:] = False
    return ids, segments, mask


def run_hf(hf, ids, segments, mask):
    with torch.no_grad():
        out = hf(
            torch.tensor(ids), token_type_ids=torch.tensor(segments), attention_mask=torch.tensor(mask.astype(int))
        )
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


@pytest.mark.parametrize("name", ["BertForMaskedLM", "BertForSequenceClassification", "BertModel"])
def test_outputs_and_parameter_counts_match(rng, name):
    hf = hf_bert(getattr(transformers, name))
    model = keras_tfm.from_huggingface(hf)
    ids, segments, mask = inputs(rng)
    ours = to_numpy(model(ids, segment_ids=segments, padding_mask=mask))
    expected = run_hf(hf, ids, segments, mask)
    if name == "BertForSequenceClassification":
        np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
    else:  # padded positions are garbage in both; compare the real tokens
        np.testing.assert_allclose(ours[mask], expected[mask], atol=1e-4, rtol=0)
    hf_count = sum(p.numel() for p in hf.parameters()) - (
        hf.config.hidden_size**2 + hf.config.hidden_size if name == "BertModel" else 0
    )
    assert model.count_params() == hf_count  # BertModel's pooler is not converted


def test_masked_positions_select_the_same_logits(rng):
    hf = hf_bert(transformers.BertForMaskedLM)
    model = keras_tfm.from_huggingface(hf)
    ids, segments, mask = inputs(rng)
    positions = np.array([[1, 4, 7], [0, 2, 10]])
    full = run_hf(hf, ids, segments, mask)
    selected = to_numpy(model(ids, segment_ids=segments, padding_mask=mask, mask_positions=positions))
    np.testing.assert_allclose(selected, np.take_along_axis(full, positions[..., None], axis=1), atol=1e-4, rtol=0)


@pytest.mark.backend_independent
def test_bert_base_mlm_parameter_count():
    with torch.device("meta"):
        hf = transformers.BertForMaskedLM(transformers.BertConfig())
    assert count_of_size(keras_tfm.bert_base, 12, 30522) == sum(p.numel() for p in hf.parameters()) == 109_514_298


def test_pretraining_checkpoint_loads_as_masked_lm(rng, tmp_path):
    """The published BERT checkpoints are saved from BertForPreTraining: MLM head, pooler and the
    next-sentence head. They load as a BertMLM (without pooler and next-sentence head)."""
    hf = hf_bert(transformers.BertForPreTraining)
    hf.save_pretrained(str(tmp_path))
    model = keras_tfm.from_huggingface(str(tmp_path))
    assert isinstance(model, keras_tfm.BertMLM)
    ids, segments, mask = inputs(rng)
    with torch.no_grad():
        expected = hf(
            torch.tensor(ids), token_type_ids=torch.tensor(segments), attention_mask=torch.tensor(mask.astype(int))
        ).prediction_logits.numpy()
    ours = to_numpy(model(ids, segment_ids=segments, padding_mask=mask))
    np.testing.assert_allclose(ours[mask], expected[mask], atol=1e-4, rtol=0)
    hidden = hf.config.hidden_size
    assert model.count_params() == sum(p.numel() for p in hf.parameters()) - (hidden**2 + hidden) - (2 * hidden + 2)


@pytest.mark.parametrize("name", ["BertForPreTraining", "BertForSequenceClassification", "BertForMaskedLM"])
def test_num_classes_gives_a_classifier_on_the_checkpoints_encoder(rng, name):
    """Fine-tuning: the checkpoint's encoder and pooler (where it has one), a fresh head of `num_classes`."""
    hf = hf_bert(getattr(transformers, name))
    model = keras_tfm.from_huggingface(hf, num_classes=4)
    assert isinstance(model, keras_tfm.BertClassifier) and model.num_classes == 4
    ids, segments, mask = inputs(rng)
    kernel, bias = (to_numpy(w) for w in model.head.classifier.weights)
    assert kernel.shape == (hf.config.hidden_size, 4) and np.abs(kernel).max() > 0
    with torch.no_grad():
        hf_out = hf.bert(
            torch.tensor(ids), token_type_ids=torch.tensor(segments), attention_mask=torch.tensor(mask.astype(int))
        )
    if name == "BertForMaskedLM":  # no pooler in the checkpoint (a fresh one): its encoder's
        ours = to_numpy(model.encoder(ids, segment_ids=segments, padding_mask=mask))
        np.testing.assert_allclose(ours[mask], hf_out.last_hidden_state.numpy()[mask], atol=1e-4, rtol=0)
    else:
        ours = to_numpy(model(ids, segment_ids=segments, padding_mask=mask))
        np.testing.assert_allclose(ours, hf_out.pooler_output.numpy() @ kernel + bias, atol=1e-4, rtol=0)


@pytest.mark.parametrize("option, value", [("is_decoder", True), ("position_embedding_type", "relative_key")])
def test_options_that_change_the_computation_are_refused(option, value):
    # a BERT decoder loaded silently before, attending both ways where Hugging Face's is causal
    with pytest.raises(ValueError, match=f"BERT checkpoints with {option}={value!r} are not supported"):
        keras_tfm.from_huggingface(hf_bert(transformers.BertForMaskedLM, **{option: value}))


@pytest.mark.parametrize("num_classes", [None, 5])
def test_dropout_rates_come_from_the_config(num_classes):
    hf = hf_bert(
        transformers.BertForSequenceClassification,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.2,
        classifier_dropout=0.3,
    )
    model = keras_tfm.from_huggingface(hf, num_classes=num_classes)
    # the attention and classifier rates were taken as hidden_dropout_prob
    assert (model.encoder.dropout, model.encoder.attention_dropout, model.classifier_dropout) == (0.1, 0.2, 0.3)
    assert {block.self_attention.dropout for block in model.encoder.blocks} == {0.2}
    assert model.head.dropout_layer.rate == 0.3
    reloaded = keras_tfm.BertClassifier.from_config(model.get_config())
    assert (reloaded.encoder.attention_dropout, reloaded.head.dropout_layer.rate) == (0.2, 0.3)
    unset = keras_tfm.from_huggingface(hf_bert(transformers.BertForSequenceClassification, hidden_dropout_prob=0.15))
    assert unset.classifier_dropout == 0.15  # classifier_dropout=None: hidden_dropout_prob, as in transformers


@pytest.mark.parametrize("name", ["BertForTokenClassification", "BertForQuestionAnswering"])
def test_token_heads_match_and_save_both_ways(rng, tmp_path, name):
    """Token labels and answer spans: the same logits (start and end as `[:, 0]` and `[:, 1]`), parameter
    counts and class names, read from transformers' model and written back as its checkpoint."""
    labels = {0: "O", 1: "B-PER", 2: "I-PER"} if name == "BertForTokenClassification" else {0: "start", 1: "end"}
    hf = hf_bert(getattr(transformers, name), id2label=labels, num_labels=len(labels))
    model = keras_tfm.from_huggingface(hf)
    ids, segments, mask = inputs(rng)
    ours = to_numpy(model(ids, segment_ids=segments, padding_mask=mask))
    with torch.no_grad():
        out = hf(
            torch.tensor(ids), token_type_ids=torch.tensor(segments), attention_mask=torch.tensor(mask.astype(int))
        )
    if name == "BertForTokenClassification":
        assert isinstance(model, keras_tfm.BertTokenClassifier) and model.class_names == ["O", "B-PER", "I-PER"]
        expected = out.logits.numpy()
        np.testing.assert_allclose(ours[mask], expected[mask], atol=1e-4, rtol=0)
    else:
        assert isinstance(model, keras_tfm.BertQuestionAnswerer)
        for index, logits in enumerate((out.start_logits, out.end_logits)):
            np.testing.assert_allclose(ours[:, index][mask], logits.numpy()[mask], atol=1e-4, rtol=0)
    assert model.count_params() == sum(p.numel() for p in hf.parameters())
    keras_tfm.save_huggingface(model, str(tmp_path / "saved"))
    again = getattr(transformers, name).from_pretrained(str(tmp_path / "saved")).eval()
    assert type(keras_tfm.from_huggingface(str(tmp_path / "saved"))) is type(model)
    with torch.no_grad():
        got = again(
            torch.tensor(ids), token_type_ids=torch.tensor(segments), attention_mask=torch.tensor(mask.astype(int))
        )
    if name == "BertForTokenClassification":
        assert again.config.id2label == {0: "O", 1: "B-PER", 2: "I-PER"}
        np.testing.assert_allclose(got.logits.numpy()[mask], expected[mask], atol=1e-5, rtol=0)
    else:
        np.testing.assert_allclose(got.start_logits.numpy(), out.start_logits.numpy(), atol=1e-5, rtol=0)
