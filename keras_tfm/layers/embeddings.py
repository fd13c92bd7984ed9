"""Turning inputs into token vectors: token ids (with a tied reverse projection) and image patches."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.initializers import own_initializer


@keras.saving.register_keras_serializable(package="keras_tfm")
class TokenEmbedding(keras.layers.ReversibleEmbedding):
    """Token ids to vectors, and (with `reverse=True`) vectors back to vocabulary logits.

    The reverse projection multiplies by the transposed embedding table, so a language-model head
    shares its weights with the input embedding ("weight tying"). Keras' `ReversibleEmbedding` with
    the zoo's argument names and masks; like it, the layer can be quantized (`model.quantize("int8")`
    quantizes the table, used in both directions).

    Args:
        vocabulary_size: number of token ids.
        hidden_dim: size of each token vector.
        mask_zero: if True, id 0 is padding: the layer emits a Keras mask `(batch, length)` that is
            False at padding, and downstream layers (positions, attention blocks) honour it. The
            reverse projection passes the mask of its input vectors on to the logits.
        embeddings_initializer: initializer of the `(vocabulary_size, hidden_dim)` table.
        **kwargs: other arguments of `keras.layers.ReversibleEmbedding` (`name`, `dtype`,
            `reverse_dtype`), but for its untied and soft-capped projections.

    Example:
    >>> embed = TokenEmbedding(vocabulary_size=100, hidden_dim=16)
    >>> vectors = embed(np.array([[1, 2, 3]]))          # (1, 3, 16)
    >>> logits = embed(vectors, reverse=True)            # (1, 3, 100)
    """

    def __init__(
        self,
        vocabulary_size: int,
        hidden_dim: int,
        mask_zero: bool = False,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        check_arguments("TokenEmbedding", locals())
        if not kwargs.pop("tie_weights", True) or kwargs.pop("logit_soft_cap", None) is not None:
            raise InputError(
                "the reverse projection is always tied and uncapped; use "
                "keras.layers.ReversibleEmbedding for tie_weights=False or logit_soft_cap.",
                caller="TokenEmbedding",
            )
        super().__init__(
            input_dim=vocabulary_size,
            output_dim=hidden_dim,
            mask_zero=mask_zero,
            embeddings_initializer=own_initializer(embeddings_initializer),
            **kwargs,
        )
        self.vocabulary_size = vocabulary_size
        self.hidden_dim = hidden_dim

    def call(self, inputs, reverse: bool = False):
        if not reverse:
            return super().call(inputs)
        if inputs.shape[-1] is not None and inputs.shape[-1] != self.hidden_dim:
            raise InputError(
                f"TokenEmbedding(reverse=True) expects `inputs` with last dimension hidden_dim="
                f"{self.hidden_dim}; received shape {tuple(inputs.shape)}."
            )
        # Keras' layer multiplies as given; an embedding does not autocast, so under mixed precision
        # its float32 table would make float32 logits from bfloat16 vectors.
        dtype = self.reverse_dtype or self.compute_dtype
        return ops.matmul(ops.cast(inputs, dtype), ops.transpose(ops.cast(self.embeddings, dtype)))

    def compute_mask(self, inputs, mask=None):
        # The reverse projection gets float vectors: keep their padding mask instead of testing != 0.
        if "float" in keras.backend.standardize_dtype(inputs.dtype):
            return mask
        return keras.layers.Embedding.compute_mask(self, inputs, mask)

    def quantized_call(self, inputs, reverse: bool = False):
        # Keras' quantized lookups and projection divide by float32 scales, which an embedding does not
        # autocast: under mixed precision they would return float32 vectors and logits.
        return ops.cast(super().quantized_call(inputs, reverse=reverse), self.compute_dtype)

    def quantize(self, mode=None, type_check: bool = True, config=None):
        # Keras refuses to quantize subclasses of its embeddings, which might compute otherwise; this
        # one's quantized forms are Keras' own.
        super().quantize(mode, type_check=False, config=config)

    def get_config(self) -> dict:
        config = super().get_config()
        config.pop("input_dim")
        config.pop("output_dim")
        config.update(vocabulary_size=self.vocabulary_size, hidden_dim=self.hidden_dim)
        return config


@keras.saving.register_keras_serializable(package="keras_tfm")
class PatchEmbedding(keras.layers.Layer):
    """Images to patch tokens: cut into `patch_size` x `patch_size` patches, project each linearly.

    Implemented as a convolution with kernel = stride = patch size, which is exactly "flatten each
    patch and multiply by one shared matrix". Patches come out in raster order (row by row).

    Args:
        patch_size: side of a square patch, in pixels.
        hidden_dim: size of each patch token.
        use_bias: the projection's bias (CLIP's has none).
        kernel_initializer, bias_initializer: of the projection.

    Input: `(batch, height, width, channels)`; height and width must be multiples of `patch_size`.
    Output: `(batch, (height // patch_size) * (width // patch_size), hidden_dim)`.

    Example:
    >>> tokens = PatchEmbedding(patch_size=4, hidden_dim=64)(np.zeros((2, 32, 32, 3)))  # (2, 64, 64)
    """

    def __init__(
        self,
        patch_size: int,
        hidden_dim: int,
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        check_arguments("PatchEmbedding", locals())
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.hidden_dim = hidden_dim
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.projection = keras.layers.Conv2D(
            hidden_dim,
            kernel_size=patch_size,
            strides=patch_size,
            padding="valid",
            use_bias=use_bias,
            kernel_initializer=own_initializer(self.kernel_initializer),
            bias_initializer=own_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name="projection",
        )

    def _check_image_shape(self, shape) -> None:
        if len(shape) != 4:
            raise InputError(
                f"PatchEmbedding expects `images` of shape (batch, height, width, channels); "
                f"received shape {tuple(shape)}."
            )
        for axis, size in (("height", shape[1]), ("width", shape[2])):
            if isinstance(size, int) and size % self.patch_size != 0:  # None or symbolic: unknown here
                raise InputError(
                    f"image {axis} must be a multiple of patch_size="
                    f"{self.patch_size}; received image shape {tuple(shape)}.",
                    caller="PatchEmbedding",
                )

    def build(self, images_shape):
        self._check_image_shape(images_shape)
        self.projection.build(images_shape)
        self.built = True

    def call(self, images):
        self._check_image_shape(images.shape)
        patches = self.projection(ops.cast(images, self.compute_dtype))  # (batch, rows, cols, hidden_dim); uint8 too
        rows, cols = ops.shape(patches)[1], ops.shape(patches)[2]  # tensors where traced as unknown
        return ops.reshape(patches, (-1, rows * cols, self.hidden_dim))

    def compute_output_shape(self, images_shape):
        self._check_image_shape(images_shape)
        h, w = images_shape[1], images_shape[2]
        n = None if h is None or w is None else (h // self.patch_size) * (w // self.patch_size)
        return (images_shape[0], n, self.hidden_dim)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            patch_size=self.patch_size,
            hidden_dim=self.hidden_dim,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        return config
