import keras
import numpy as np
import pytest

import keras_tfm
from tests.checks import assert_close


def _logits_and_labels(rng, shape=(3, 5), vocabulary=7):
    return rng.normal(size=shape + (vocabulary,)).astype("float32"), rng.integers(0, vocabulary, size=shape)


@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "sum", "none", "mean_with_sample_weight"])
def test_token_cross_entropy_equals_keras_sparse_cross_entropy(rng, reduction):
    logits, labels = _logits_and_labels(rng)
    weights = rng.random(labels.shape).astype("float32")
    ours = keras_tfm.TokenCrossEntropy(reduction=reduction)
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    assert_close(ours(labels, logits), keras_loss(labels, logits))
    assert_close(ours(labels, logits, sample_weight=weights), keras_loss(labels, logits, sample_weight=weights))
    # by hand: -log softmax at the label
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    if reduction == "none":
        assert_close(ours(labels, logits), expected)
    assert_close(keras_tfm.TokenCrossEntropy()(labels[..., None], logits), expected.mean())


def test_token_cross_entropy_ignore_class_leaves_those_positions_out_of_the_mean(rng):
    logits, labels = _logits_and_labels(rng)
    labels[:, -2:] = 0  # padding
    ours = keras_tfm.TokenCrossEntropy(ignore_class=0)
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    assert_close(ours(labels, logits), keras_loss(labels, logits))
    kept = keras_tfm.TokenCrossEntropy(reduction="none")(labels[:, :-2], logits[:, :-2])
    assert_close(ours(labels, logits), np.asarray(kept)[labels[:, :-2] != 0].mean())


def test_token_cross_entropy_trains_a_model_and_round_trips_its_config(rng):
    lm = keras_tfm.GPT(vocabulary_size=11, max_length=8, num_layers=1, num_heads=2, hidden_dim=8)
    lm.compile(optimizer="adam", loss=keras_tfm.TokenCrossEntropy())
    ids = rng.integers(0, 11, size=(4, 8)).astype("int32")
    assert np.isfinite(lm.train_on_batch(ids, ids))
    loss = keras_tfm.TokenCrossEntropy(ignore_class=3, reduction="sum")
    clone = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(clone, keras_tfm.TokenCrossEntropy) and clone.get_config() == loss.get_config()


def test_token_cross_entropy_names_the_shapes_when_labels_do_not_match(rng):
    logits, labels = _logits_and_labels(rng)
    with pytest.raises(ValueError, match=r"y_true.*\(3, 4\).*\(3, 5, 7\)"):
        keras_tfm.TokenCrossEntropy()(labels[:, :4], logits)
