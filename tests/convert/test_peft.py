"""LoRA (`enable_lora`) vs Hugging Face `peft` on the same checkpoints: the same trained parameters, and
with the same LoRA pairs the same logits (small random configurations, no network)."""

import copy

import numpy as np
import pytest

import keras_tfm
from tests.checks import to_numpy
from tests.convert.test_bert import hf_bert, inputs, run_hf as run_hf_bert
from tests.convert.test_marian import hf_marian
from tests.convert.test_vit import hf_vit, run_hf as run_hf_vit

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
RANK, ALPHA = 4, 8


def peft_model(hf, target_modules, task_type=None, modules_to_save=None):
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=target_modules, task_type=task_type,
                             modules_to_save=modules_to_save)
    tuned = peft.get_peft_model(copy.deepcopy(hf), config).eval()
    with torch.no_grad():  # pairs as after some training (B starts at zero), large enough to move the logits
        for name, parameter in tuned.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.5)
    return tuned


def copy_pairs(tuned, blocks, hf_prefix: str, names: dict) -> None:
    """peft's `lora_A` (rank, in) and `lora_B` (out, rank) into our (in, rank) and (rank, out)."""
    state = tuned.state_dict()
    for i, block in enumerate(blocks):
        for ours, theirs in names.items():
            dense = getattr(block.self_attention, ours)
            key = f"{hf_prefix}{i}.{theirs}"
            dense.lora_kernel_a.assign(state[f"{key}.lora_A.default.weight"].numpy().T)
            dense.lora_kernel_b.assign(state[f"{key}.lora_B.default.weight"].numpy().T)


def trained_count(model) -> int:
    return sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)


def test_bert_classifier_lora_matches_peft(rng):
    hf = hf_bert(transformers.BertForSequenceClassification)
    tuned = peft_model(hf, ["query", "value"], task_type="SEQ_CLS")  # SEQ_CLS also trains the new classifier
    model = keras_tfm.from_huggingface(hf)
    model.enable_lora(RANK, lora_alpha=ALPHA)
    assert trained_count(model) == tuned.get_nb_trainable_parameters()[0]
    assert {w.path.split("/")[-2] for w in model.trainable_weights} == {"query", "value", "classifier"}
    copy_pairs(tuned, model.encoder.blocks, "base_model.model.bert.encoder.layer.",
               {"query_dense": "attention.self.query", "value_dense": "attention.self.value"})
    ids, segments, mask = inputs(rng)
    expected = run_hf_bert(tuned, ids, segments, mask)
    assert np.abs(expected - run_hf_bert(hf, ids, segments, mask)).max() > 1e-2  # the pairs matter (100 times the tolerance)
    np.testing.assert_allclose(to_numpy(model(ids, segment_ids=segments, padding_mask=mask)), expected,
                               atol=1e-4, rtol=0)


def test_vit_lora_matches_peft(rng):
    hf = hf_vit()
    if "vit.layers.0.attention.q_proj" in dict(hf.named_modules()):  # transformers 5 names
        prefix, names = "base_model.model.vit.layers.", {"query_dense": "attention.q_proj", "value_dense": "attention.v_proj"}
    else:
        prefix, names = ("base_model.model.vit.encoder.layer.",
                         {"query_dense": "attention.attention.query", "value_dense": "attention.attention.value"})
    tuned = peft_model(hf, [name.split(".")[-1] for name in names.values()], modules_to_save=["classifier"])
    model = keras_tfm.from_huggingface(hf)
    model.enable_lora(RANK, lora_alpha=ALPHA)
    assert trained_count(model) == tuned.get_nb_trainable_parameters()[0]
    copy_pairs(tuned, model.blocks, prefix, names)
    images = rng.random((2, 16, 16, 3)).astype("float32")
    expected = run_hf_vit(tuned, images)
    assert np.abs(expected - run_hf_vit(hf, images)).max() > 1e-2
    np.testing.assert_allclose(to_numpy(model(images)), expected, atol=1e-4, rtol=0)


def test_translator_lora_trains_as_many_parameters_as_peft():
    """Every attention's query and value: encoder and decoder self-attention and cross-attention."""
    hf = hf_marian()
    model = keras_tfm.from_huggingface(hf)
    model.enable_lora(RANK)
    assert trained_count(model) == peft_model(hf, ["q_proj", "v_proj"]).get_nb_trainable_parameters()[0] > 0
