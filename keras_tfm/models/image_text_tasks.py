"""What a person does with an image-text model, images as files, PIL images or arrays and texts as strings: unit
vectors of each (`embed_images`, `embed_texts`), their cosine similarities (`similarity`), and zero-shot
classification by prompts (`zero_shot_classify`, with prompt ensembling as open_clip does it)."""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import is_integer


class ImageTextTasks:
    """For a model with `image_processor`, `tokenizer`, `image_embeddings(pixels)`,
    `text_embeddings(token_ids, padding_mask)`, `logit_scale` and a `text_encoder` with `longest_input`."""

    def embed_images(self, images, batch_size: int = 32) -> np.ndarray:
        """`(batch, projection_dim)` unit vectors of `images` (files, PIL images or uint8 arrays of any sizes,
        prepared by the checkpoint's processor); one image: its vector alone."""
        single = not (isinstance(images, (list, tuple)) or (isinstance(images, np.ndarray) and images.ndim == 4))
        if self.image_processor is None:
            raise InputError("this model has no image processor (a checkpoint's preprocessor_config.json): set "
                             "`model.image_processor`.", "images", "embed_images")  # fmt: skip
        listed = [images] if single else list(images)
        _check_batch_size(batch_size, "embed_images")
        parts = [ops.convert_to_numpy(self.image_embeddings(ops.convert_to_tensor(self.image_processor(chunk))))
                 for chunk in _chunks(listed, batch_size)]  # fmt: skip
        vectors = np.concatenate(parts).astype("float32")
        return vectors[0] if single else vectors

    def embed_texts(self, texts, batch_size: int = 32) -> np.ndarray:
        """`(batch, projection_dim)` unit vectors of `texts`, each tokenized with the checkpoint's tokenizer and cut
        to the text tower's length as CLIP's tokenizer cuts it (the end token kept); one text: its vector alone."""
        single = isinstance(texts, str)
        listed = [texts] if single else texts
        if not isinstance(listed, (list, tuple)) or not listed or not all(isinstance(t, str) for t in listed):
            raise InputError("expected a text or a non-empty list of texts.", "texts", caller="embed_texts")
        if self.tokenizer is None:
            raise InputError("this model has no tokenizer (a checkpoint's tokenizer.json): set `model.tokenizer`.",
                             "tokenizer", caller="embed_texts")  # fmt: skip
        _check_batch_size(batch_size, "embed_texts")
        parts = []
        for chunk in _chunks(list(listed), batch_size):
            ids = self.tokenizer.encode_batch(chunk, max_length=self.text_encoder.longest_input)
            padded, mask = _padded(ids)
            parts.append(ops.convert_to_numpy(self.text_embeddings(padded, mask)))
        vectors = np.concatenate(parts).astype("float32")
        return vectors[0] if single else vectors

    def similarity(self, images, texts) -> np.ndarray:
        """`(images, texts)` cosine similarities of `images` and `texts`."""
        return np.atleast_2d(self.embed_images(images)) @ np.atleast_2d(self.embed_texts(texts)).T

    def zero_shot_classify(self, images, labels, templates=("a photo of a {}.",), top_k: int | None = None) -> list:
        """Each image's labels with their probabilities, likeliest first, as `[{"label", "score"}]` (transformers'
        zero-shot image-classification pipeline's answer): each label is written into every template, the
        prompts' unit vectors averaged and scaled to unit length again (open_clip's prompt ensembling), then
        scored against the image with the model's temperature and a softmax over the labels. One image: its
        list alone."""
        if not isinstance(labels, (list, tuple)) or not labels or not all(isinstance(x, str) for x in labels):
            raise InputError(f"expected a non-empty list of labels; received {labels!r:.80}.", "labels",
                             caller="zero_shot_classify")  # fmt: skip
        templates = [templates] if isinstance(templates, str) else list(templates)
        if not templates or not all(isinstance(t, str) and "{}" in t for t in templates):
            raise InputError(f"expected templates with a {{}} where the label goes; received {templates!r:.80}.",
                             "templates", caller="zero_shot_classify")  # fmt: skip
        top_k = len(labels) if top_k is None else top_k
        if not is_integer(top_k) or not 1 <= top_k <= len(labels):
            raise InputError(f"expected an integer in [1, {len(labels)}]; received {top_k!r}.", "top_k",
                             caller="zero_shot_classify")  # fmt: skip
        prompts = self.embed_texts([template.format(label) for label in labels for template in templates])
        classes = prompts.reshape(len(labels), len(templates), -1).mean(1)
        classes /= np.linalg.norm(classes, axis=-1, keepdims=True)
        single = not (isinstance(images, (list, tuple)) or (isinstance(images, np.ndarray) and images.ndim == 4))
        logits = (
            np.exp(float(ops.convert_to_numpy(self.logit_scale))) * np.atleast_2d(self.embed_images(images)) @ classes.T
        )
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        answers = [[{"label": labels[i], "score": float(row[i])} for i in np.argsort(-row, kind="stable")[:top_k]]
                   for row in scores]  # fmt: skip
        return answers[0] if single else answers


def _chunks(items: list, size: int) -> list:
    return [items[start : start + size] for start in range(0, len(items), size)]


def _check_batch_size(batch_size, caller: str) -> None:
    if not is_integer(batch_size) or batch_size < 1:
        raise InputError(f"expected a positive integer; received {batch_size!r}.", "batch_size", caller=caller)


def _padded(ids: list) -> tuple[np.ndarray, np.ndarray]:
    """The ids right-padded with 0 to the longest, and the padding mask (True at real tokens)."""
    length = max(len(row) for row in ids)
    padded = np.zeros((len(ids), length), "int32")
    for row, values in enumerate(ids):
        padded[row, : len(values)] = values
    return padded, np.arange(length)[None] < np.array([len(row) for row in ids])[:, None]
