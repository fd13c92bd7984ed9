"""RoBERTa and XLM-RoBERTa (a `Bert` whose positions start at 2) and DistilBERT (without segments, a ReLU pooler)
vs transformers, from small random configs."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import count_of_size, to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=60,
    max_position_embeddings=26, type_vocab_size=1, pad_token_id=1,
)  # fmt: skip
DISTILBERT = dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=60, max_position_embeddings=24)
TASKS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]
NAMES = [f"Roberta{task}" for task in TASKS] + ["XLMRobertaForMaskedLM"] + [f"DistilBert{task}" for task in TASKS]


def hf_model(name: str):
    torch.manual_seed(0)
    family = "XLMRoberta" if name.startswith("XLM") else "DistilBert" if name.startswith("Distil") else "Roberta"
    config = getattr(transformers, f"{family}Config")(**(DISTILBERT if family == "DistilBert" else CONFIG))
    config.num_labels = 2 if "Question" in name else 3
    return getattr(transformers, name)(config).eval()


def outputs(hf, ids, mask) -> np.ndarray:
    with torch.no_grad():
        out = hf(torch.tensor(ids), attention_mask=torch.tensor(mask.astype(int)))
    if hasattr(out, "start_logits"):
        return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], 1)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


@pytest.mark.parametrize("name", NAMES)
def test_outputs_parameter_counts_and_saving_match(rng, tmp_path, name):
    """The same outputs on the real tokens (right padding: RoBERTa numbers positions from its padding id,
    which the padded tail's garbage depends on) and parameter counts; written back, transformers reads the
    same model (and a DistilBERT, without segments, refuses segment ids)."""
    hf = hf_model(name)
    model = keras_tfm.from_huggingface(hf)
    ids = rng.integers(3, 60, size=(2, 24))  # not the padding id 1: RoBERTa's positions 2 ... 25, its last rows
    mask = np.ones((2, 24), bool)
    mask[1, 15:] = False
    ours, expected = to_numpy(model(ids, padding_mask=mask)), outputs(hf, ids, mask)
    if name.endswith("SequenceClassification"):
        np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
    elif name.endswith("QuestionAnswering"):
        np.testing.assert_allclose(ours.transpose(0, 2, 1)[mask], expected.transpose(0, 2, 1)[mask], atol=1e-4)
    else:
        np.testing.assert_allclose(ours[mask], expected[mask], atol=1e-4, rtol=0)
    if name.endswith(
        ("Model", "ForMaskedLM")
    ):  # left padding (with the padding id): positions from the first real token
        left = np.roll(mask, 9, axis=1)
        left_ids = np.where(left, np.roll(ids, 9, axis=1), hf.config.pad_token_id)
        got, expected = to_numpy(model(left_ids, padding_mask=left)), outputs(hf, left_ids, left)
        np.testing.assert_allclose(got[left], expected[left], atol=1e-4, rtol=0)
    pooler = hf.config.hidden_size**2 + hf.config.hidden_size if name == "RobertaModel" else 0  # not converted
    assert model.count_params() == sum(p.numel() for p in hf.parameters()) - pooler
    if name.startswith("DistilBert"):
        with pytest.raises(ValueError, match=r"segment_ids.*num_segments=0"):
            model(ids, segment_ids=np.zeros_like(ids))
    if name.endswith(("ForMaskedLM", "ForSequenceClassification")) and not name.startswith("XLM"):
        keras_tfm.save_huggingface(model, str(tmp_path / "saved"))
        again = getattr(transformers, name).from_pretrained(str(tmp_path / "saved")).eval()
        got = outputs(again, ids, mask)
        np.testing.assert_allclose(
            got[mask] if got.ndim == 3 else got, ours[mask] if ours.ndim == 3 else ours, atol=1e-4
        )


def test_a_text_longer_than_the_positions_after_the_offset_is_refused():
    model = keras_tfm.from_huggingface(hf_model("RobertaModel"))
    assert (model.position_offset, model.longest_input) == (2, 24)
    with pytest.raises(ValueError, match=r"exceeds max_length=26"):
        model(np.full((1, 25), 5))


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "size, hf_class, config",
    [
        ("roberta_base", "RobertaForMaskedLM", dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1)),
        ("distilbert_base", "DistilBertForSequenceClassification", {}),
    ],
)
def test_named_sizes_have_the_published_parameter_counts(size, hf_class, config):
    family = hf_class.split("For")[0]
    with torch.device("meta"):
        hf = getattr(transformers, hf_class)(getattr(transformers, f"{family}Config")(**config))
    head = dict(head="classifier" if "Sequence" in hf_class else "mlm")
    count = count_of_size(getattr(keras_tfm, size), hf.config.num_hidden_layers, hf.config.vocab_size, **head)
    assert count == sum(p.numel() for p in hf.parameters())
