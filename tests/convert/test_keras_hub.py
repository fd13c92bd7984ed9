"""keras_tfm models vs keras-hub's GPT-2, BERT and ViT (the second oracle), built with random weights."""

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import CheckpointError
from tests.checks import to_numpy

# `from_keras_hub` copies keras-hub's arrays (as NumPy) into our layers: the same on every backend, so one
# backend's process runs these. Our models' outputs on each backend: the transformers parity tests.
pytestmark = pytest.mark.backend_independent


def hub():
    """keras-hub, imported where a test runs (it imports TensorFlow: seconds, in processes that skip these)."""
    return pytest.importorskip("keras_hub")


def peaked(model):
    """Larger weights: sharper logits, so that greedy decoding follows the model, not float noise."""
    model.set_weights([w * 5.0 if w.ndim >= 2 else w for w in model.get_weights()])
    return model


def gpt2_backbone():
    keras.utils.set_random_seed(0)
    return hub().models.GPT2Backbone(
        vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=24
    )


def bert_backbone():
    keras.utils.set_random_seed(0)
    return hub().models.BertBackbone(
        vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=16
    )


def vit_backbone():
    keras.utils.set_random_seed(0)
    return hub().models.ViTBackbone(
        image_shape=(8, 8, 3), patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32
    )


def bert_inputs(rng):
    ids = rng.integers(1, 50, size=(2, 9)).astype("int32")
    segments = np.concatenate([np.zeros((2, 5)), np.ones((2, 4))], axis=1).astype("int32")
    mask = np.ones((2, 9), bool)
    mask[0, 6:] = False
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}


def test_gpt2_logits_parameters_and_greedy_generation(rng):
    causal_lm = hub().models.GPT2CausalLM(backbone=peaked(gpt2_backbone()), preprocessor=None)
    prompts = [[3, 7, 9, 11], [5, 6]]
    ids, mask = np.zeros((2, 12), "int32"), np.zeros((2, 12), bool)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)], mask[row, : len(prompt)] = prompt, True
    for source in (causal_lm.backbone, causal_lm):
        model = keras_tfm.from_keras_hub(source)
        assert isinstance(model, keras_tfm.GPT) and model.count_params() == source.count_params()
        np.testing.assert_allclose(
            to_numpy(model(ids, padding_mask=mask)),
            to_numpy(causal_lm({"token_ids": ids, "padding_mask": mask})),
            atol=1e-4,
            rtol=0,
        )
    causal_lm.compile(sampler="greedy")
    expected = causal_lm.generate({"token_ids": ids, "padding_mask": mask}, stop_token_ids=None)["token_ids"]
    got = model.generate(prompts, max_new_tokens=8)
    for row, prompt in enumerate(prompts):
        n = len(prompt) + 8
        np.testing.assert_array_equal(got[row, :n], expected[row, :n])


def test_bert_token_vectors_and_classifier_logits(rng):
    backbone, inputs = bert_backbone(), bert_inputs(rng)
    model = keras_tfm.from_keras_hub(backbone)
    real = inputs["padding_mask"]  # keras-hub's vectors at padding are computed, ours too, but both are noise
    np.testing.assert_allclose(
        to_numpy(model(inputs))[real], to_numpy(backbone(inputs)["sequence_output"])[real], atol=1e-4, rtol=0
    )
    classifier = hub().models.BertTextClassifier(backbone=backbone, num_classes=3, preprocessor=None)
    model = keras_tfm.from_keras_hub(classifier)
    assert isinstance(model, keras_tfm.BertClassifier) and model.count_params() == classifier.count_params()
    np.testing.assert_allclose(to_numpy(model(inputs)), to_numpy(classifier(inputs)), atol=1e-4, rtol=0)


def test_bert_masked_lm_logits_at_the_masked_positions(rng):
    masked_lm = hub().models.BertMaskedLM(backbone=bert_backbone(), preprocessor=None)
    inputs = {**bert_inputs(rng), "mask_positions": np.array([[1, 4], [0, 8]], "int32")}
    model = keras_tfm.from_keras_hub(masked_lm)
    # keras-hub's head differs from BERT's own (and Hugging Face's): exact GELU and epsilon 1e-5
    assert isinstance(model, keras_tfm.BertMLM)
    assert (model.head_activation, model.head_layer_norm_epsilon) == ("gelu", 1e-5)
    assert model.count_params() == masked_lm.count_params() - 16 * 16 - 16  # without the backbone's unused pooler
    np.testing.assert_allclose(to_numpy(model(inputs)), to_numpy(masked_lm(inputs)), atol=1e-4, rtol=0)


def test_vit_features_and_classifier_logits(rng):
    backbone = vit_backbone()
    images = rng.normal(size=(2, 8, 8, 3)).astype("float32")
    model = keras_tfm.from_keras_hub(backbone)
    assert not model.include_top and model.count_params() == backbone.count_params()
    np.testing.assert_allclose(to_numpy(model(images)), to_numpy(backbone(images)), atol=1e-4, rtol=0)
    classifier = hub().models.ViTImageClassifier(backbone=backbone, num_classes=4, preprocessor=None)
    model = keras_tfm.from_keras_hub(classifier)
    assert model.count_params() == classifier.count_params()
    np.testing.assert_allclose(to_numpy(model(images)), to_numpy(classifier(images)), atol=1e-4, rtol=0)


def test_preset_directories_load_as_their_model(rng, tmp_path):
    classifier = hub().models.BertTextClassifier(backbone=bert_backbone(), num_classes=3, preprocessor=None)
    classifier.save_to_preset(str(tmp_path / "classifier"))  # a task: its head is in task.weights.h5
    classifier.backbone.save_to_preset(str(tmp_path / "backbone"))
    inputs = bert_inputs(rng)
    model = keras_tfm.from_keras_hub(tmp_path / "classifier")
    np.testing.assert_allclose(to_numpy(model(inputs)), to_numpy(classifier(inputs)), atol=1e-4, rtol=0)
    assert isinstance(keras_tfm.from_keras_hub(str(tmp_path / "backbone")), keras_tfm.Bert)


def test_what_it_cannot_reproduce_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="unsupported model BertTokenizer; supported: "):
        keras_tfm.from_keras_hub(
            hub().tokenizers.BertTokenizer(vocabulary=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])
        )
    pooled = hub().models.ViTImageClassifier(backbone=vit_backbone(), num_classes=4, pooling="gap", preprocessor=None)
    with pytest.raises(ValueError, match="ViTImageClassifier with pooling='gap', .* is not supported"):
        keras_tfm.from_keras_hub(pooled)
    no_bias = hub().models.ViTBackbone(
        image_shape=(8, 8, 3), patch_size=4, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32, use_mha_bias=False
    )
    with pytest.raises(ValueError, match="from_keras_hub: ViTBackbone checkpoints with use_mha_bias=False are not"):
        keras_tfm.from_keras_hub(no_bias)
    with pytest.raises(CheckpointError, match="no config.json in directory .*; expected a keras-hub preset"):
        keras_tfm.from_keras_hub(tmp_path)


def test_a_quantized_keras_hub_model_is_refused_and_its_float_twin_quantizes_here():
    quantized_hub = gpt2_backbone()
    with keras_tfm.layers.quantization.one_garbage_collection():
        quantized_hub.quantize("int8")  # its kernels become integers and scales
    with pytest.raises(ValueError, match=r"the GPT2Backbone is quantized \(int8\); convert the float model, then"):
        keras_tfm.from_keras_hub(quantized_hub)
    model = keras_tfm.from_keras_hub(gpt2_backbone())
    model.quantize("int8")
    assert model.token_embedding.quantization_mode == "int8"
