import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import InputError
from tests.checks import assert_close, to_numpy


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
    loss = keras_tfm.TokenCrossEntropy(ignore_class=3, label_smoothing=0.2, reduction="sum")
    clone = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(clone, keras_tfm.TokenCrossEntropy) and clone.get_config() == loss.get_config()
    assert (clone.ignore_class, clone.label_smoothing) == (3, 0.2)


def test_token_cross_entropy_names_the_shapes_when_labels_do_not_match(rng):
    logits, labels = _logits_and_labels(rng)
    with pytest.raises(ValueError, match=r"y_true.*\(3, 4\).*\(3, 5, 7\)"):
        keras_tfm.TokenCrossEntropy()(labels[:, :4], logits)


@pytest.mark.parametrize("from_logits", [True, False])
@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "none"])
def test_label_smoothing_equals_keras_categorical_cross_entropy_on_one_hot_labels(rng, from_logits, reduction):
    logits, labels = _logits_and_labels(rng)
    scores = logits if from_logits else np.asarray(keras.ops.softmax(logits))
    one_hot = np.eye(logits.shape[-1], dtype="float32")[labels]
    weights = rng.random(labels.shape).astype("float32")
    ours = keras_tfm.TokenCrossEntropy(from_logits=from_logits, label_smoothing=0.1, reduction=reduction)
    keras_loss = keras.losses.CategoricalCrossentropy(from_logits=from_logits, label_smoothing=0.1, reduction=reduction)
    assert_close(ours(labels, scores), keras_loss(one_hot, scores))
    assert_close(ours(labels, scores, sample_weight=weights), keras_loss(one_hot, scores, sample_weight=weights))
    unsmoothed = keras_tfm.TokenCrossEntropy(from_logits=from_logits, reduction=reduction)(labels, scores)
    assert np.all(np.abs(np.asarray(ours(labels, scores)) - np.asarray(unsmoothed)) > 1e-3)


def test_label_smoothing_with_ignore_class_averages_over_the_kept_positions_only(rng):
    logits, labels = _logits_and_labels(rng)
    labels[:, -2:] = 0  # padding
    one_hot = np.eye(logits.shape[-1], dtype="float32")[labels]
    per_position = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.3, reduction="none")(
        one_hot, logits
    )
    expected = np.asarray(per_position)[labels != 0].mean()
    assert_close(keras_tfm.TokenCrossEntropy(ignore_class=0, label_smoothing=0.3)(labels, logits), expected)
    per_token = keras_tfm.TokenCrossEntropy(ignore_class=0, label_smoothing=0.3, reduction="none")(labels, logits)
    assert np.all(np.asarray(per_token)[labels == 0] == 0)
    direct = keras_tfm.TokenCrossEntropy(ignore_class=0, label_smoothing=0.3).call(
        labels, logits
    )  # no Keras mask applied
    assert np.all(keras.ops.convert_to_numpy(direct)[labels == 0] == 0)


def _one_sgd_step(loss, features, labels, vocabulary):
    """The kernel of a Dense layer (same initial weights every call) before and after one SGD step."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input(features.shape[1:]), keras.layers.Dense(vocabulary)])
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=loss)
    before = keras.ops.convert_to_numpy(model.layers[0].kernel)
    model.train_on_batch(features, labels)
    return before, keras.ops.convert_to_numpy(model.layers[0].kernel)


def test_ignore_class_gradients_equal_keras_and_skip_the_ignored_positions(rng):
    vocabulary = 7
    features = rng.normal(size=(3, 5, 4)).astype("float32")
    labels = rng.integers(1, vocabulary, size=(3, 5))
    labels[:, -2:] = 0  # padding
    before, ours = _one_sgd_step(keras_tfm.TokenCrossEntropy(ignore_class=0), features, labels, vocabulary)
    assert np.abs(ours - before).max() > 1e-3
    _, keras_ = _one_sgd_step(
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0), features, labels, vocabulary
    )
    assert_close(ours, keras_)
    # the padded positions' features do not move the kernel: changing them changes nothing
    features[:, -2:] = rng.normal(size=(3, 2, 4)) * 10
    assert_close(_one_sgd_step(keras_tfm.TokenCrossEntropy(ignore_class=0), features, labels, vocabulary)[1], ours)


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_label_smoothing_out_of_range_names_the_argument(value):
    with pytest.raises(ValueError, match=r"label_smoothing.*\[0, 1\).*" + str(value)):
        keras_tfm.TokenCrossEntropy(label_smoothing=value)


def test_image_text_losses_are_clips_and_siglips(rng):
    """Against transformers' CLIP loss and SigLIP's, written as its SiglipModel computes it."""
    torch = pytest.importorskip("torch")
    clip = pytest.importorskip("transformers.models.clip.modeling_clip")
    logits = (5 * rng.normal(size=(6, 6))).astype("float32")
    expected = clip.image_text_contrastive_loss(torch.tensor(logits).T).item()  # it takes logits_per_text
    assert_close(float(keras_tfm.ContrastiveLoss()(None, logits)), expected, atol=1e-5)
    signs = 2 * torch.eye(6) - 1
    expected = (-torch.nn.functional.logsigmoid(signs * torch.tensor(logits).T).sum(-1)).mean().item()
    assert_close(float(keras_tfm.SigmoidLoss()(None, logits.T)), expected, atol=1e-5)
    for loss in (keras_tfm.ContrastiveLoss(), keras_tfm.SigmoidLoss()):
        assert type(loss).from_config(loss.get_config()).name == loss.name
        with pytest.raises(ValueError, match=r"\(batch, batch\) logits of images against their texts"):
            loss(None, logits[:4])


@pytest.mark.backend_independent  # keras.ops only; the loss inside a compiled fit: tests/models/test_dpt.py
def test_the_affine_invariant_depth_loss_fits_scale_and_shift_per_image_over_measured_pixels(rng):
    """Against NumPy's least squares on each image's measured pixels (targets above 0), predictions at half the
    targets' size resized bilinearly first."""
    targets = rng.uniform(0.5, 3.0, size=(3, 8, 10)).astype("float32")
    targets[0, :2] = 0.0  # unmeasured rows
    predictions = rng.normal(size=(3, 4, 5)).astype("float32")
    loss = keras_tfm.AffineInvariantDepthLoss(reduction=None)
    got = to_numpy(loss(targets, predictions))
    resized = to_numpy(keras.ops.image.resize(predictions[..., None], (8, 10), antialias=False))[..., 0]
    for image, (target, prediction) in enumerate(zip(targets, resized)):
        measured = target > 0
        design = np.stack([prediction[measured], np.ones(measured.sum())], axis=1)
        (scale, shift), *_ = np.linalg.lstsq(design, target[measured], rcond=None)
        assert got[image] == pytest.approx(np.abs(scale * prediction[measured] + shift - target[measured]).mean(),
                                           rel=1e-4)  # fmt: skip
    with pytest.raises(InputError, match=r"y_true: AffineInvariantDepthLoss: expected depth maps"):
        loss(targets[..., None], predictions)
