"""The zoo's metrics: the mean intersection over union of segmentation maps (`MeanIoU`), and BLEU for
translations, two ways (sacreBLEU computes both):

- sacreBLEU's standard score: detokenized, cased output against the raw references (signature printed).
- the score most Multi30k papers report: lowercased, Moses-tokenized output against references made by
  the same pipeline (Multi30k's `task1/tok/*.lc.norm.tok.*`: `lowercase.perl | normalize-punctuation.perl
  | tokenizer.perl`), with no further tokenization inside BLEU. sacremoses reimplements those scripts.
"""

from __future__ import annotations

import re

import keras

from keras_tfm.errors import InputError
from keras_tfm.losses import upsampled_logits

# WordPiece splits at every punctuation mark: "man's" comes back as "man ' s"; Moses writes "man 's".
_SPLIT_CLITIC = re.compile(r"(?<=\w) ' (s|re|ve|ll|d|m|t)\b", re.IGNORECASE)


def detokenize(lines: list[str], language: str) -> list[str]:
    """Space-separated tokens (as WordPiece decoding leaves them) -> text ("a dog ." -> "a dog.")."""
    from sacremoses import MosesDetokenizer

    detokenizer = MosesDetokenizer(lang=language)
    return [detokenizer.detokenize(_SPLIT_CLITIC.sub(r" '\1", line).split()) for line in lines]


def moses_lowercase_tokenize(lines: list[str], language: str) -> list[str]:
    """Text -> lowercased, punctuation-normalized, Moses-tokenized text, as Multi30k's `tok` files."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=language), MosesTokenizer(lang=language)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True, escape=True) for line in lines]


def bleu_scores(
    hypotheses: list[str], references: list[str], language: str, tokenized_references: list[str] | None = None
) -> dict:
    """`hypotheses`: detokenized text. Returns sacreBLEU cased and lowercased scores and signatures, and
    with `tokenized_references` the tokenized-lowercase score."""
    import sacrebleu

    if tokenized_references is not None and len(tokenized_references) != len(hypotheses):
        raise InputError(
            f"expected {len(hypotheses)} lines (one per hypothesis), received {len(tokenized_references)}.",
            caller="tokenized_references",
        )

    def score(name: str, lines: list[str], reference_lines: list[str], **options) -> dict:
        metric = sacrebleu.metrics.BLEU(**options)
        result = metric.corpus_score(lines, [reference_lines])
        return {f"test_bleu{name}": result.score, f"bleu{name}_signature": f"{result} | {metric.get_signature()}"}

    scores = {**score("", hypotheses, references), **score("_lowercase", hypotheses, references, lowercase=True)}
    if tokenized_references is not None:
        scores.update(
            score(
                "_tokenized_lowercase",
                moses_lowercase_tokenize(hypotheses, language),
                tokenized_references,
                tokenize="none",
            )
        )
    return scores


@keras.saving.register_keras_serializable(package="keras_tfm")
class MeanIoU(keras.metrics.MeanIoU):
    """Keras' `MeanIoU` (mIoU) of segmentation logits `(batch, h, w, classes)` against label maps `(batch,
    height, width)` of any size: the logits resized bilinearly to the labels' size, the likeliest class per pixel,
    pixels labelled `ignore_class` left out; what a segmentation benchmark reports (ADE20k's mIoU).

    Args:
        num_classes: the classes.
        ignore_class: the label of pixels with no class (255); None: none.
        name, dtype: as for any Keras metric.

    Example:
    >>> miou = MeanIoU(num_classes=2)
    >>> _ = miou.update_state(np.array([[[0, 1], [1, 1]]]), np.array([[[[1.0, 0.0]]]]))  # all class 0
    >>> round(float(miou.result()), 3)  # class 0: 1 of 4 pixels; class 1: none
    0.125
    """

    def __init__(self, num_classes: int, ignore_class: int | None = 255, name: str = "mean_iou", dtype=None):
        super().__init__(num_classes, name=name, dtype=dtype, ignore_class=ignore_class, sparse_y_pred=False)

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Adds the pixels' (label, prediction) counts to the confusion matrix, with one `segment_sum` (Keras'
        scatter of every pixel took 0.15 s for 16 maps of 32x32 on PyTorch, against ~1 ms; Keras' `bincount` is not
        traceable on JAX, whose compiled steps update metrics)."""
        ops = keras.ops
        y_true, y_pred = ops.convert_to_tensor(y_true), ops.convert_to_tensor(y_pred)
        predicted = ops.reshape(ops.argmax(upsampled_logits(y_true, y_pred, "MeanIoU"), axis=-1), (-1,))
        labels = ops.reshape(ops.cast(y_true, "int32"), (-1,))
        n = self.num_classes
        valid = ops.logical_and(ops.greater_equal(labels, 0), ops.less(labels, n))
        if self.ignore_class is not None:
            valid = ops.logical_and(valid, ops.not_equal(labels, self.ignore_class))
        weights = ops.cast(valid, self.dtype)
        if sample_weight is not None:
            weights = weights * ops.reshape(
                ops.broadcast_to(ops.cast(sample_weight, self.dtype), ops.shape(y_true)), (-1,)
            )
        cells = ops.where(valid, labels * n + ops.cast(predicted, "int32"), 0)
        counts = ops.segment_sum(weights, cells, num_segments=n * n)
        self.total_cm.assign_add(ops.cast(ops.reshape(counts, (n, n)), self.total_cm.dtype))

    def get_config(self) -> dict:
        return {"num_classes": self.num_classes, "ignore_class": self.ignore_class, "name": self.name,
                "dtype": self.dtype}  # fmt: skip
