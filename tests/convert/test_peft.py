"""LoRA (`enable_lora`) vs Hugging Face `peft` on the same checkpoints: the same trained parameters, and
with the same LoRA pairs the same logits; peft adapters loaded by `from_huggingface` give peft's
logits (small random configurations, no network)."""

import copy
import json
import os
import re

import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import CheckpointError
from tests.checks import to_numpy
from tests.convert.test_bert import hf_bert, inputs
from tests.convert.test_bert import run_hf as run_hf_bert
from tests.convert.test_gpt2 import hf_gpt2, hf_logits
from tests.convert.test_marian import hf_marian
from tests.convert.test_vit import hf_vit
from tests.convert.test_vit import run_hf as run_hf_vit

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
RANK, ALPHA = 4, 8


def peft_model(hf, target_modules, task_type=None, modules_to_save=None):
    config = peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=target_modules, task_type=task_type, modules_to_save=modules_to_save
    )
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
    copy_pairs(
        tuned,
        model.encoder.blocks,
        "base_model.model.bert.encoder.layer.",
        {"query_dense": "attention.self.query", "value_dense": "attention.self.value"},
    )
    ids, segments, mask = inputs(rng)
    expected = run_hf_bert(tuned, ids, segments, mask)
    assert (
        np.abs(expected - run_hf_bert(hf, ids, segments, mask)).max() > 1e-2
    )  # the pairs matter (100 times the tolerance)
    np.testing.assert_allclose(
        to_numpy(model(ids, segment_ids=segments, padding_mask=mask)), expected, atol=1e-4, rtol=0
    )


def test_vit_lora_matches_peft(rng):
    hf = hf_vit()
    if "vit.layers.0.attention.q_proj" in dict(hf.named_modules()):  # transformers 5 names
        prefix, names = (
            "base_model.model.vit.layers.",
            {"query_dense": "attention.q_proj", "value_dense": "attention.v_proj"},
        )
    else:
        prefix, names = (
            "base_model.model.vit.encoder.layer.",
            {"query_dense": "attention.attention.query", "value_dense": "attention.attention.value"},
        )
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


# Adapters: `from_huggingface` of a PeftModel, or of an adapter directory on its base checkpoint.


def trained_paths(model) -> set:
    return {"/".join(weight.path.split("/")[-2:]) for weight in model.trainable_weights}


def test_bert_adapter_on_a_pretraining_checkpoint_loads_with_its_head(rng, tmp_path):
    """The usual case: a classification adapter trained on bert-base-uncased (a BertForPreTraining
    checkpoint, whose classifier peft's SEQ_CLS trains whole), loaded from its directory alone."""
    hf_bert(transformers.BertForPreTraining).save_pretrained(tmp_path / "base")
    classifier = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "base").eval()
    with torch.no_grad():  # a head as after training (the base checkpoint has none: it can only come from the adapter)
        classifier.classifier.weight.mul_(30.0)
    tuned = peft_model(classifier, ["query", "value"], task_type="SEQ_CLS")
    tuned.save_pretrained(tmp_path / "adapter")  # names the base directory as its base_model_name_or_path
    model = keras_tfm.from_huggingface(str(tmp_path / "adapter"))
    assert type(model).__name__ == "BertClassifier"
    ids, segments, mask = inputs(rng)
    expected = run_hf_bert(tuned, ids, segments, mask)
    assert np.abs(expected - run_hf_bert(classifier, ids, segments, mask)).max() > 1e-2
    np.testing.assert_allclose(
        to_numpy(model(ids, segment_ids=segments, padding_mask=mask)), expected, atol=1e-4, rtol=0
    )
    assert trained_count(model) == tuned.get_nb_trainable_parameters()[0]
    assert {path.split("/")[0] for path in trained_paths(model)} == {"query", "value", "classifier"}
    same_classes = keras_tfm.from_huggingface(str(tmp_path / "adapter"), num_classes=3)  # what the recipes pass
    np.testing.assert_allclose(
        to_numpy(same_classes(ids, segment_ids=segments, padding_mask=mask)), expected, atol=1e-4, rtol=0
    )


@pytest.mark.parametrize("use_rslora", [False, True])
def test_gpt2_fused_attention_adapter_in_memory_and_from_its_directory(rng, tmp_path, use_rslora):
    """peft adapts GPT-2's fused query/key/value `c_attn` (a Conv1D, stored (in, out)) with one A and
    one B of three times the width: each of our three projections gets A and its rows of B."""
    hf = hf_gpt2()
    config = peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=["c_attn", "c_fc"], use_rslora=use_rslora, fan_in_fan_out=True
    )
    tuned = peft.get_peft_model(copy.deepcopy(hf), config).eval()
    with torch.no_grad():
        for name, parameter in tuned.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.5)
    ids = rng.integers(0, 97, size=(2, 13))
    expected = hf_logits(tuned, ids)
    assert np.abs(expected - hf_logits(hf, ids)).max() > 1e-2
    hf.save_pretrained(tmp_path / "base")
    tuned.save_pretrained(tmp_path / "adapter")
    for model in (
        keras_tfm.from_huggingface(tuned),
        keras_tfm.from_huggingface(str(tmp_path / "base"), adapter=str(tmp_path / "adapter")),
    ):
        np.testing.assert_allclose(to_numpy(model(ids)), expected, atol=1e-4, rtol=0)
        assert trained_paths(model) == {
            f"{layer}/lora_kernel_{part}" for layer in ("query", "key", "value", "intermediate") for part in "ab"
        }
        assert model.blocks[0].self_attention.key_dense.lora_rank == RANK


def test_vit_adapter_in_memory(rng):
    hf = hf_vit()
    names = ["q_proj", "v_proj"] if "vit.layers.0.attention.q_proj" in dict(hf.named_modules()) else ["query", "value"]
    tuned = peft_model(hf, names, modules_to_save=["classifier"])
    with torch.no_grad():  # as if trained: the head differs from the base checkpoint's
        tuned.base_model.model.classifier.modules_to_save["default"].weight.mul_(3.0)
    model = keras_tfm.from_huggingface(tuned)
    images = rng.random((2, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(images)), run_hf_vit(tuned, images), atol=1e-4, rtol=0)
    assert trained_count(model) == tuned.get_nb_trainable_parameters()[0]


def test_marian_adapter_adapts_cross_attention_too(rng):
    hf = hf_marian()
    tuned = peft_model(hf, ["q_proj", "v_proj"])
    model = keras_tfm.from_huggingface(tuned)
    source = rng.integers(1, 60, size=(2, 7))
    target = np.concatenate([np.full((2, 1), 60), rng.integers(1, 60, size=(2, 5))], axis=1)
    with torch.no_grad():
        expected = tuned(input_ids=torch.tensor(source), decoder_input_ids=torch.tensor(target)).logits.numpy()
    got = to_numpy(model({"source_ids": source.astype("int32"), "target_ids": target.astype("int32")}))
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    assert model.decoder_blocks[0].cross_attention.query_dense.lora_enabled


def write_adapter(tmp_path, **changes):
    hf = hf_gpt2()
    hf.save_pretrained(tmp_path / "base")
    peft_model(hf, ["c_attn"]).save_pretrained(tmp_path / "adapter")
    path = tmp_path / "adapter" / "adapter_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "base_model_name_or_path": str(tmp_path / "base"), **changes}))
    return str(tmp_path / "adapter")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"peft_type": "IA3"}, "is a 'IA3' adapter; keras_tfm loads LoRA adapters"),
        ({"use_dora": True}, "LoRA adapters with use_dora=True are not supported"),
        ({"bias": "all"}, "LoRA adapters with bias='all' are not supported"),
        ({"rank_pattern": {"c_attn": 8}}, "LoRA adapters with rank_pattern={'c_attn': 8} are not supported"),
        ({"enable_lora": [True, False, True]}, "LoRA adapters with enable_lora=[True, False, True] are not supported"),
        ({"base_model_name_or_path": None}, "names no base checkpoint"),
    ],
)
def test_adapters_it_cannot_compute_are_refused_by_name(tmp_path, changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        keras_tfm.from_huggingface(write_adapter(tmp_path, **changes))


def test_adapter_errors_name_what_is_wrong(tmp_path):
    adapter = write_adapter(tmp_path)
    hf = hf_bert(transformers.BertForSequenceClassification)
    with pytest.raises(ValueError, match="brings its own trained head"):
        keras_tfm.from_huggingface(peft_model(hf, ["query"], task_type="SEQ_CLS"), num_classes=4)
    with pytest.raises(ValueError, match="adapts embeddings"):
        keras_tfm.from_huggingface(peft_model(hf, ["word_embeddings"]))
    with pytest.raises(ValueError, match="holds its adapter, and adapter="):
        keras_tfm.from_huggingface(peft_model(hf, ["query"]), adapter=adapter)
    with pytest.raises(CheckpointError, match="no adapter_config.json"):
        keras_tfm.from_huggingface(str(tmp_path / "base"), adapter=str(tmp_path / "base"))
    os.remove(os.path.join(adapter, "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match="neither adapter_model.safetensors nor adapter_model.bin"):
        keras_tfm.from_huggingface(adapter)


# Export: `save_peft_adapter` writes what peft loads onto the base checkpoint.


def as_if_trained(model, rng, head=None) -> None:
    """Random pairs (and head), as after training: large enough to move the outputs."""
    for dense in model_lora_layers(model):
        for variable in (dense.lora_kernel_a, dense.lora_kernel_b):
            variable.assign(rng.normal(0, 0.5, variable.shape).astype("float32"))
    if head is not None:
        head.kernel.assign(rng.normal(0, 1.0, head.kernel.shape).astype("float32"))


def model_lora_layers(model):
    from keras_tfm.models.lora import lora_layers

    return list(lora_layers(model).values())


def test_bert_classifier_exports_an_adapter_peft_loads(rng, tmp_path):
    hf_bert(transformers.BertForSequenceClassification).save_pretrained(tmp_path / "base")
    model = keras_tfm.from_huggingface(str(tmp_path / "base"))
    model.enable_lora(RANK, lora_alpha=ALPHA)
    as_if_trained(model, rng, head=model.head.classifier)
    keras_tfm.convert.save_peft_adapter(model, str(tmp_path / "adapter"), base=str(tmp_path / "base"))
    base = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "base").eval()
    tuned = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter", is_trainable=True).eval()
    ids, segments, mask = inputs(rng)
    expected = run_hf_bert(tuned, ids, segments, mask)
    assert np.abs(expected - run_hf_bert(base, ids, segments, mask)).max() > 1e-2
    ours = to_numpy(model(ids, segment_ids=segments, padding_mask=mask))
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
    reloaded = keras_tfm.from_huggingface(str(tmp_path / "adapter"))  # and back, through its base_model_name_or_path
    np.testing.assert_allclose(
        to_numpy(reloaded(ids, segment_ids=segments, padding_mask=mask)), ours, atol=1e-5, rtol=0
    )
    assert trained_count(reloaded) == trained_count(model) == tuned.get_nb_trainable_parameters()[0]


def test_gpt2_query_and_value_pairs_export_as_one_fused_pair(rng, tmp_path):
    """Our query and value pairs of rank 4 become one rank-8 pair of GPT-2's fused `c_attn`."""
    hf = hf_gpt2()
    model = keras_tfm.from_huggingface(hf)
    model.enable_lora(RANK, lora_alpha=ALPHA)
    as_if_trained(model, rng)
    keras_tfm.convert.save_peft_adapter(model, str(tmp_path / "adapter"), base=hf)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["task_type"]) == (2 * RANK, 2 * ALPHA, "CAUSAL_LM")
    tuned = peft.PeftModel.from_pretrained(copy.deepcopy(hf), tmp_path / "adapter").eval()
    ids = rng.integers(0, 97, size=(2, 13))
    expected = hf_logits(tuned, ids)
    assert np.abs(expected - hf_logits(hf, ids)).max() > 1e-2
    np.testing.assert_allclose(to_numpy(model(ids)), expected, atol=1e-4, rtol=0)


def test_vit_with_a_new_head_exports_the_head_as_modules_to_save(rng, tmp_path):
    hf_vit().save_pretrained(tmp_path / "base")  # 5 classes; fine-tuned to 3
    model = keras_tfm.from_huggingface(str(tmp_path / "base"), num_classes=3)
    model.enable_lora(RANK, target_layer_names=["query", "value"], lora_alpha=ALPHA)
    as_if_trained(model, rng, head=model.head)
    keras_tfm.convert.save_peft_adapter(model, str(tmp_path / "adapter"), base=str(tmp_path / "base"))
    base = transformers.ViTForImageClassification.from_pretrained(
        tmp_path / "base", num_labels=3, ignore_mismatched_sizes=True
    ).eval()
    tuned = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    images = rng.random((2, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(images)), run_hf_vit(tuned, images), atol=1e-4, rtol=0)


def test_export_errors_name_what_is_wrong(tmp_path):
    hf = hf_gpt2()
    model = keras_tfm.from_huggingface(hf)
    with pytest.raises(ValueError, match="has no LoRA layers"):
        keras_tfm.convert.save_peft_adapter(model, str(tmp_path / "a"), base=hf)
    model.enable_lora(RANK)
    for variable in model.final_norm.weights:  # (`final_norm.trainable = True` does not reach them on TensorFlow)
        variable.trainable = True
    with pytest.raises(ValueError, match="final_norm.*trained beside the LoRA pairs"):
        keras_tfm.convert.save_peft_adapter(model, str(tmp_path / "a"), base=hf)
    with pytest.raises(ValueError, match="is a GPT; the checkpoint base=.* converts to a Translator"):
        keras_tfm.convert.save_peft_adapter(model, str(tmp_path / "a"), base=hf_marian())
