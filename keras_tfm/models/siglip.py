"""SigLIP (Zhai et al. 2023) and SigLIP 2 at fixed resolution: CLIP's two towers trained with a sigmoid loss,
each (image, text) pair its own yes-or-no question.

images -> ViT without class token (tanh GELU, no norm before the blocks) -> attention pooling (MAP) -> unit length
texts  -> CLIPTextEncoder (bidirectional, padded to its length) -> last token -> Dense -> unit length
logits_per_text = exp(logit_scale) * texts @ images.T + logit_bias
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.models.clip import CLIPTextEncoder
from keras_tfm.models.image_text_tasks import ImageTextModel, check_towers, unit
from keras_tfm.models.vit import ViT


@keras.saving.register_keras_serializable(package="keras_tfm")
class SigLIP(ImageTextModel):
    """An image tower and a text tower scored pair by pair: a model of two towers.

    Args:
        vision_encoder: a `ViT` with `include_top=False` whose `pooling` gives the image's vector (SigLIP's:
            `use_class_token=False, pooling="attention"`); the shared space is its width.
        text_encoder: a `CLIPTextEncoder` (SigLIP's: `causal=False, pooling="last_token"`); its pooled vector
            goes through a Dense (`text_head`, with bias) to the image tower's width.
        logit_scale_init, logit_bias_init: the learned temperature's logarithm and bias at the start
            (ln 10 and -10, the paper's).
        embedding_dim: the shared space's size: the image tower's width (the default), or for a model of the text
            tower alone (`vision_encoder=None`, transformers' `SiglipTextModel`), its head's.

    `fit` takes dicts of paired `images` and `token_ids` without labels: the default loss is SigLIP's sigmoid loss
    on `logits_per_text` (`keras_tfm.SigmoidLoss`). Call arguments and outputs as `CLIP`'s (transformers'
    `SiglipOutput`); `zero_shot_classify` scores each label by its own sigmoid, as transformers' pipeline does.

    Example:
    >>> vision = keras_tfm.ViT(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, include_top=False,
    ...                        use_class_token=False, pooling="attention", activation="gelu_approximate")
    >>> text = CLIPTextEncoder(vocabulary_size=100, max_length=8, num_layers=1, num_heads=2, hidden_dim=16,
    ...                        causal=False, pooling="last_token", activation="gelu_approximate")
    >>> siglip = SigLIP(vision, text)
    >>> out = siglip(images=np.zeros((2, 16, 16, 3), "float32"), token_ids=np.array([[5, 1], [7, 1], [9, 1]]))
    >>> tuple(out["logits_per_text"].shape)
    (3, 2)
    """

    def __init__(self, vision_encoder: keras.Model | None, text_encoder: keras.Model | None,
                 logit_scale_init: float = math.log(10), logit_bias_init: float = -10.0,
                 embedding_dim: int | None = None, **kwargs):  # fmt: skip
        kwargs.setdefault("name", "siglip")
        super().__init__(**kwargs)
        check_towers(vision_encoder, text_encoder, "SigLIP")
        if vision_encoder is not None and embedding_dim not in (None, vision_encoder.hidden_dim):
            raise InputError(f"the shared space is the image tower's width, {vision_encoder.hidden_dim}; received "
                             f"{embedding_dim}.", "embedding_dim", caller="SigLIP")  # fmt: skip
        check_arguments("SigLIP", {"embedding_dim": embedding_dim}, optional=("embedding_dim",))
        self.vision_encoder, self.text_encoder = vision_encoder, text_encoder
        self.logit_scale_init, self.logit_bias_init = logit_scale_init, logit_bias_init
        self.embedding_dim = embedding_dim or (vision_encoder or text_encoder).hidden_dim
        self.text_head = (
            None if text_encoder is None else keras.layers.Dense(self.embedding_dim, dtype=self.dtype_policy,
                                                                 name="text_head")
        )  # fmt: skip
        self._compile_defaults()

    def default_loss(self) -> dict | None:
        """SigLIP's sigmoid loss on `logits_per_text`: `fit` takes (images, texts) pairs without labels."""
        from keras_tfm.losses import SigmoidLoss

        return {"logits_per_text": SigmoidLoss()} if self.has_both_towers else None

    def build(self, inputs_shape=None):
        self.build_towers()
        if self.text_encoder is not None:
            self.text_head.build((None, self.text_encoder.hidden_dim))
        if self.has_both_towers:
            self.logit_scale = self.add_weight(name="logit_scale", shape=(),
                                               initializer=keras.initializers.Constant(self.logit_scale_init))  # fmt: skip
            self.logit_bias = self.add_weight(name="logit_bias", shape=(),
                                              initializer=keras.initializers.Constant(self.logit_bias_init))  # fmt: skip
        self.built = True

    def image_embeddings(self, images, training=None):
        """`(batch, embedding_dim)` unit vectors of `images` (prepared pixels)."""
        return unit(self.vision_encoder.pooled_features(images, training=training))

    def text_embeddings(self, token_ids, padding_mask=None, training=None):
        """`(batch, embedding_dim)` unit vectors of texts (token ids as `text_encoder.text_batch` fills them)."""
        return unit(self.text_head(self.text_encoder.pooled(token_ids, padding_mask, training=training)))

    def pair_logits(self, cosines):
        """The cosines of (text, image) pairs times the learned temperature, plus the learned bias."""
        dtype = cosines.dtype
        return ops.exp(ops.cast(self.logit_scale, dtype)) * cosines + ops.cast(self.logit_bias, dtype)

    def zero_shot_scores(self, cosines: np.ndarray) -> np.ndarray:
        """Each (image, label)'s own sigmoid of its logit."""
        scale, bias = (float(ops.convert_to_numpy(v)) for v in (self.logit_scale, self.logit_bias))
        return 1 / (1 + np.exp(-(np.exp(scale) * cosines + bias)))


def _siglip(vision: dict, text: dict, overrides: dict) -> SigLIP:
    """A SigLIP of Google's published shapes; `overrides` go to the towers (`vision_*`, `text_*`) or the model."""
    vision = {**vision, **{k[7:]: v for k, v in overrides.items() if k.startswith("vision_")}}
    text = {**text, **{k[5:]: v for k, v in overrides.items() if k.startswith("text_")}}
    rest = {k: v for k, v in overrides.items() if not k.startswith(("vision_", "text_"))}
    image_tower = ViT(**vision, include_top=False, use_class_token=False, pooling="attention",
                      activation="gelu_approximate", name="vision_encoder")  # fmt: skip
    # end_token_id: the checkpoints' configs' (unused: the text is pooled at its last place)
    text = {"vocabulary_size": 32000, "max_length": 64, "end_token_id": 49407, "pad_token_id": 1, **text}
    text_tower = CLIPTextEncoder(**text, causal=False, pooling="last_token", activation="gelu_approximate",
                                 layer_norm_epsilon=1e-6, name="text_encoder")  # fmt: skip
    return SigLIP(image_tower, text_tower, **rest)


_BASE = dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072)
_LARGE = dict(num_layers=24, num_heads=16, hidden_dim=1024, intermediate_dim=4096)
_SO400M = dict(num_layers=27, num_heads=16, hidden_dim=1152, intermediate_dim=4304)


def siglip_base_patch16_224(**overrides) -> SigLIP:
    """SigLIP B/16 at 224 pixels (203M, = `SiglipModel` of google/siglip-base-patch16-224): `vision_*` and
    `text_*` arguments go to the towers. SigLIP 2's: `text_vocabulary_size=256000, text_pad_token_id=0`."""
    return _siglip({**_BASE, "patch_size": 16, "image_size": 224}, _BASE, overrides)


def siglip_large_patch16_256(**overrides) -> SigLIP:
    """SigLIP L/16 at 256 pixels (652M)."""
    return _siglip({**_LARGE, "patch_size": 16, "image_size": 256}, _LARGE, overrides)


def siglip_so400m_patch14_224(**overrides) -> SigLIP:
    """SigLIP So400m/14 at 224 pixels (877M): the shape-optimized towers, 27 layers 1152 wide. SigLIP 2's
    So400m/16: `vision_patch_size=16, vision_image_size=384` (or 256, 512)."""
    return _siglip({**_SO400M, "patch_size": 14, "image_size": 224}, _SO400M, overrides)
