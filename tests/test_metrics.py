import gzip
import os

import numpy as np
import pytest

import keras_tfm
from keras_tfm import metrics as bleu

BLEU = pytest.mark.backend_independent  # sacreBLEU and sacremoses on strings

MULTI30K = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "multi30k", "task1")


@BLEU
@pytest.mark.parametrize("language", ["en", "de"])
def test_moses_pipeline_remakes_multi30k_tokenized_references(language):
    """The comparable score is only comparable if hypotheses go through the pipeline that made the
    references: raw test sentences must come out exactly as the `tok/*.lc.norm.tok.*` lines."""
    with gzip.open(os.path.join(MULTI30K, "raw", f"test_2016_flickr.{language}.gz"), "rt", encoding="utf-8") as file:
        raw = file.read().splitlines()
    with open(os.path.join(MULTI30K, "tok", f"test_2016_flickr.lc.norm.tok.{language}"), encoding="utf-8") as file:
        tokenized = file.read().splitlines()
    assert bleu.moses_lowercase_tokenize(raw, language) == tokenized


@BLEU
def test_detokenize_joins_wordpiece_output():
    assert bleu.detokenize(['A man \' s dog , in " blue " .', "We don ' t ."], "en") == [
        'A man\'s dog, in "blue".',
        "We don't.",
    ]


@BLEU
def test_scores_cased_lowercased_and_tokenized():
    references = ["A dog runs on the grass.", "Two men's hats are red."]
    perfect = bleu.bleu_scores(references, references, "en", bleu.moses_lowercase_tokenize(references, "en"))
    for name in ("test_bleu", "test_bleu_lowercase", "test_bleu_tokenized_lowercase"):
        assert perfect[name] == pytest.approx(100.0)
    lowered = bleu.bleu_scores([r.lower() for r in references], references, "en")
    assert lowered["test_bleu_lowercase"] == pytest.approx(100.0) and lowered["test_bleu"] < 90
    with pytest.raises(ValueError, match="tokenized_references: expected 2 lines .* received 1"):
        bleu.bleu_scores(references, references, "en", ["one line"])


@pytest.mark.parametrize("ignore_class", [255, 0])
def test_mean_iou_of_logits_at_a_quarter_of_the_labels_equals_keras_on_upsampled_logits(ignore_class):
    """keras_tfm's MeanIoU counts pixels with one segment sum; Keras' scatters them (slow on PyTorch): the same
    result, with sample weights, an ignored class inside or outside the classes, over two updates; and inside a
    compiled function (XLA on JAX and TensorFlow), as a compiled `fit` updates it."""
    import keras

    from keras_tfm.metrics import MeanIoU

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, (3, 16, 16))
    labels[:, :2] = 255
    logits, weights = rng.random((3, 4, 4, 4)).astype("float32"), rng.random((3, 16, 16)).astype("float32")
    upsampled = keras.ops.image.resize(logits, (16, 16), interpolation="bilinear", antialias=False)
    ours, reference = MeanIoU(4, ignore_class=ignore_class), keras.metrics.MeanIoU(4, ignore_class=ignore_class,
                                                                                   sparse_y_pred=False)  # fmt: skip
    for metric, predicted in ((ours, logits), (reference, upsampled)):
        metric.update_state(labels, predicted, weights)
        metric.update_state(labels[:1], predicted[:1])
    assert float(ours.result()) == pytest.approx(float(reference.result()), abs=1e-6) and float(ours.result()) > 0
    model = keras.Sequential([keras.Input((4, 4, 4)), keras.layers.Identity()])
    model.compile(loss=keras_tfm.SegmentationCrossEntropy(), metrics=[MeanIoU(4, ignore_class=ignore_class)],
                  jit_compile=keras.backend.backend() != "torch")  # fmt: skip
    compiled = model.evaluate(logits, labels, batch_size=3, return_dict=True, verbose=0)["mean_iou"]
    ours.reset_state()
    ours.update_state(labels, logits)
    assert compiled == pytest.approx(float(ours.result()), abs=1e-6)
