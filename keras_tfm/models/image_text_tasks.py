"""What a person does with an image-text model, images as files, PIL images or arrays and texts as strings: unit
vectors of each (`embed_images`, `embed_texts`), their cosine similarities (`similarity`), and zero-shot
classification by prompts (`zero_shot_classify`, with prompt ensembling as open_clip does it); and what CLIP and
SigLIP share as models (`ImageTextModel`)."""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import is_integer
from keras_tfm.models.base import ZooModel
from keras_tfm.models.image_tasks import one_image


class ImageTextTasks:
    """For a model with `image_processor`, `tokenizer`, `image_embeddings(pixels)`,
    `text_embeddings(token_ids, padding_mask)`, `zero_shot_scores(cosines)` and a `text_encoder` with
    `longest_input` and `text_batch(ids)`."""

    def embed_images(self, images, batch_size: int = 32) -> np.ndarray:
        """`(batch, projection_dim)` unit vectors of `images` (files, PIL images or uint8 arrays of any sizes,
        prepared by the checkpoint's processor); one image: its vector alone."""
        self.check_tower("vision_encoder", "embed_images")
        single = one_image(images)
        if self.image_processor is None:
            raise InputError("this model has no image processor (a checkpoint's preprocessor_config.json): set "
                             "`model.image_processor`.", "images", "embed_images")  # fmt: skip
        listed = [images] if single else list(images)
        _check_batch_size(batch_size, "embed_images")
        parts = [_predicted(self, {"images": self.image_processor(chunk)}, "image_embeds")
                 for chunk in _chunks(listed, batch_size)]  # fmt: skip
        vectors = np.concatenate(parts).astype("float32")
        return vectors[0] if single else vectors

    def embed_texts(self, texts, batch_size: int = 32) -> np.ndarray:
        """`(batch, projection_dim)` unit vectors of `texts`, each tokenized with the checkpoint's tokenizer and cut
        to the text tower's length as CLIP's and SigLIP's tokenizers cut it (CLIP's end token kept); one text: its
        vector alone."""
        single = isinstance(texts, str)
        listed = [texts] if single else texts
        if not isinstance(listed, (list, tuple)) or not listed or not all(isinstance(t, str) for t in listed):
            raise InputError("expected a text or a non-empty list of texts.", "texts", caller="embed_texts")
        self.check_tower("text_encoder", "embed_texts")
        if self.tokenizer is None:
            raise InputError("this model has no tokenizer (a checkpoint's tokenizer.json): set `model.tokenizer`.",
                             "tokenizer", caller="embed_texts")  # fmt: skip
        _check_batch_size(batch_size, "embed_texts")
        parts = []
        for chunk in _chunks(list(listed), batch_size):
            ids = self.tokenizer.encode_batch(chunk, max_length=self.text_encoder.longest_input)
            parts.append(_predicted(self, self.text_encoder.text_batch(ids), "text_embeds"))
        vectors = np.concatenate(parts).astype("float32")
        return vectors[0] if single else vectors

    def similarity(self, images, texts) -> np.ndarray:
        """`(images, texts)` cosine similarities of `images` and `texts`."""
        return np.atleast_2d(self.embed_images(images)) @ np.atleast_2d(self.embed_texts(texts)).T

    def zero_shot_classify(self, images, labels, templates=("a photo of a {}.",), top_k: int | None = None) -> list:
        """Each image's labels with their probabilities, likeliest first, as `[{"label", "score"}]` (transformers'
        zero-shot image-classification pipeline's answer): each label is written into every template, the
        prompts' unit vectors averaged and scaled to unit length again (open_clip's prompt ensembling), then
        scored against the image with the model's temperature: a softmax over the labels (CLIP), or each label's
        own sigmoid (SigLIP, whose scores need not sum to 1). One image: its list alone."""
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
        single = one_image(images)
        scores = self.zero_shot_scores(np.atleast_2d(self.embed_images(images)) @ classes.T)
        answers = [[{"label": labels[i], "score": float(row[i])} for i in np.argsort(-row, kind="stable")[:top_k]]
                   for row in scores]  # fmt: skip
        return answers[0] if single else answers


class ServesImagesAndTexts:
    """The embedding server's protocol (`keras_tfm.serve`'s `/v1/embeddings`) for an image-text model: an input is
    a text, or an image as a data URL (`data:image/png;base64,...`, as multimodal embedding servers take them);
    each comes back as its unit vector in the shared space."""

    normalize = True

    @property
    def max_sequence_length(self) -> int:
        return self.text_encoder.longest_input if self.text_encoder is not None else 0

    def embed(self, texts, batch_size: int = 32) -> np.ndarray:
        """`embed_texts`: what a text embedder's `embed` is."""
        return self.embed_texts(texts, batch_size)

    def encode(self, inputs: list[str]) -> list[np.ndarray]:
        """Each input's token ids (a text, cut as `embed_texts` cuts it), or its prepared pixels `(height, width,
        3)` (an image data URL); an image that does not decode is refused with its index."""
        encoded = []
        for index, item in enumerate(inputs):
            self.check_tower("vision_encoder" if item.startswith("data:image/") else "text_encoder", f"input[{index}]")
            if item.startswith("data:image/"):
                encoded.append(self.image_processor.one(_decoded(item, index), index))
            else:
                encoded.append(self.tokenizer.encode_batch([item], max_length=self.max_sequence_length)[0])
        return encoded

    def embed_token_ids(self, rows: list, batch_size: int = 32) -> np.ndarray:
        """The vectors of `encode`'s rows, texts and images mixed, in their order."""
        texts = [i for i, row in enumerate(rows) if np.ndim(row) == 1]
        images = [i for i, row in enumerate(rows) if np.ndim(row) == 3]
        vectors = np.zeros((len(rows), self.embedding_dim), "float32")
        for chunk in _chunks(texts, batch_size):
            vectors[chunk] = _predicted(self, self.text_encoder.text_batch([rows[i] for i in chunk]), "text_embeds")
        for chunk in _chunks(images, batch_size):
            vectors[chunk] = _predicted(self, {"images": np.stack([rows[i] for i in chunk])}, "image_embeds")
        return vectors

    def input_tokens(self, row) -> int:
        """What an input counts in a response's `usage`: a text's tokens, an image's patches and leading tokens."""
        if np.ndim(row) == 1:
            return len(row)
        patch = self.vision_encoder.patch_size
        return (row.shape[0] // patch) * (row.shape[1] // patch) + self.vision_encoder.num_leading_tokens


class ImageTextModel(ImageTextTasks, ServesImagesAndTexts, ZooModel):
    """What CLIP and SigLIP share: a call on images, texts or both, and training on pairs without labels. A
    subclass has `vision_encoder`, `text_encoder`, `image_embeddings`, `text_embeddings`, `pair_logits(cosines)`
    (the temperature, and a bias where the model has one) and `embedding_dim`."""

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs) -> None:
        # no accuracy by default: the pairs have no labels
        super().compile(optimizer, loss, None if isinstance(metrics, str) and metrics == "auto" else metrics, **kwargs)

    @property
    def vocabulary_size(self) -> int | None:
        """The text tower's: a tokenizer that makes more ids is refused."""
        return None if self.text_encoder is None else self.text_encoder.vocabulary_size

    @property
    def has_both_towers(self) -> bool:
        """Whether the model scores images against texts (a model of one tower embeds one kind only)."""
        return self.vision_encoder is not None and self.text_encoder is not None

    def check_tower(self, tower: str, argument: str) -> None:
        """Refuses, naming `argument`, what needs a tower (`vision_encoder`, `text_encoder`) the model lacks."""
        if getattr(self, tower) is None:
            kind = "image" if tower == "vision_encoder" else "text"
            raise InputError(f"this {type(self).__name__} has no {kind} tower ({tower}=None): it embeds "
                             f"{'texts' if kind == 'image' else 'images'} only.", argument, type(self).__name__)  # fmt: skip

    def call(self, images=None, token_ids=None, padding_mask=None, training=None):
        if isinstance(images, dict):
            return self.call(**images, training=training)
        if images is None and token_ids is None:
            raise InputError("expected images, token_ids or both; received neither.", "images",
                             caller=type(self).__name__)  # fmt: skip
        out = {}
        if images is not None:
            self.check_tower("vision_encoder", "images")
            out["image_embeds"] = self.image_embeddings(images, training)
        if token_ids is not None:
            self.check_tower("text_encoder", "token_ids")
            out["text_embeds"] = self.text_embeddings(token_ids, padding_mask, training)
        if len(out) == 2:
            out["logits_per_text"] = self.pair_logits(
                ops.matmul(out["text_embeds"], ops.transpose(out["image_embeds"]))
            )
            out["logits_per_image"] = ops.transpose(out["logits_per_text"])
        return out

    def _id_inputs(self) -> dict:
        if self.text_encoder is None:
            return {"images": None}
        return {"images": None, "token_ids": (self.text_encoder.vocabulary_size, "vocabulary_size"),
                "padding_mask": None}  # fmt: skip

    def export(self, filepath, format: str = "tf_saved_model", verbose=None, tower: str | None = None) -> None:
        """Each tower as a function a runtime serves without Keras (`keras_tfm.export.towers`): `embed_images(images)`
        takes the pixels the image processor makes, float32 `(batch, image_size, image_size, 3)`;
        `embed_texts(token_ids, padding_mask)` the tokenizer's ids and their mask, int32 `(batch, length)` (SigLIP's
        filled to the tower's length); each returns unit vectors in the shared space. A SavedModel holds both
        (of the towers the model has); a LiteRT or ONNX file one, `tower="image"` or `"text"` (default: the
        model's one tower)."""
        from keras_tfm.export import formats, towers

        owner = f"{type(self).__name__}.export"
        makers = {
            "image": (towers.image_endpoint, self.vision_encoder),
            "text": (towers.text_endpoint, self.text_encoder),
        }
        kinds = [kind for kind, (_, present) in makers.items() if present is not None]
        if tower is not None and (tower not in kinds or format == "tf_saved_model"):
            expected = "None (a SavedModel holds every tower)" if format == "tf_saved_model" else kinds
            raise InputError(f"expected {expected}; received tower={tower!r}.", "tower", owner)
        if format != "tf_saved_model" and tower is None and len(kinds) > 1:
            raise InputError(f"a LiteRT or ONNX file holds one tower ({format=}): give tower='image' or 'text'.",
                             "tower", owner)  # fmt: skip
        formats.check_format(format, owner)
        self._build_on_demand()
        if format == "tf_saved_model":
            return formats.write_endpoints(self, filepath, [makers[kind][0](self) for kind in kinds], verbose)
        formats.write_function(self, filepath, format, makers[tower or kinds[0]][0](self), verbose)

    def build_towers(self) -> None:
        """Builds the towers the model has."""
        for tower in (self.vision_encoder, self.text_encoder):
            if tower is not None:
                tower.build()


def check_towers(vision_encoder, text_encoder, caller: str) -> None:
    """Refuses, by argument, an image tower that is not a ViT without its head, a text tower without `pooled`, or
    neither tower (one may be None: a model that embeds one kind)."""
    from keras_tfm.models.vit import ViT

    if vision_encoder is None and text_encoder is None:
        raise InputError("expected an image tower, a text tower or both; received neither.", "vision_encoder",
                         caller=caller)  # fmt: skip
    if vision_encoder is not None and (not isinstance(vision_encoder, ViT) or vision_encoder.include_top):
        raise InputError(f"expected a ViT with include_top=False; received {vision_encoder!r:.80}.",
                         "vision_encoder", caller=caller)  # fmt: skip
    if text_encoder is not None and not all(hasattr(text_encoder, n) for n in ("pooled", "hidden_dim", "text_batch")):
        raise InputError(f"expected a text tower with `pooled` (a CLIPTextEncoder); received "
                         f"{type(text_encoder).__name__}.", "text_encoder", caller=caller)  # fmt: skip


def unit(x):
    """`x` scaled to unit length along its last axis."""
    return x / ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True))


def _decoded(data_url: str, index: int):
    """The PIL image of a base64 data URL."""
    import base64
    import binascii
    import io

    from keras_tfm.data.image_processing import _pillow

    Image = _pillow()  # a clear error where Pillow is not installed
    from PIL import UnidentifiedImageError

    try:
        header, payload = data_url.split(",", 1)
        if not header.endswith(";base64"):
            raise ValueError("it is not base64")
        image = Image.open(io.BytesIO(base64.b64decode(payload, validate=True)))
        image.load()
        return image
    except (ValueError, binascii.Error) as error:
        why = "it is not base64" if isinstance(error, binascii.Error) or "base64" in str(error) else str(error)[:100]
    except (UnidentifiedImageError, OSError):
        why = "its bytes are not an image file, or are cut short"
    raise InputError(f"input {index} is an image data URL that does not decode ({why}); send "
                     "data:image/<png|jpeg|...>;base64,<the file's bytes>.", f"input[{index}]", "embed")  # fmt: skip


def _predicted(model, inputs: dict, output: str) -> np.ndarray:
    """One tower's output for `inputs`, through Keras' compiled prediction step (one program per input shape)."""
    return ops.convert_to_numpy(model.predict_on_batch(inputs)[output])


def _chunks(items: list, size: int) -> list:
    return [items[start : start + size] for start in range(0, len(items), size)]


def _check_batch_size(batch_size, caller: str) -> None:
    if not is_integer(batch_size) or batch_size < 1:
        raise InputError(f"expected a positive integer; received {batch_size!r}.", "batch_size", caller=caller)
