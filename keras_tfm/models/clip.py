"""CLIP (Radford et al. 2021): an image tower and a text tower whose pooled vectors, projected into one space and
normalized, score images against texts by cosine similarity times a learned temperature.

images -> ViT (patch embedding without bias, LayerNorm before the blocks, quick_gelu) -> class token, normalized
texts  -> CLIPTextEncoder (causal pre-norm blocks, final LayerNorm) -> the end token's vector
each   -> Dense(projection_dim, no bias) -> unit length;  logits_per_image = exp(logit_scale) * images @ texts.T
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers import EncoderBlock, LearnedPositionEmbedding, TokenEmbedding
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.models.base import ZooModel
from keras_tfm.models.image_text_tasks import ImageTextModel, check_towers, unit
from keras_tfm.models.vit import ViT

TEXT_POOLINGS = ("end_token", "largest_id", "last_token")


@keras.saving.register_keras_serializable(package="keras_tfm")
class CLIPTextEncoder(ZooModel):
    """CLIP's text tower: `model(token_ids)` gives one normalized vector per token; `pooled(...)` the end token's.
    With `causal=False, pooling="last_token"` it is SigLIP's.

    Args:
        vocabulary_size, max_length: the token and position tables (CLIP's texts hold 77 tokens).
        num_layers, num_heads, hidden_dim, intermediate_dim: the causal encoder.
        activation ("quick_gelu": OpenAI's checkpoints), layer_norm_epsilon, attention_dropout.
        end_token_id: the token whose vector stands for the text (its first occurrence).
        pooling: "end_token" (at `end_token_id`), or "largest_id" (at the token of the largest id, as the first
            checkpoints pooled: their configs' `eos_token_id` is 2), or "last_token" (at the last place: texts
            padded to `max_length` with `pad_token_id`, every place attended, as SigLIP was trained).
        causal: each token attends to those before it only (CLIP's); False: to every token (SigLIP's).
        pad_token_id: the id that fills texts to `max_length` for "last_token" pooling.

    Example:
    >>> text = CLIPTextEncoder(vocabulary_size=100, max_length=16, num_layers=1, num_heads=2, hidden_dim=16,
    ...                        end_token_id=99)
    >>> tuple(text.pooled(np.array([[5, 7, 99, 0]])).shape)
    (1, 16)
    """

    def __init__(self, vocabulary_size: int = 49408, max_length: int = 77, num_layers: int = 12, num_heads: int = 8,
                 hidden_dim: int = 512, intermediate_dim: int | None = None, activation: str = "quick_gelu",
                 layer_norm_epsilon: float = 1e-5, attention_dropout: float = 0.0, end_token_id: int = 49407,
                 pooling: str = "end_token", causal: bool = True, pad_token_id: int = 0, **kwargs):  # fmt: skip
        check_arguments("CLIPTextEncoder", locals(), optional=("intermediate_dim",))
        if pooling not in TEXT_POOLINGS:
            raise InputError(f"expected one of {TEXT_POOLINGS}; received {pooling!r}.", "pooling",
                             caller="CLIPTextEncoder")  # fmt: skip
        kwargs.setdefault("name", "clip_text_encoder")
        self._check_heads("CLIPTextEncoder", hidden_dim, num_heads)
        super().__init__(**kwargs)
        self.vocabulary_size, self.max_length, self.num_layers = vocabulary_size, max_length, num_layers
        self.num_heads, self.hidden_dim, self.intermediate_dim = (
            num_heads,
            hidden_dim,
            intermediate_dim or 4 * hidden_dim,
        )
        self.activation, self.layer_norm_epsilon = activation, layer_norm_epsilon
        self.attention_dropout, self.end_token_id, self.pooling = attention_dropout, end_token_id, pooling
        self.causal, self.pad_token_id = causal, pad_token_id
        policy = self.dtype_policy
        self.token_embedding = TokenEmbedding(vocabulary_size, hidden_dim, dtype=policy, name="token_embedding")
        self.position_embedding = LearnedPositionEmbedding(max_length, dtype=policy, name="position_embedding")
        self.blocks = [
            EncoderBlock(num_heads, self.intermediate_dim, attention_dropout=attention_dropout, activation=activation,
                         norm_first=True, layer_norm_epsilon=layer_norm_epsilon, dtype=policy, name=f"block_{i}")
            for i in range(num_layers)
        ]  # fmt: skip
        self.final_norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy, name="final_norm")

    @property
    def longest_input(self) -> int:
        return self.max_length

    def build(self, token_ids_shape=None):
        self.call(keras.KerasTensor((1, 2), "int32"))  # builds sub-layers, computes nothing
        self.built = True

    def call(self, token_ids, padding_mask=None, training=None):
        if isinstance(token_ids, dict):
            return self.call(**token_ids, training=training)
        x = self.token_embedding(token_ids)
        x = x + self.position_embedding(x)
        causal = None
        if self.causal:
            length = ops.shape(token_ids)[1]
            causal = ops.arange(length)[None, :] <= ops.arange(length)[:, None]
            causal = ops.broadcast_to(causal[None], (ops.shape(token_ids)[0], length, length))
        for block in self.blocks:
            x = block(x, padding_mask=padding_mask, attention_mask=causal, training=training)
        return self.final_norm(x)

    def pooled(self, token_ids, padding_mask=None, training=None):
        """`(batch, hidden_dim)`: each text's vector at its end token (`end_token_id`'s first place), or at its
        last place (`pooling="last_token"`)."""
        x = self(token_ids, padding_mask=padding_mask, training=training)
        if self.pooling == "last_token":
            return x[:, -1]
        ids = ops.convert_to_tensor(token_ids, "int32")
        if self.pooling == "largest_id":
            where = ops.argmax(ids, axis=-1)
        else:
            where = ops.argmax(ops.cast(ops.equal(ids, self.end_token_id), "int32"), axis=-1)
        return ops.take_along_axis(x, ops.reshape(ops.cast(where, "int32"), (-1, 1, 1)), axis=1)[:, 0]

    def text_batch(self, ids: list) -> dict:
        """Token ids of texts (each with its special tokens) as this tower reads them, with their padding mask:
        right-padded with 0 to the longest, or for "last_token" pooling filled to `max_length` with
        `pad_token_id` (transformers' `padding="max_length"`, which SigLIP's pipeline asks for)."""
        length = self.max_length if self.pooling == "last_token" else max(len(row) for row in ids)
        filled = np.full((len(ids), length), self.pad_token_id if self.pooling == "last_token" else 0, "int32")
        for row, values in enumerate(ids):
            filled[row, : len(values)] = values[:length]
        return {"token_ids": filled, "padding_mask": np.arange(length)[None] < np.array([[len(r)] for r in ids])}

    def _export_signature(self) -> list:
        names = ("token_ids", "padding_mask")
        return [{name: keras.InputSpec(shape=(None, None), dtype="int32", name=name) for name in names}]

    def _id_inputs(self) -> dict:
        return {"token_ids": (self.vocabulary_size, "vocabulary_size"), "padding_mask": None}


@keras.saving.register_keras_serializable(package="keras_tfm")
class CLIP(ImageTextModel):
    """An image tower and a text tower scored against each other: a model of two towers.

    Args:
        vision_encoder: the image tower, a `ViT` with `include_top=False` (its class token after the final norm).
        text_encoder: the text tower, a `CLIPTextEncoder` (or any model with `pooled` and `hidden_dim`).
            One tower may be None: a model that embeds one kind (transformers' `CLIPVisionModelWithProjection`,
            `CLIPTextModelWithProjection`), without the temperature.
        projection_dim: the shared space's size.
        logit_scale_init: the learned temperature's logarithm at the start (ln(1 / 0.07), CLIP's).

    `fit` takes dicts of paired `images` and `token_ids` without labels: the default loss is CLIP's contrastive
    loss on `logits_per_image` (`keras_tfm.ContrastiveLoss`), and `logit_scale` is kept in [0, ln 100] after each
    step, as open_clip clamps it.

    Call arguments (keywords, or one dict): `images` `(batch_images, height, width, 3)`, `token_ids`
    `(batch_texts, length)`, `padding_mask`. Returns a dict named as transformers' `CLIPOutput`:
    `logits_per_image` `(batch_images, batch_texts)`, `logits_per_text`, `image_embeds`, `text_embeds` (unit length);
    given one kind of input, its embeddings alone (what `predict_on_batch` compiles for each tower).
    With the checkpoint's processor and tokenizer: `embed_images`, `embed_texts`, `similarity`, `zero_shot_classify`
    (`keras_tfm.models.image_text_tasks`).

    Example:
    >>> vision = keras_tfm.ViT(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, include_top=False,
    ...                        patch_bias=False, norm_before_blocks=True, activation="quick_gelu")
    >>> text = CLIPTextEncoder(vocabulary_size=100, max_length=16, num_layers=1, num_heads=2, hidden_dim=16,
    ...                        end_token_id=99)
    >>> clip = CLIP(vision, text, projection_dim=8)
    >>> out = clip(images=np.zeros((2, 16, 16, 3), "float32"), token_ids=np.array([[5, 99], [7, 99], [9, 99]]))
    >>> tuple(out["logits_per_image"].shape)
    (2, 3)
    """

    def __init__(self, vision_encoder: keras.Model | None, text_encoder: keras.Model | None, projection_dim: int = 512,
                 logit_scale_init: float = math.log(1 / 0.07), **kwargs):  # fmt: skip
        check_arguments("CLIP", {"projection_dim": projection_dim})
        kwargs.setdefault("name", "clip")
        super().__init__(**kwargs)
        check_towers(vision_encoder, text_encoder, "CLIP")
        self.vision_encoder, self.text_encoder = vision_encoder, text_encoder
        self.projection_dim, self.logit_scale_init = projection_dim, logit_scale_init
        policy = self.dtype_policy
        self.visual_projection, self.text_projection = (
            None if tower is None else keras.layers.Dense(projection_dim, use_bias=False, dtype=policy, name=name)
            for tower, name in ((vision_encoder, "visual_projection"), (text_encoder, "text_projection"))
        )
        self._compile_defaults()

    def default_loss(self) -> dict | None:
        """CLIP's contrastive loss on `logits_per_image`: `fit` takes (images, texts) pairs without labels."""
        from keras_tfm.losses import ContrastiveLoss

        return {"logits_per_image": ContrastiveLoss()} if self.has_both_towers else None

    @property
    def embedding_dim(self) -> int:
        return self.projection_dim

    def build(self, inputs_shape=None):
        self.build_towers()
        for projection, tower in ((self.visual_projection, self.vision_encoder),
                                  (self.text_projection, self.text_encoder)):  # fmt: skip
            if tower is not None:
                projection.build((None, tower.hidden_dim))
        if self.has_both_towers:
            self.logit_scale = self.add_weight(name="logit_scale", shape=(), constraint=TemperatureClamp(),
                                               initializer=keras.initializers.Constant(self.logit_scale_init))  # fmt: skip
        self.built = True

    def image_embeddings(self, images, training=None):
        """`(batch, projection_dim)` unit vectors of `images` (prepared pixels)."""
        return unit(self.visual_projection(self.vision_encoder.pooled_features(images, training=training)))

    def text_embeddings(self, token_ids, padding_mask=None, training=None):
        """`(batch, projection_dim)` unit vectors of texts (token ids with their end token)."""
        return unit(self.text_projection(self.text_encoder.pooled(token_ids, padding_mask, training=training)))

    def pair_logits(self, cosines):
        """The cosines of (text, image) pairs times the learned temperature."""
        return ops.exp(ops.cast(self.logit_scale, cosines.dtype)) * cosines

    def zero_shot_scores(self, cosines: np.ndarray) -> np.ndarray:
        """Each image's softmax over the labels of `(images, labels)` cosines."""
        logits = np.exp(float(ops.convert_to_numpy(self.logit_scale))) * cosines
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        return scores / scores.sum(-1, keepdims=True)


@keras.saving.register_keras_serializable(package="keras_tfm")
class TemperatureClamp(keras.constraints.Constraint):
    """Keeps a learned log-temperature in [0, ln 100] after each step, as open_clip clamps CLIP's `logit_scale`
    (the similarities are multiplied by at most 100)."""

    def __init__(self, maximum: float = math.log(100.0)):
        self.maximum = maximum

    def __call__(self, w):
        return ops.clip(w, 0.0, self.maximum)

    def get_config(self) -> dict:
        return {"maximum": self.maximum}


def _clip(vision: dict, text: dict, projection_dim: int, overrides: dict) -> CLIP:
    """A CLIP of OpenAI's published shapes; `overrides` go to the towers (`vision_*`, `text_*`) or the model."""
    vision = {**vision, **{k[7:]: v for k, v in overrides.items() if k.startswith("vision_")}}
    text = {**text, **{k[5:]: v for k, v in overrides.items() if k.startswith("text_")}}
    rest = {k: v for k, v in overrides.items() if not k.startswith(("vision_", "text_"))}
    image_tower = ViT(**vision, include_top=False, patch_bias=False, norm_before_blocks=True, activation="quick_gelu",
                      layer_norm_epsilon=1e-5, name="vision_encoder")  # fmt: skip
    return CLIP(image_tower, CLIPTextEncoder(**text, name="text_encoder"), **{"projection_dim": projection_dim, **rest})


_BASE_TEXT = dict(num_layers=12, num_heads=8, hidden_dim=512)
_LARGE_VISION = dict(num_layers=24, num_heads=16, hidden_dim=1024, patch_size=14)
_LARGE_TEXT = dict(num_layers=12, num_heads=12, hidden_dim=768)


def clip_vit_base_patch32(**overrides) -> CLIP:
    """CLIP ViT-B/32 (151M, = `CLIPModel` of openai/clip-vit-base-patch32): `vision_*` and `text_*` arguments go
    to the towers (`vision_image_size=...`)."""
    return _clip(dict(num_layers=12, num_heads=12, hidden_dim=768, patch_size=32), _BASE_TEXT, 512, overrides)


def clip_vit_base_patch16(**overrides) -> CLIP:
    """CLIP ViT-B/16 (150M)."""
    return _clip(dict(num_layers=12, num_heads=12, hidden_dim=768, patch_size=16), _BASE_TEXT, 512, overrides)


def clip_vit_large_patch14(**overrides) -> CLIP:
    """CLIP ViT-L/14 (428M)."""
    return _clip(_LARGE_VISION, _LARGE_TEXT, 768, overrides)


def clip_vit_large_patch14_336(**overrides) -> CLIP:
    """CLIP ViT-L/14 at 336 pixels (428M)."""
    return _clip({**_LARGE_VISION, "image_size": 336}, _LARGE_TEXT, 768, overrides)
