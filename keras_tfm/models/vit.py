"""ViT: an image classifier that reads an image as a sequence of patch tokens.

image -> P x P patches, each projected (PatchEmbedding) -> prepend a learned class token
      -> + positions (learned, or 2-D sinusoidal) -> num_layers x pre-norm EncoderBlock
      -> LayerNorm -> class token (or mean of patch tokens) -> linear head
"""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers import EncoderBlock, LearnedPositionEmbedding, PatchEmbedding, SinusoidalPositionEncoding2D
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.positions import bicubic_resize_matrix
from keras_tfm.models.base import ZooModel
from keras_tfm.models.image_tasks import ImageTasks
from keras_tfm.models.inputs import checked_class_names

POSITIONS = ("learned", "sinusoidal")


@keras.saving.register_keras_serializable(package="keras_tfm")
class ViT(ImageTasks, ZooModel):
    """Vision transformer (Dosovitskiy et al. 2021) classifier or feature extractor.

    Args:
        image_size: side of the (square) training images; sets the position table's grid.
        patch_size: side of a square patch; must divide `image_size`.
        num_classes: outputs of the head (logits).
        num_layers, num_heads, hidden_dim, intermediate_dim: the encoder.
        num_channels: channels of the input images.
        pooling: "token" classifies from the class token, "mean" from the mean patch token.
        include_top: False returns the normalized token sequence `(batch, 1 + patches, hidden_dim)`.
        positions: "learned" (a table, interpolated bicubically for other image sizes) or
            "sinusoidal" (fixed 2-D sinusoids for any grid).
        dropout, attention_dropout, layer_norm_epsilon, activation.
        remat: the blocks recompute their activations in training's backward pass (less memory).
        class_names: the classes' names (default LABEL_0, ...), which `classify` answers with and a saved
            checkpoint's `id2label` holds.

    Call arguments:
        images: `(batch, height, width, num_channels)`; height and width must be multiples of
            `patch_size` and may differ from `image_size`.
        return_attention_weights: also return a list with each layer's
            `(batch, num_heads, tokens, tokens)` attention weights.

    Example:
    >>> model = vit_tiny(num_classes=10, image_size=32, patch_size=4)
    >>> logits = model(np.zeros((2, 32, 32, 3), "float32"))                 # (2, 10)
    >>> images = np.random.rand(2, 32, 32, 3).astype("float32")
    >>> logits, weights = model(images, return_attention_weights=True)  # 12 x (2, 3, 65, 65)
    """

    lora_trainable_layer_names = ("head",)

    def __init__(
        self,
        image_size: int = 224,
        patch_size: int = 16,
        num_classes: int = 1000,
        num_layers: int = 12,
        num_heads: int = 12,
        hidden_dim: int = 768,
        intermediate_dim: int | None = None,
        num_channels: int = 3,
        pooling: str = "token",
        include_top: bool = True,
        positions: str = "learned",
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        layer_norm_epsilon: float = 1e-6,
        activation: str = "gelu",
        remat: bool = False,
        class_names: list[str] | None = None,
        **kwargs,
    ):
        check_arguments("ViT", locals(), optional=("intermediate_dim", "class_names"))
        kwargs.setdefault("name", "vit")
        self._check_heads("ViT", hidden_dim, num_heads)
        super().__init__(**kwargs)
        if image_size % patch_size:
            raise InputError(
                f"image_size must be a multiple of patch_size; received image_size={image_size}, "
                f"patch_size={patch_size}.",
                caller="ViT",
            )
        for name, value, allowed in (("pooling", pooling, ("token", "mean")), ("positions", positions, POSITIONS)):
            if value not in allowed:
                raise InputError(f"{name} must be {' or '.join(map(repr, allowed))}; received {value!r}.", caller="ViT")
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_classes = num_classes
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim or 4 * hidden_dim
        self.num_channels = num_channels
        self.pooling = pooling
        self.include_top = include_top
        self.positions = positions
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.activation = activation
        self.grid_size = image_size // patch_size
        self.class_names = checked_class_names(class_names, num_classes, "ViT") if include_top else None

        policy = self.dtype_policy
        self.patch_embedding = PatchEmbedding(patch_size, hidden_dim, dtype=policy, name="patch_embedding")
        if positions == "learned":
            self.position_embedding = LearnedPositionEmbedding(
                self.grid_size**2 + 1,
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                dtype=policy,
                name="position_embedding",
            )
        else:
            self.position_embedding = SinusoidalPositionEncoding2D(dtype=policy, name="position_embedding")
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=policy, name="embedding_dropout")
        self.blocks = [
            EncoderBlock(
                num_heads,
                self.intermediate_dim,
                dropout=dropout,
                attention_dropout=attention_dropout,
                activation=activation,
                norm_first=True,
                layer_norm_epsilon=layer_norm_epsilon,
                remat=remat,
                dtype=policy,
                name=f"block_{i}",
            )
            for i in range(num_layers)
        ]
        self.final_norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy, name="final_norm")
        self.head = keras.layers.Dense(num_classes, dtype=policy, name="head") if include_top else None
        self._compile_defaults()

    def default_loss(self) -> keras.losses.Loss | None:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True) if self.include_top else None

    def _export_signature(self) -> list:
        return [keras.InputSpec(shape=(None, self.image_size, self.image_size, 3), dtype="float32", name="images")]

    def _label_range(self) -> tuple[int, str] | None:
        return (self.num_classes, "num_classes") if self.include_top else None

    def build(self, images_shape=None):
        self.class_token = self.add_weight(
            name="class_token",
            shape=(1, 1, self.hidden_dim),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        )
        # a symbolic call builds every sub-layer and computes nothing
        self.call(keras.KerasTensor((1, self.image_size, self.image_size, self.num_channels)))
        self.built = True

    def _check_images(self, images) -> None:
        shape = tuple(images.shape)
        if len(shape) != 4 or (shape[-1] is not None and shape[-1] != self.num_channels):
            raise InputError(
                f"ViT expects `images` of shape (batch, height, width, {self.num_channels}); received shape {shape}."
            )

    def _positions(self, tokens, rows: int, cols: int):
        if self.positions == "sinusoidal":
            patch_positions = self.position_embedding(tokens[:, 1:], grid_shape=(rows, cols))
            return ops.concatenate([ops.zeros_like(tokens[:, :1]), patch_positions], axis=1)
        if isinstance(rows, int) and isinstance(cols, int) and rows == cols == self.grid_size:
            return self.position_embedding(tokens)  # else interpolate (the identity at the same size)
        return ops.broadcast_to(self.position_table(rows, cols, self.compute_dtype)[None], ops.shape(tokens))

    def position_table(self, rows: int, cols: int, dtype: str = "float32"):
        """The learned positions for a grid of `rows` x `cols` patches, `(1 + rows * cols, hidden_dim)`
        with the class token's first: the table resized bicubically, as for images of that size
        (`save_huggingface` writes it for a model fine-tuned at another size)."""
        if self.positions != "learned":
            raise InputError(
                f"the model has {self.positions} positions, not a learned table.", caller="ViT.position_table"
            )
        table = ops.cast(self.position_embedding.embeddings, dtype)
        grid = ops.reshape(table[1:], (self.grid_size, self.grid_size, self.hidden_dim))
        row_matrix = ops.cast(bicubic_resize_matrix(self.grid_size, rows), dtype)
        col_matrix = ops.cast(bicubic_resize_matrix(self.grid_size, cols), dtype)
        grid = ops.einsum("rR,cC,RCd->rcd", row_matrix, col_matrix, grid)
        return ops.concatenate([table[:1], ops.reshape(grid, (rows * cols, self.hidden_dim))], axis=0)

    def call(self, images, return_attention_weights: bool = False, training=None):
        # the head reads the class token only: the last block computes its output there alone
        class_token_only = self.include_top and self.pooling == "token" and not return_attention_weights
        x, attention_weights = self._encoded(images, return_attention_weights, class_token_only, training)
        if self.include_top:
            pooled = x[:, 0] if self.pooling == "token" else ops.mean(x[:, 1:], axis=1)
            x = self.head(pooled)
        return (x, attention_weights) if return_attention_weights else x

    def features(self, images, training=None):
        """The normalized token sequence `(batch, 1 + patches, hidden_dim)`, the class token first, whatever
        `include_top` says: what a head, a probe or `embed_images` reads."""
        return self._encoded(images, False, False, training)[0]

    def _encoded(self, images, return_attention_weights: bool, class_token_only: bool, training=None):
        self._check_images(images)
        # ints, or tensors where a traced function leaves the image size unknown (TensorFlow's
        # `predict` retraces so once it has seen a second size)
        rows, cols = ops.shape(images)[1] // self.patch_size, ops.shape(images)[2] // self.patch_size
        patches = self.patch_embedding(images)
        class_token = ops.broadcast_to(
            ops.cast(self.class_token, patches.dtype), (ops.shape(patches)[0], 1, self.hidden_dim)
        )
        x = ops.concatenate([class_token, patches], axis=1)
        x = self.embedding_dropout(x + self._positions(x, rows, cols), training=training)
        attention_weights = []
        for index, block in enumerate(self.blocks):
            if return_attention_weights:
                x, weights = block(x, return_attention_weights=True, training=training)
                attention_weights.append(weights)
            elif index == self.num_layers - 1 and class_token_only:
                # every token is still a key and value: same class token, most of the block's work skipped
                x = block(x, output_positions=ops.zeros((ops.shape(x)[0], 1), "int32"), training=training)
            else:
                x = block(x, training=training)
        return self.final_norm(x), attention_weights


def _vit(defaults: dict, overrides: dict) -> ViT:
    return ViT(**{**defaults, **overrides})


def vit_tiny(**overrides) -> ViT:
    """ViT-Ti/16 (DeiT-Tiny): 12 layers, 3 heads, 192 wide, MLP 768."""
    return _vit(dict(num_layers=12, num_heads=3, hidden_dim=192, intermediate_dim=768), overrides)


def vit_small(**overrides) -> ViT:
    """ViT-S/16 (DeiT-Small): 12 layers, 6 heads, 384 wide, MLP 1536."""
    return _vit(dict(num_layers=12, num_heads=6, hidden_dim=384, intermediate_dim=1536), overrides)


def vit_base(**overrides) -> ViT:
    """ViT-B/16: 12 layers, 12 heads, 768 wide, MLP 3072."""
    return _vit(dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072), overrides)


def vit_large(**overrides) -> ViT:
    """ViT-L/16: 24 layers, 16 heads, 1024 wide, MLP 4096."""
    return _vit(dict(num_layers=24, num_heads=16, hidden_dim=1024, intermediate_dim=4096), overrides)


def vit_huge(**overrides) -> ViT:
    """ViT-H/14: 32 layers, 16 heads, 1280 wide, MLP 5120, patch 14."""
    return _vit(dict(num_layers=32, num_heads=16, hidden_dim=1280, intermediate_dim=5120, patch_size=14), overrides)


def vit_small_images(**overrides) -> ViT:
    """A ViT for small images (CIFAR, Fashion-MNIST) trained from scratch on one machine: 32x32,
    patch 4, 6 layers, 3 heads, 192 wide, MLP 768, 10 classes."""
    return _vit(
        dict(
            image_size=32, patch_size=4, num_classes=10, num_layers=6, num_heads=3, hidden_dim=192, intermediate_dim=768
        ),
        overrides,
    )
