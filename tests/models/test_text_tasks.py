"""Task models over any encoder, and a model of two towers: configuration that nests, not new classes."""

import keras
import numpy as np
import pytest
import torch
import transformers

import keras_tfm
from keras_tfm.errors import InputError
from keras_tfm.layers import MaskedLMHead, SequenceClassificationHead, SpanHead, TokenClassificationHead
from keras_tfm.models.base import ZooModel
from tests.checks import assert_close, to_numpy

MODERN_TRANSFORM = {"activation": "gelu", "use_bias": False, "norm_epsilon": 1e-5, "norm_center": False}


def bert():
    return keras_tfm.Bert(vocabulary_size=40, max_length=16, num_layers=1, num_heads=2, hidden_dim=16)


def modern_bert():
    return keras_tfm.ModernBert(vocabulary_size=40, max_length=16, num_layers=2, num_heads=2, hidden_dim=16,
                                intermediate_dim=24, local_attention=4, global_attention_every=2)  # fmt: skip


TASKS = {
    "masked_lm_over_modern_bert": lambda: keras_tfm.MaskedLM(modern_bert(), MaskedLMHead(40, MODERN_TRANSFORM)),
    "mean_classifier_over_bert": lambda: keras_tfm.SequenceClassifier(
        bert(), SequenceClassificationHead(3, "mean", {"activation": "tanh"}, dropout=0.2)
    ),
    "tagger_over_modern_bert": lambda: keras_tfm.TokenClassifier(
        modern_bert(), TokenClassificationHead(3, MODERN_TRANSFORM), class_names=["O", "PER", "LOC"]
    ),
    "reader_over_bert": lambda: keras_tfm.QuestionAnswerer(bert(), SpanHead({"activation": "gelu"})),
}


@pytest.mark.parametrize("name", TASKS)
def test_a_task_over_any_encoder_nests_its_config_and_its_keras_file_loads_again(tmp_path, rng, name):
    model = TASKS[name]()
    ids = rng.integers(1, 40, (2, 7)).astype("int32")
    mask = np.arange(7)[None] < np.array([[7], [5]])
    expected = to_numpy(model({"token_ids": ids, "padding_mask": mask}))
    config = model.get_config()
    assert config["encoder"]["class_name"] == type(model.encoder).__name__
    assert config["head"]["class_name"] == type(model.head).__name__
    made = type(model).from_config(config)
    made.build()
    assert made.get_config() == config
    model.save(tmp_path / "task.keras")
    loaded = keras_tfm.load(str(tmp_path / "task.keras"))
    assert type(loaded) is type(model) and loaded.count_params() == model.count_params()
    assert_close(to_numpy(loaded({"token_ids": ids, "padding_mask": mask})), expected, atol=1e-6)


@pytest.mark.backend_independent  # transformers is the oracle; one backend is enough for the export's mapping
def test_a_task_of_a_new_combination_is_a_transformers_checkpoint(tmp_path, rng):
    """A mean-pooling classifier made over a ModernBERT encoder is what `ModernBertForSequenceClassification` is."""
    model = keras_tfm.SequenceClassifier(modern_bert(), SequenceClassificationHead(3, "mean", MODERN_TRANSFORM))
    ids = rng.integers(1, 40, (2, 7))
    mask = np.arange(7)[None] < np.array([[7], [5]])
    expected = to_numpy(model({"token_ids": ids, "padding_mask": mask}))
    keras_tfm.save_huggingface(model, str(tmp_path))
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "ModernBertForSequenceClassification" and hf.config.classifier_pooling == "mean"
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype("int64"))).logits.numpy()
    assert_close(logits, expected, atol=1e-4)
    assert sum(p.numel() for p in hf.parameters()) == model.count_params()


@pytest.mark.backend_independent
def test_a_head_the_checkpoint_cannot_hold_is_refused_by_name(tmp_path):
    model = keras_tfm.SequenceClassifier(bert(), SequenceClassificationHead(3, "mean", {"activation": "tanh"}))
    with pytest.raises(
        InputError, match="BertForSequenceClassification's head has pooling='cls'; received pooling='mean'"
    ):
        keras_tfm.save_huggingface(model, str(tmp_path))
    with pytest.raises(InputError, match="expected a SpanHead; received a TokenClassificationHead"):
        keras_tfm.QuestionAnswerer(bert(), TokenClassificationHead(2))
    with pytest.raises(InputError, match="expected a token encoder"):
        keras_tfm.SequenceClassifier(keras.layers.Dense(3), SequenceClassificationHead(3))


@keras.saving.register_keras_serializable(package="tests")
class TwoTowers(ZooModel):
    """An image tower and a text tower, each projected into one space: made here, on the base class as it is."""

    def __init__(self, image_encoder: keras.Model, text_encoder: keras.Model, embedding_dim: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.image_encoder, self.text_encoder, self.embedding_dim = image_encoder, text_encoder, embedding_dim
        self.image_projection = keras.layers.Dense(embedding_dim, use_bias=False, name="image_projection")
        self.text_projection = keras.layers.Dense(embedding_dim, use_bias=False, name="text_projection")

    def build(self, inputs_shape=None):
        self.image_encoder.build()
        self.text_encoder.build()
        self.image_projection.build((None, self.image_encoder.hidden_dim))
        self.text_projection.build((None, self.text_encoder.hidden_dim))
        self.built = True

    def call(self, inputs):
        images = self.image_projection(self.image_encoder(inputs["images"])[:, 0])
        texts = self.text_projection(self.text_encoder(inputs["token_ids"])[:, 0])
        return {"image_embeds": images, "text_embeds": texts}


@pytest.mark.backend_independent  # the config's round trip; the .keras file's, on every backend above
def test_a_model_of_two_towers_is_configuration_of_the_base_class(tmp_path, rng):
    """Two towers whose arguments share names (num_layers, hidden_dim, num_heads) each keep their own."""
    vision = keras_tfm.ViT(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=12, include_top=False)
    text = keras_tfm.Bert(vocabulary_size=40, max_length=16, num_layers=2, num_heads=4, hidden_dim=16)
    model = TwoTowers(vision, text)
    inputs = {"images": rng.random((2, 16, 16, 3)).astype("float32"), "token_ids": rng.integers(1, 40, (2, 5))}
    expected = {name: to_numpy(value) for name, value in model(inputs).items()}
    config = model.get_config()
    assert (config["image_encoder"]["config"]["num_layers"], config["text_encoder"]["config"]["num_layers"]) == (1, 2)
    made = type(model).from_config(config)
    made.build()
    assert made.get_config() == config
    model.save(tmp_path / "towers.keras")
    loaded = keras.saving.load_model(tmp_path / "towers.keras")
    assert loaded.count_params() == vision.count_params() + text.count_params() + 12 * 8 + 16 * 8
    for name, value in loaded(inputs).items():
        assert_close(to_numpy(value), expected[name], atol=1e-6)


def test_a_quantized_task_over_an_encoder_loads_from_its_keras_file(tmp_path, rng):
    """The nested encoder and head are made unbuilt and built inside the task, where the task's quantized layers
    are named."""
    model = TASKS["mean_classifier_over_bert"]()
    ids = rng.integers(1, 40, (2, 7))
    model.build()
    model.quantize("int8")
    expected = to_numpy(model(ids))
    model.save(tmp_path / "int8.keras")
    loaded = keras_tfm.load(str(tmp_path / "int8.keras"))
    assert loaded.head.classifier.quantization_mode == "int8"
    assert_close(to_numpy(loaded(ids)), expected, atol=1e-6)
