"""The zoo's losses: cross-entropy over token logits `(batch, ..., vocabulary)` (the language models and the
translator, computed with the positions flattened into one axis), in-batch ranking of sentence embeddings, the
image-text losses of CLIP (contrastive) and SigLIP (sigmoid), the per-pixel cross-entropy of segmentation, and the
masked autoencoder's pixel loss."""

from __future__ import annotations

import keras
from keras import ops

# Keras marks ignored labels with a Keras mask.
from keras_tfm.compat import set_keras_mask
from keras_tfm.errors import InputError


@keras.saving.register_keras_serializable(package="keras_tfm")
class TokenCrossEntropy(keras.losses.SparseCategoricalCrossentropy):
    """Keras' `SparseCategoricalCrossentropy` for token logits, computed on `(positions, vocabulary)`,
    with optional label smoothing.

    The values, `ignore_class`, sample weights and reductions are Keras' own; only the layout
    differs. Keras' loss on PyTorch moves the vocabulary axis to position 1 of a 3-D tensor and takes
    the log-softmax over that strided axis, about twice as slow forward and backward for BERT's and
    the translator's logits. Flattening first is what Hugging Face's models do.

    Args:
        from_logits: whether `y_pred` are logits. Defaults to True (unlike Keras), since every
            keras_tfm model outputs logits.
        ignore_class: a label id (e.g. padding) whose positions get zero loss and are left out of
            the mean.
        label_smoothing: in [0, 1). The loss of Keras' `CategoricalCrossentropy(label_smoothing=...)`
            on one-hot labels, `(1 - label_smoothing) * cross_entropy + label_smoothing * mean over
            the vocabulary of -log p`, without building the one-hot `(positions, vocabulary)` labels.
        reduction, name, dtype: as for any Keras loss.

    Call arguments:
        y_true: integer labels `(batch, ...)` (a trailing axis of 1 is allowed).
        y_pred: `(batch, ..., vocabulary)`.

    Returns the per-position losses `(batch, ...)` before reduction, so sample weights of that shape
    apply as with Keras' loss.

    Example:
    >>> lm = keras_tfm.gpt_shakespeare_char_cpu()  # comes compiled with TokenCrossEntropy()
    >>> translator = keras_tfm.transformer_small(source_vocabulary_size=100, target_vocabulary_size=100)
    >>> translator.compile(loss=keras_tfm.TokenCrossEntropy(ignore_class=0, label_smoothing=0.1))
    """

    def __init__(
        self,
        from_logits: bool = True,
        ignore_class: int | None = None,
        label_smoothing: float = 0.0,
        reduction: str = "sum_over_batch_size",
        name: str = "token_cross_entropy",
        dtype=None,
    ):
        if not 0.0 <= label_smoothing < 1.0:
            raise InputError(
                f"`label_smoothing` must be in [0, 1); received {label_smoothing!r}.", caller="TokenCrossEntropy"
            )
        super().__init__(from_logits=from_logits, reduction=reduction, name=name, dtype=dtype)
        # Kept out of Keras' keyword arguments: Keras' `ignore_class` copies the whole logits tensor
        # to zero the ignored rows; `call` masks the per-position losses instead.
        self.ignore_class = ignore_class
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        y_true, y_pred = ops.convert_to_tensor(y_true), ops.convert_to_tensor(y_pred)
        labels_shape = tuple(y_true.shape)
        if len(labels_shape) == len(y_pred.shape) and labels_shape[-1] == 1:
            labels_shape = labels_shape[:-1]
        if len(labels_shape) != len(y_pred.shape) - 1 or any(
            a is not None and b is not None and a != b for a, b in zip(labels_shape, y_pred.shape)
        ):
            raise InputError(
                f"`y_true` must have the shape of `y_pred` without its vocabulary "
                f"axis, {tuple(y_pred.shape[:-1])}; received y_true of shape {tuple(y_true.shape)} "
                f"for y_pred of shape {tuple(y_pred.shape)}.",
                caller="TokenCrossEntropy",
            )
        positions_shape = ops.shape(y_pred)[:-1]
        labels = ops.cast(ops.reshape(y_true, (-1,)), "int32")
        scores = ops.reshape(y_pred, (-1, ops.shape(y_pred)[-1]))
        valid = None
        if self.ignore_class is not None:
            valid = ops.not_equal(labels, self.ignore_class)
            labels = ops.where(valid, labels, 0)
        if self.label_smoothing:
            # One log-softmax serves both terms; Keras' one-hot formulation (CategoricalCrossentropy)
            # materialises (positions, vocabulary) labels, which costs PyTorch most.
            if self.from_logits:
                log_probabilities = ops.log_softmax(scores, axis=-1)
            else:
                epsilon = keras.config.epsilon()
                probabilities = scores / ops.sum(scores, axis=-1, keepdims=True)
                log_probabilities = ops.log(ops.clip(probabilities, epsilon, 1.0 - epsilon))
            picked = ops.take_along_axis(log_probabilities, labels[:, None], axis=-1)[:, 0]
            losses = -(1.0 - self.label_smoothing) * picked - self.label_smoothing * ops.mean(
                log_probabilities, axis=-1
            )
        else:
            losses = keras.losses.sparse_categorical_crossentropy(labels, scores, from_logits=self.from_logits)
        losses = ops.reshape(losses, positions_shape)
        if valid is not None:
            valid = ops.reshape(valid, positions_shape)
            losses = ops.where(valid, losses, 0.0)
            set_keras_mask(losses, valid)  # Keras' reduction then averages over the valid positions
        return losses

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(ignore_class=self.ignore_class, label_smoothing=self.label_smoothing)
        return config


@keras.saving.register_keras_serializable(package="keras_tfm")
class MultipleNegativesRankingLoss(keras.losses.Loss):
    """Contrastive loss of sentence embeddings with in-batch negatives (sentence-transformers'
    `MultipleNegativesRankingLoss`): each anchor's positive must score above every other candidate of
    the batch, by cross-entropy over `scale` x cosine similarity.

    Args:
        scale: the similarities' multiplier (sentence-transformers' default, 20).

    Call arguments:
        y_true: ignored (the pairing is the layout of `y_pred`); `fit` may be given no labels.
        y_pred: `(batch, k, dim)`: per row an anchor, its positive and `k - 2` hard negatives (what a
            `SentenceEmbedder` gives for `embedder.tokenize(pairs)`).

    Example:
    >>> loss = MultipleNegativesRankingLoss()
    >>> vectors = np.array([[[1.0, 0.0], [1.0, 0.1]], [[0.0, 1.0], [0.1, 1.0]]])
    >>> float(loss(None, vectors)) < 0.01
    True
    """

    def __init__(self, scale: float = 20.0, reduction: str = "sum_over_batch_size", name: str = "ranking", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.scale = scale

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Keras would convert labels that are not there: the ranking reads the layout of `y_pred` only
        return super().__call__(ops.zeros(ops.shape(y_pred)[:1]), y_pred, sample_weight)

    def call(self, y_true, y_pred):
        y_pred = ops.convert_to_tensor(y_pred)
        if len(y_pred.shape) != 3 or (y_pred.shape[1] is not None and y_pred.shape[1] < 2):
            raise InputError(
                f"`y_pred` must be (batch, k >= 2, dim): an anchor and its positive per row; received shape "
                f"{tuple(y_pred.shape)}.",
                caller="MultipleNegativesRankingLoss",
            )
        vectors = y_pred / ops.maximum(ops.norm(y_pred, axis=-1, keepdims=True), 1e-12)
        anchors = vectors[:, 0]
        candidates = ops.reshape(ops.transpose(vectors[:, 1:], (1, 0, 2)), (-1, ops.shape(vectors)[-1]))
        scores = self.scale * ops.matmul(anchors, ops.transpose(candidates))
        labels = ops.arange(ops.shape(anchors)[0])
        return keras.losses.sparse_categorical_crossentropy(labels, scores, from_logits=True)

    def get_config(self) -> dict:
        return {**super().get_config(), "scale": self.scale}


class _PairedLogits(keras.losses.Loss):
    """A loss of `(images, texts)` logits where image i pairs text i: `y_true` is ignored (the pairing is the
    batch's order), so `fit` takes pairs without labels."""

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Keras would convert labels that are not there: the pairing reads the layout of `y_pred` only
        return super().__call__(ops.zeros(ops.shape(y_pred)[:1]), y_pred, sample_weight)

    def _checked(self, logits):
        logits = ops.convert_to_tensor(logits)
        rows, columns = logits.shape if len(logits.shape) == 2 else (None, -1)
        if columns == -1 or (rows is not None and columns is not None and rows != columns):
            raise InputError(f"`y_pred` must be (batch, batch) logits of images against their texts, as many of "
                             f"each; received shape {tuple(logits.shape)}.", caller=type(self).__name__)  # fmt: skip
        return logits


@keras.saving.register_keras_serializable(package="keras_tfm")
class ContrastiveLoss(_PairedLogits):
    """CLIP's loss: the cross-entropy of each image over the batch's texts and of each text over its images,
    averaged (`y_pred`: `logits_per_image`, already scaled by the model's temperature).

    Example:
    >>> loss = ContrastiveLoss()
    >>> float(loss(None, np.array([[10.0, 0.0], [0.0, 10.0]]))) < 0.001
    True
    """

    def __init__(self, reduction: str = "sum_over_batch_size", name: str = "contrastive", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)

    def call(self, y_true, y_pred):
        logits = self._checked(y_pred)
        labels = ops.arange(ops.shape(logits)[0])
        per_image = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        per_text = keras.losses.sparse_categorical_crossentropy(labels, ops.transpose(logits), from_logits=True)
        return (per_image + per_text) / 2


@keras.saving.register_keras_serializable(package="keras_tfm")
class SigmoidLoss(_PairedLogits):
    """SigLIP's loss: every (image, text) pair of the batch a binary question, the pairs of the diagonal
    positive: `-sum_j log sigmoid(z_ij * logits_ij)` per image (`z` +1 on the diagonal, -1 elsewhere), averaged
    over the images (`y_pred`: logits with the model's scale and bias).

    Example:
    >>> loss = SigmoidLoss()
    >>> float(loss(None, np.array([[10.0, -10.0], [-10.0, 10.0]]))) < 0.001
    True
    """

    def __init__(self, reduction: str = "sum_over_batch_size", name: str = "sigmoid", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)

    def call(self, y_true, y_pred):
        logits = self._checked(y_pred)
        signs = 2 * ops.eye(ops.shape(logits)[0], dtype=logits.dtype) - 1
        return -ops.sum(ops.log_sigmoid(signs * logits), axis=-1)


@keras.saving.register_keras_serializable(package="keras_tfm")
class SegmentationCrossEntropy(TokenCrossEntropy):
    """Per-pixel cross-entropy of segmentation logits against label maps of any size, as transformers'
    `SegformerForSemanticSegmentation` computes it: the logits `(batch, h, w, classes)` resized bilinearly to the
    labels' `(batch, height, width)` first, pixels labelled `ignore_class` left out of the mean.

    Args:
        ignore_class: the label of pixels with no class (255 in ADE20k's and SegFormer's maps); None: none.
        label_smoothing, reduction, name, dtype: as `TokenCrossEntropy`'s.

    Example:
    >>> loss = SegmentationCrossEntropy()
    >>> float(loss(np.zeros((1, 8, 8), "int32"), np.zeros((1, 2, 2, 3), "float32")))  # log 3
    1.0986...
    """

    def __init__(self, ignore_class: int | None = 255, label_smoothing: float = 0.0,
                 reduction: str = "sum_over_batch_size", name: str = "segmentation_cross_entropy", dtype=None):  # fmt: skip
        super().__init__(True, ignore_class, label_smoothing, reduction, name, dtype)

    def call(self, y_true, y_pred):
        return super().call(y_true, upsampled_logits(y_true, y_pred, "SegmentationCrossEntropy"))

    def get_config(self) -> dict:
        config = super().get_config()
        config.pop("from_logits", None)
        return config


@keras.saving.register_keras_serializable(package="keras_tfm")
class AffineInvariantDepthLoss(keras.losses.Loss):
    """MiDaS's scale-and-shift-invariant depth loss (Ranftl et al. 2020), as relative depth models (DPT, Depth
    Anything) are trained: per image, the scale and shift that best fit the predictions to the targets (least
    squares over the measured pixels), then the mean absolute error of the fitted predictions. Pixels whose target
    is not above 0 have no measurement and are left out. Predictions `(batch, h, w)` are resized bilinearly to the
    targets' `(batch, height, width)` first.

    Example:
    >>> loss = AffineInvariantDepthLoss()
    >>> target = np.random.rand(2, 8, 8).astype("float32") + 0.5
    >>> float(loss(target, 3 * target - 1)) < 1e-4  # any scale and shift of the truth: no loss
    True
    """

    def __init__(self, reduction: str = "sum_over_batch_size", name: str = "affine_invariant_depth", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        if len(y_true.shape) != 3 or len(y_pred.shape) != 3:
            raise InputError(f"expected depth maps (batch, height, width); received shapes {tuple(y_true.shape)} "
                             f"and {tuple(y_pred.shape)}.", "y_true", "AffineInvariantDepthLoss")  # fmt: skip
        y_true, y_pred = ops.cast(y_true, "float32"), ops.cast(y_pred, "float32")
        size = tuple(ops.shape(y_true)[1:3])
        if tuple(y_pred.shape[1:3]) != size:
            y_pred = ops.image.resize(y_pred[..., None], size, interpolation="bilinear", antialias=False)[..., 0]
        mask = ops.cast(y_true > 0, "float32")
        sums = [ops.sum(mask * value, axis=(1, 2)) for value in (y_pred * y_pred, y_pred, 1.0, y_pred * y_true, y_true)]
        pp, p, n, pg, g = sums
        determinant = pp * n - p * p
        safe = ops.where(determinant > 1e-12, determinant, 1.0)  # a flat prediction: no fit, scale 0
        scale = ops.where(determinant > 1e-12, (n * pg - p * g) / safe, 0.0)
        shift = ops.where(determinant > 1e-12, (pp * g - p * pg) / safe, g / ops.maximum(n, 1.0))
        fitted = scale[:, None, None] * y_pred + shift[:, None, None]
        return ops.sum(mask * ops.abs(fitted - y_true), axis=(1, 2)) / ops.maximum(ops.sum(mask, axis=(1, 2)), 1.0)


def upsampled_logits(label_maps, logits, caller: str):
    """`logits` `(batch, h, w, classes)` resized bilinearly (PyTorch's `align_corners=False`) to the height and
    width of `label_maps` `(batch, height, width)`."""
    if len(label_maps.shape) != 3 or len(logits.shape) != 4:
        raise InputError(f"expected label maps (batch, height, width) and logits (batch, h, w, classes); received "
                         f"shapes {tuple(label_maps.shape)} and {tuple(logits.shape)}.", "y_true", caller)  # fmt: skip
    size = tuple(ops.shape(label_maps)[1:3])
    if tuple(logits.shape[1:3]) == size:
        return logits
    return ops.image.resize(logits, size, interpolation="bilinear", antialias=False)


def masked_patch_loss(targets, predictions, mask, normalize_targets: bool = False):
    """A masked autoencoder's loss (MAE, transformers' `ViTMAEForPreTraining`): the mean squared error of each
    patch's pixels, averaged over the hidden patches only.

    Args:
        targets, predictions: `(batch, patches, patch_values)` (`ViTMAE.patchify` of the images; its `logits`).
        mask: `(batch, patches)`, 1 where the patch was hidden from the encoder.
        normalize_targets: each target patch normalized by its own mean and variance first (`norm_pix_loss`;
            the variance divides by n - 1, as PyTorch's).

    Example:
    >>> targets = np.ones((1, 4, 3), "float32")
    >>> float(masked_patch_loss(targets, targets + 2.0, np.array([[1.0, 0.0, 0.0, 0.0]], "float32")))
    4.0
    """
    targets, predictions = ops.convert_to_tensor(targets), ops.convert_to_tensor(predictions)
    if normalize_targets:
        n = targets.shape[-1]
        mean = ops.mean(targets, axis=-1, keepdims=True)
        variance = ops.var(targets, axis=-1, keepdims=True) * (n / (n - 1))
        targets = (targets - mean) / ops.sqrt(variance + 1e-6)
    mask = ops.cast(mask, predictions.dtype)
    per_patch = ops.mean(ops.square(predictions - ops.cast(targets, predictions.dtype)), axis=-1)
    return ops.sum(per_patch * mask) / ops.sum(mask)
