"""An image-text model's towers as exported functions: `embed_images` takes the pixels its image processor makes
(float32 `(batch, image_size, image_size, channels)`), `embed_texts` the token ids its tokenizer makes and their
padding mask (int32 `(batch, length)` each); both return unit vectors in the shared space."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.export.formats import Endpoint


def image_endpoint(model) -> Endpoint:
    """`embed_images(images)` of a model with an image tower."""
    vision = model.vision_encoder

    def embed_images(images):  # the name is the signature's
        return model.image_embeddings(images)

    shape = (None, vision.image_size, vision.image_size, vision.num_channels)
    return Endpoint("embed_images", embed_images, [keras.InputSpec(shape=shape, dtype="float32", name="images")])


def text_endpoint(model) -> Endpoint:
    """`embed_texts(token_ids, padding_mask)` of a model with a text tower: any length up to the tower's, or its
    length exactly where it pools at the last place (SigLIP's texts are filled to it)."""
    text = model.text_encoder
    fixed = text.pooling == "last_token"
    length = text.max_length if fixed else None

    def embed_texts(token_ids, padding_mask):  # the names are the signature's
        return model.text_embeddings(ops.cast(token_ids, "int32"), ops.cast(padding_mask, "bool"))

    signature = [
        keras.InputSpec(shape=(None, length), dtype="int32", name=name) for name in ("token_ids", "padding_mask")
    ]
    shape = f"(batch, {length})" if fixed else "(batch, length)"
    symbolic = {"polymorphic_shapes": [shape, shape], "with_gradient": False}
    if not fixed:
        symbolic["polymorphic_constraints"] = [f"length <= {text.max_length}"]
    return Endpoint("embed_texts", embed_texts, signature, symbolic)
