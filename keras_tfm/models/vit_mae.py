"""ViTMAE: masked-autoencoder pretraining (He et al. 2022), features learned from unlabelled images.

image -> patches -> a random 25% kept (the noise's smallest) -> the one ViT over those alone
      -> MaskedImageDecoder: mask tokens at the hidden patches, blocks -> every patch's pixels
loss: mean squared error over the hidden patches only (each patch's pixels normalized first, optionally)
The encoder is a `ViT` (`model.encoder`): after pretraining, its features are what a probe or a fine-tuning reads.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments, is_integer
from keras_tfm.layers.masked_image_decoder import MaskedImageDecoder, mae_position_table
from keras_tfm.losses import masked_patch_loss
from keras_tfm.models.base import ZooModel
from keras_tfm.models.vit import ViT


@keras.saving.register_keras_serializable(package="keras_tfm")
class ViTMAE(ZooModel):
    """A masked autoencoder: `fit(images)` learns without labels.

    Args:
        encoder: a `ViT` with `include_top=False`, learned positions and a class token; its position table is
            frozen, and set to MAE's fixed sin-cos values where the encoder is not built yet (a checkpoint's own
            table is loaded over it).
        decoder_dim, decoder_layers, decoder_heads, decoder_intermediate_dim: the decoder's blocks.
        mask_ratio: the share of patches hidden from the encoder (0.75).
        normalize_targets: each patch's pixels normalized by their own mean and variance before the loss
            (transformers' `norm_pix_loss`).
        seed: of the random masks.

    Call arguments:
        images: `(batch, image_size, image_size, channels)`.
        noise: `(batch, patches)` floats; the patches with the smallest noise are kept (transformers' `noise`:
            a mask given by the caller). Default: uniform noise drawn from `seed`.

    Returns a dict named as transformers': `logits` `(batch, patches, patch_size**2 * channels)` (every patch's
    predicted pixels, in the layout of `patchify`), `mask` `(batch, patches)` (1 where hidden), `ids_restore`.

    Example:
    >>> encoder = keras_tfm.ViT(image_size=16, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8,
    ...                         include_top=False)
    >>> mae = ViTMAE(encoder, decoder_dim=8, decoder_layers=1, decoder_heads=2, decoder_intermediate_dim=16)
    >>> tuple(mae(np.zeros((2, 16, 16, 3), "float32"))["logits"].shape)
    (2, 16, 48)
    """

    def __init__(self, encoder: ViT, decoder_dim: int = 512, decoder_layers: int = 8, decoder_heads: int = 16,
                 decoder_intermediate_dim: int = 2048, mask_ratio: float = 0.75, normalize_targets: bool = False,
                 seed: int | None = None, **kwargs):  # fmt: skip
        check_arguments("ViTMAE", locals())
        plain = isinstance(encoder, ViT) and encoder.num_leading_tokens == 1 and encoder.positions == "learned"
        if not plain or encoder.include_top:
            raise InputError(f"expected a ViT with include_top=False, learned positions and a class token alone "
                             f"before the patches; received {encoder!r:.120}.", "encoder", "ViTMAE")  # fmt: skip
        if seed is not None and not is_integer(seed):
            raise InputError(f"expected an integer or None; received {seed!r}.", "seed", "ViTMAE")
        kwargs.setdefault("name", "vit_mae")
        super().__init__(**kwargs)
        self.encoder, self.decoder_dim, self.decoder_layers = encoder, decoder_dim, decoder_layers
        self.decoder_heads, self.decoder_intermediate_dim = decoder_heads, decoder_intermediate_dim
        self.mask_ratio, self.normalize_targets, self.seed = mask_ratio, normalize_targets, seed
        self.num_patches = encoder.grid_size**2
        self.num_kept = int(self.num_patches * (1 - mask_ratio))
        if self.num_kept < 1:
            raise InputError(f"mask_ratio={mask_ratio} hides all {self.num_patches} patches.", "mask_ratio", "ViTMAE")
        self.decoder = MaskedImageDecoder(encoder.grid_size, encoder.patch_size**2 * encoder.num_channels, decoder_dim,
                                          decoder_layers, decoder_heads, decoder_intermediate_dim,
                                          encoder.layer_norm_epsilon, dtype=self.dtype_policy, name="decoder")  # fmt: skip
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, images_shape=None):
        encoder = self.encoder
        if not encoder.built:  # a fresh encoder: MAE's table; a trained one keeps its own
            encoder.build()
            encoder.position_embedding.set_weights([mae_position_table(encoder.grid_size, encoder.hidden_dim)])
        encoder.position_embedding.trainable = False  # fixed sin-cos positions, as the paper's
        self.decoder.build((None, None, encoder.hidden_dim), (None, self.num_patches))
        self.built = True

    def call(self, images, noise=None, training=None):
        self._check_images(images)
        batch = ops.shape(images)[0]
        if noise is None:
            noise = keras.random.uniform((batch, self.num_patches), seed=self.seed_generator)
        ids_shuffle = ops.argsort(noise, axis=1)  # kept first: the smallest noise
        ids_restore = ops.argsort(ids_shuffle, axis=1)
        latent = self.encoder.features(images, kept_patches=ids_shuffle[:, : self.num_kept], training=training)
        logits = self.decoder(latent, ids_restore, training=training)
        mask = ops.cast(ops.greater_equal(ids_restore, self.num_kept), logits.dtype)
        return {"logits": logits, "mask": mask, "ids_restore": ids_restore}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The loss of `fit(images)`: `masked_patch_loss` of the images' patches against `y_pred`'s."""
        images = x["images"] if isinstance(x, dict) else x
        return masked_patch_loss(self.patchify(images), y_pred["logits"], y_pred["mask"], self.normalize_targets)

    def _check_images(self, images) -> None:
        side, channels = self.encoder.image_size, self.encoder.num_channels
        if tuple(images.shape[1:]) != (side, side, channels):
            raise InputError(f"expected images (batch, {side}, {side}, {channels}): the decoder's positions are the "
                             f"encoder's grid; received shape {tuple(images.shape)}.", "images", "ViTMAE")  # fmt: skip

    def patchify(self, images):
        """`(batch, height, width, channels)` -> `(batch, patches, patch_size**2 * channels)`, raster order, each
        patch's pixels row by row with their channels last (transformers' `patchify` of channels-first pixels)."""
        p, channels = self.encoder.patch_size, self.encoder.num_channels
        batch, height, width = ops.shape(images)[0], ops.shape(images)[1], ops.shape(images)[2]
        x = ops.reshape(images, (batch, height // p, p, width // p, p, channels))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (batch, (height // p) * (width // p), p * p * channels))

    def unpatchify(self, patches):
        """`patchify`'s inverse: `(batch, patches, patch_size**2 * channels)` -> square images."""
        p, channels, grid = self.encoder.patch_size, self.encoder.num_channels, self.encoder.grid_size
        x = ops.reshape(patches, (ops.shape(patches)[0], grid, grid, p, p, channels))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (ops.shape(patches)[0], grid * p, grid * p, channels))

    def reconstruct(self, images, noise=None) -> dict:
        """What the model saw and what it made of the rest, as the paper draws them: `masked` (the images with
        their hidden patches zeroed), `reconstruction` (every patch predicted; with `normalize_targets`, put back
        at each true patch's mean and spread), `pasted` (the visible patches, the predicted hidden ones), NumPy
        `(batch, height, width, channels)`, and `hidden` `(batch, height, width, 1)`, True at hidden pixels."""
        images = ops.convert_to_tensor(np.asarray(images, "float32"))
        out = self(images, noise=noise)
        targets = self.patchify(images)
        predicted = out["logits"]
        if self.normalize_targets:
            mean = ops.mean(targets, axis=-1, keepdims=True)
            spread = ops.sqrt(ops.var(targets, axis=-1, keepdims=True) * _unbiased(targets) + 1e-6)
            predicted = predicted * spread + mean
        hidden = out["mask"][..., None]
        pictures = {"masked": targets * (1 - hidden), "reconstruction": predicted,
                    "pasted": targets * (1 - hidden) + predicted * hidden, "hidden": hidden * ops.ones_like(targets)}  # fmt: skip
        pictures = {name: ops.convert_to_numpy(self.unpatchify(value)) for name, value in pictures.items()}
        pictures["hidden"] = pictures["hidden"][..., :1] > 0.5
        return pictures


def _unbiased(targets):
    """n / (n - 1): PyTorch's `var` divides by n - 1."""
    n = ops.shape(targets)[-1]
    return n / (n - 1)


def vit_mae_base(**overrides) -> ViTMAE:
    """MAE ViT-B/16 (`facebook/vit-mae-base`): a ViT-B/16 encoder (224 pixels), a decoder 8 x 512 wide, 75%
    hidden; `encoder_*` overrides go to the encoder."""
    return _mae(dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072), overrides)


def vit_mae_large(**overrides) -> ViTMAE:
    """MAE ViT-L/16 (`facebook/vit-mae-large`)."""
    return _mae(dict(num_layers=24, num_heads=16, hidden_dim=1024, intermediate_dim=4096), overrides)


def vit_mae_huge(**overrides) -> ViTMAE:
    """MAE ViT-H/14 (`facebook/vit-mae-huge`)."""
    return _mae(dict(num_layers=32, num_heads=16, hidden_dim=1280, intermediate_dim=5120, patch_size=14), overrides)


def _mae(encoder: dict, overrides: dict) -> ViTMAE:
    encoder_overrides = {key.removeprefix("encoder_"): overrides.pop(key) for key in list(overrides)
                         if key.startswith("encoder_")}  # fmt: skip
    arguments = dict(image_size=224, patch_size=16, include_top=False, layer_norm_epsilon=1e-12)
    return ViTMAE(ViT(**{**arguments, **encoder, **encoder_overrides}), **overrides)
