"""What a person does with an image model, images in as files, PIL images or arrays: the checkpoint's own
preprocessing (`preprocess_images`), labels with their scores (`classify`, as transformers' image-classification
pipeline answers), and feature vectors (`embed_images`)."""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import is_integer

POOLINGS = ("token", "mean", "patches", "pooled")


class ImageTasks:
    """For a model with `image_processor`, `features(images)` `(batch, 1 + patches, hidden_dim)` (the class
    token first), and where it classifies, `include_top`, `class_names` and logits from `predict_on_batch`."""

    def preprocess_images(self, images) -> np.ndarray:
        """`images` (a file path, a PIL image or a uint8 array, or a list of them, of any sizes) as this
        model's checkpoint prepares them: `(batch, height, width, channels)` float32. Without an image
        processor, a float batch `(batch, height, width, channels)` is taken as prepared already."""
        if self.image_processor is not None:
            return self.image_processor(images)
        if isinstance(images, np.ndarray) and images.ndim == 4 and images.dtype.kind == "f":
            return images.astype("float32")
        raise InputError(
            "this model has no image processor to read files, PIL images or pixels with (a checkpoint's comes "
            "from its preprocessor_config.json): set `model.image_processor` (keras_tfm.data.ImageProcessor), or "
            "give a float batch prepared as the model was trained.",
            "images",
            type(self).__name__,
        )

    def classify(self, images, top_k: int = 5, batch_size: int = 32) -> list:
        """Each image's `top_k` likeliest classes as `[{"label", "score"}]`, likeliest first, as transformers'
        image-classification pipeline answers (softmax scores, `class_names` as labels); for one image, its
        list alone.

        Example: `keras_tfm.from_huggingface("google/vit-base-patch16-224").classify("cat.jpg", top_k=3)`."""
        if not getattr(self, "include_top", False):
            raise InputError("a model without its head (include_top=False) has no classes; load it with its "
                             "classifier, or use embed_images.", caller="classify")  # fmt: skip
        if not is_integer(top_k) or not 1 <= top_k <= len(self.class_names):
            raise InputError(f"expected an integer in [1, {len(self.class_names)}] (the classes); received "
                             f"{top_k!r}.", "top_k", "classify")  # fmt: skip
        single = one_image(images)
        pixels = self.preprocess_images([images] if single else images)
        logits = np.concatenate(
            [ops.convert_to_numpy(self.predict_on_batch(part)) for part in _batches(pixels, batch_size)]
        )
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        answers = [
            [{"label": self.class_names[i], "score": float(row[i])} for i in np.argsort(-row, kind="stable")[:top_k]]
            for row in scores
        ]
        return answers[0] if single else answers

    def embed_images(self, images, pooling: str = "token", batch_size: int = 32) -> np.ndarray:
        """Feature vectors of `images` from the normalized last layer: the class token (`"token"`,
        `(batch, hidden_dim)`), the mean of the patch tokens (`"mean"`), every patch token (`"patches"`,
        `(batch, patches, hidden_dim)`, for dense probes and pictures of the features), or the model's own
        pooling (`"pooled"`: `pooled_features`, e.g. SigLIP's attention pooling). One image: its vector alone."""
        if pooling not in POOLINGS:
            raise InputError(f"expected one of {', '.join(POOLINGS)}; received {pooling!r}.", "pooling",
                             "embed_images")  # fmt: skip
        if pooling == "token" and not getattr(self, "use_class_token", True):
            raise InputError("the model has no class token (use_class_token=False); use 'mean' or 'patches'.",
                             "pooling", "embed_images")  # fmt: skip
        single = one_image(images)
        pixels = self.preprocess_images([images] if single else images)
        parts = []
        for part in _batches(pixels, batch_size):
            # without its head the model's output is the token sequence: Keras' compiled step, one program per shape
            if pooling == "pooled":
                parts.append(ops.convert_to_numpy(self.pooled_features(ops.convert_to_tensor(part))))
                continue
            compiled = not getattr(self, "include_top", True)
            tokens = self.predict_on_batch(part) if compiled else self.features(ops.convert_to_tensor(part))
            tokens = ops.convert_to_numpy(tokens)
            patches = tokens[:, getattr(self, "num_leading_tokens", 1) :]
            parts.append(tokens[:, 0] if pooling == "token" else patches.mean(1) if pooling == "mean" else patches)
        vectors = np.concatenate(parts).astype("float32")
        return vectors[0] if single else vectors


def one_image(images) -> bool:
    """Whether `images` is one image (a path, a PIL image, an array of one), not a batch of them."""
    return not (isinstance(images, (list, tuple)) or (isinstance(images, np.ndarray) and images.ndim == 4))


def _batches(pixels: np.ndarray, batch_size: int):
    if not is_integer(batch_size) or batch_size < 1:
        raise InputError(f"expected a positive integer; received {batch_size!r}.", "batch_size")
    return [pixels[start : start + batch_size] for start in range(0, len(pixels), batch_size)]
