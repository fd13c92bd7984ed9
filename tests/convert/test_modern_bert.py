"""ModernBERT (rotary positions, GeGLU, local and global attention, norms without offsets) vs transformers, from
small random configs: every task model, both ways."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import count_of_size, to_numpy
from tests.convert.test_bert_family import outputs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# 3 blocks: global, local, local; a window of 4 tokens on each side of 24; a global rotary base of its own
CONFIG = dict(
    hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48, vocab_size=60,
    max_position_embeddings=64, local_attention=8, global_rope_theta=1000.0, pad_token_id=0, bos_token_id=1,
    eos_token_id=2, cls_token_id=1, sep_token_id=2,
)  # fmt: skip
TASKS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]


def hf_model(task: str, **config):
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(**{**CONFIG, **config}, attn_implementation="eager")
    config.num_labels = 2 if "Question" in task else 3
    hf = getattr(transformers, "ModernBert" + task)(config).eval()
    with torch.no_grad():  # its norms start at 1 and its classifiers' biases at 0: set every weight apart
        for parameter in hf.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return hf


def real(array: np.ndarray, mask: np.ndarray, task: str) -> np.ndarray:
    """The outputs at the real tokens (a classifier's whole)."""
    if task == "ForQuestionAnswering":
        return array.transpose(0, 2, 1)[mask]
    return array[mask] if array.ndim == 3 else array


@pytest.mark.parametrize("task", TASKS)
def test_outputs_parameter_counts_and_saving_match(rng, tmp_path, task):
    """The same outputs (the classifier pooling by mean over the real tokens) and parameter counts; written back,
    transformers reads the same model, and so does keras_tfm from the checkpoints' own config fields."""
    hf = hf_model(task, classifier_pooling="mean")
    model = keras_tfm.from_huggingface(hf)
    ids = rng.integers(3, 60, size=(2, 24))
    mask = np.ones((2, 24), bool)
    mask[1, 15:] = False
    ours, expected = to_numpy(model(ids, padding_mask=mask)), outputs(hf, ids, mask)
    np.testing.assert_allclose(real(ours, mask, task), real(expected, mask, task), atol=1e-4, rtol=0)
    assert model.count_params() == sum(p.numel() for p in hf.parameters())
    if task == "ForMaskedLM":  # the last (local) block at the masked positions alone: the same logits there
        positions = np.array([[1, 5], [0, 14]])
        at = to_numpy(model(ids, padding_mask=mask, mask_positions=positions))
        np.testing.assert_allclose(at, np.take_along_axis(ours, positions[..., None], 1), atol=1e-5)
    keras_tfm.save_huggingface(model, str(tmp_path / "saved"))
    again = getattr(transformers, "ModernBert" + task).from_pretrained(str(tmp_path / "saved")).eval()
    np.testing.assert_allclose(real(outputs(again, ids, mask), mask, task), real(ours, mask, task), atol=1e-4)
    reloaded = keras_tfm.from_huggingface(str(tmp_path / "saved"))
    assert type(reloaded) is type(model) and reloaded.get_config() == model.get_config()


def test_a_local_block_sees_only_its_window(rng):
    """Changing a token changes a global block's every output, a local block's only within the window."""
    model = keras_tfm.ModernBert(vocabulary_size=60, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=24,
                                 local_attention=8, global_attention_every=2)  # fmt: skip
    ids = rng.integers(3, 60, size=(1, 24))
    changed = ids.copy()
    changed[0, 0] = (ids[0, 0] + 1) % 60
    x, y = (to_numpy(model.embedding_norm(model.token_embedding(i))) for i in (ids, changed))
    local = model.blocks[1]
    window = to_numpy(model._window(ids))
    moved = np.abs(to_numpy(local(x, attention_mask=window)) - to_numpy(local(y, attention_mask=window)))[0].max(-1)
    assert (moved[1:5] > 1e-6).all() and (moved[5:] == 0).all()
    glob = model.blocks[0]
    assert (np.abs(to_numpy(glob(x)) - to_numpy(glob(y)))[0].max(-1)[1:] > 1e-6).all()


@pytest.mark.backend_independent
def test_the_base_size_has_the_published_parameter_count():
    with torch.device("meta"):
        hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig())
    expected = sum(p.numel() for p in hf.parameters())
    assert count_of_size(keras_tfm.modernbert_base, 22, 50368) == expected == 149_655_232


@pytest.mark.backend_independent
def test_a_config_keras_tfm_computes_otherwise_is_refused():
    with pytest.raises(ValueError, match=r"norm_bias"):
        keras_tfm.from_huggingface(hf_model("Model", norm_bias=True))
    with pytest.raises(ValueError, match=r"layer_types"):
        keras_tfm.from_huggingface(
            hf_model("Model", layer_types=["full_attention", "full_attention", "sliding_attention"])
        )
