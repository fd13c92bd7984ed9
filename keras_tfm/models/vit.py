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
from keras_tfm.layers.attention_pooling import AttentionPooling
from keras_tfm.layers.positions import bicubic_resize_matrix, bilinear_resize_matrix
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
        pooling: "token" classifies from the class token, "mean" from the mean patch token,
            "token_and_mean" from both side by side (DINOv2's), "distilled" averages a head on the class token
            and one on the distillation token (DeiT's, with `distillation_token`), "attention" pools every token
            with a learned query (SigLIP's MAP head, `AttentionPooling`; also without `include_top`).
        include_top: False returns the normalized token sequence `(batch, 1 + patches, hidden_dim)`.
        positions: "learned" (a table, interpolated bicubically for other image sizes) or
            "sinusoidal" (fixed 2-D sinusoids for any grid).
        dropout, attention_dropout, layer_norm_epsilon, activation.
        remat: the blocks recompute their activations in training's backward pass (less memory).
        class_names: the classes' names (default LABEL_0, ...), which `classify` answers with and a saved
            checkpoint's `id2label` holds.
        distillation_token: a second learned token after the class token, with its own position (DeiT).
        num_register_tokens: learned tokens after the class token without positions (DINOv2 with registers).
        mask_token: a learned token that replaces the patches `masked_patches` marks (DINOv2).
        layer_scale_init, drop_path_rate: each block's layer scale and stochastic depth (the rate rises
            linearly from 0 at the first block to `drop_path_rate` at the last, as timm's).
        gated_feed_forward: a SwiGLU MLP (DINOv2 giant) instead of a GELU one.
        position_antialias: the position table resized with antialiasing for other image sizes (DINOv2 with
            registers), as PyTorch's `interpolate(..., antialias=True)`.
        patch_bias: the patch projection's bias (CLIP's has none).
        norm_before_blocks: a LayerNorm on the embeddings before the blocks (CLIP's `pre_layrnorm`).
        use_class_token: False has no class token (SigLIP's), the patches alone; pooling "mean" or "attention".
        position_interpolation: how the learned table is resized for other image sizes: "bicubic", or
            "bilinear" (antialiased, as SigLIP 2 resizes it for each image).
        activation: "gelu", or CLIP's "quick_gelu", or any Keras activation.

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
        distillation_token: bool = False,
        num_register_tokens: int = 0,
        mask_token: bool = False,
        layer_scale_init: float | None = None,
        drop_path_rate: float = 0.0,
        gated_feed_forward: bool = False,
        position_antialias: bool = False,
        patch_bias: bool = True,
        norm_before_blocks: bool = False,
        use_class_token: bool = True,
        position_interpolation: str = "bicubic",
        **kwargs,
    ):
        check_arguments("ViT", locals(), optional=("intermediate_dim", "class_names", "layer_scale_init"))
        kwargs.setdefault("name", "vit")
        self._check_heads("ViT", hidden_dim, num_heads)
        super().__init__(**kwargs)
        _check_layout(image_size, patch_size, pooling, positions, distillation_token, use_class_token,
                      num_register_tokens, position_interpolation)  # fmt: skip
        self.image_size, self.patch_size, self.num_classes = image_size, patch_size, num_classes
        self.num_layers, self.num_heads, self.hidden_dim = num_layers, num_heads, hidden_dim
        self.intermediate_dim, self.num_channels = intermediate_dim or 4 * hidden_dim, num_channels
        self.pooling, self.include_top, self.positions = pooling, include_top, positions
        self.dropout, self.attention_dropout = dropout, attention_dropout
        self.layer_norm_epsilon, self.activation = layer_norm_epsilon, activation
        self.distillation_token, self.num_register_tokens = distillation_token, num_register_tokens
        self.mask_token, self.layer_scale_init, self.drop_path_rate = mask_token, layer_scale_init, drop_path_rate
        self.gated_feed_forward, self.position_antialias = gated_feed_forward, position_antialias
        self.patch_bias, self.norm_before_blocks = patch_bias, norm_before_blocks
        self.use_class_token, self.position_interpolation = use_class_token, position_interpolation
        self.grid_size = image_size // patch_size
        self.class_names = checked_class_names(class_names, num_classes, "ViT") if include_top else None
        self._make_layers(remat)
        self._compile_defaults()

    def _make_layers(self, remat: bool) -> None:
        """The patch embedding, positions, blocks, final norm and heads of the arguments."""
        policy = self.dtype_policy
        self.patch_embedding = PatchEmbedding(self.patch_size, self.hidden_dim, use_bias=self.patch_bias, dtype=policy,
                                              name="patch_embedding")  # fmt: skip
        if self.positions == "learned":
            self.position_embedding = LearnedPositionEmbedding(
                self.grid_size**2 + self.num_prefix_positions,
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                dtype=policy,
                name="position_embedding",
            )
        else:
            self.position_embedding = SinusoidalPositionEncoding2D(dtype=policy, name="position_embedding")
        self.embedding_dropout = keras.layers.Dropout(self.dropout, dtype=policy, name="embedding_dropout")
        epsilon = self.layer_norm_epsilon
        self.pre_norm = (
            keras.layers.LayerNormalization(epsilon=epsilon, dtype=policy, name="pre_norm")
            if self.norm_before_blocks
            else None
        )
        self.blocks = [
            EncoderBlock(
                self.num_heads,
                self.intermediate_dim,
                dropout=self.dropout,
                attention_dropout=self.attention_dropout,
                activation="silu" if self.gated_feed_forward else self.activation,
                norm_first=True,
                layer_norm_epsilon=self.layer_norm_epsilon,
                remat=remat,
                gated_feed_forward=self.gated_feed_forward,
                feed_forward_use_bias=True,
                layer_scale_init=self.layer_scale_init,
                drop_path_rate=self.drop_path_rate * i / max(self.num_layers - 1, 1),  # deeper: more (timm's)
                dtype=policy,
                name=f"block_{i}",
            )
            for i in range(self.num_layers)
        ]
        self.final_norm = keras.layers.LayerNormalization(epsilon=epsilon, dtype=policy, name="final_norm")
        self.head = keras.layers.Dense(self.num_classes, dtype=policy, name="head") if self.include_top else None
        self.attention_pool = (
            AttentionPooling(self.num_heads, self.intermediate_dim, self.activation, epsilon, dtype=policy,
                             name="attention_pool") if self.pooling == "attention" else None
        )  # fmt: skip
        distilled = self.include_top and self.pooling == "distilled"
        self.distillation_head = (
            keras.layers.Dense(self.num_classes, dtype=policy, name="distillation_head") if distilled else None
        )

    def default_loss(self) -> keras.losses.Loss | None:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True) if self.include_top else None

    def _export_signature(self) -> list:
        return [keras.InputSpec(shape=(None, self.image_size, self.image_size, 3), dtype="float32", name="images")]

    def _label_range(self) -> tuple[int, str] | None:
        return (self.num_classes, "num_classes") if self.include_top else None

    def build(self, images_shape=None):
        tokens = keras.initializers.TruncatedNormal(stddev=0.02)
        if self.use_class_token:
            self.class_token = self.add_weight(name="class_token", shape=(1, 1, self.hidden_dim), initializer=tokens)
        if self.distillation_token:
            self.distillation_weight = self.add_weight(name="distillation_token", shape=(1, 1, self.hidden_dim),
                                                       initializer=tokens)  # fmt: skip
        if self.num_register_tokens:
            self.register_weight = self.add_weight(name="register_tokens", shape=(1, self.num_register_tokens,
                                                   self.hidden_dim), initializer=tokens)  # fmt: skip
        if self.mask_token:
            self.mask_weight = self.add_weight(name="mask_token", shape=(1, self.hidden_dim), initializer="zeros")
        # a symbolic call builds every sub-layer and computes nothing
        self.call(keras.KerasTensor((1, self.image_size, self.image_size, self.num_channels)))
        if self.attention_pool is not None and not self.attention_pool.built:  # without a head: not called
            self.attention_pool.build((None, None, self.hidden_dim))
        self.built = True

    def _check_images(self, images) -> None:
        shape = tuple(images.shape)
        if len(shape) != 4 or (shape[-1] is not None and shape[-1] != self.num_channels):
            raise InputError(
                f"ViT expects `images` of shape (batch, height, width, {self.num_channels}); received shape {shape}."
            )

    @property
    def num_prefix_positions(self) -> int:
        """The tokens before the patches that have a position: the class token, and DeiT's distillation token."""
        return int(self.use_class_token) + self.distillation_token

    @property
    def num_extra_tokens(self) -> int:
        """The tokens between the class token and the patches: the distillation token, the registers."""
        return int(self.distillation_token) + self.num_register_tokens

    @property
    def num_leading_tokens(self) -> int:
        """The tokens before the patches: the class token where the model has one, and the extra tokens."""
        return int(self.use_class_token) + self.num_extra_tokens

    def _positions(self, tokens, rows: int, cols: int):
        if self.positions == "sinusoidal":
            prefix = self.num_prefix_positions
            patch_positions = self.position_embedding(tokens[:, prefix:], grid_shape=(rows, cols))
            return ops.concatenate([ops.zeros_like(tokens[:, :prefix]), patch_positions], axis=1)
        if isinstance(rows, int) and isinstance(cols, int) and rows == cols == self.grid_size:
            return self.position_embedding(tokens)  # else interpolate (the identity at the same size)
        return ops.broadcast_to(self.position_table(rows, cols, self.compute_dtype)[None], ops.shape(tokens))

    def position_table(self, rows: int, cols: int, dtype: str = "float32"):
        """The learned positions for a grid of `rows` x `cols` patches, `(prefix + rows * cols, hidden_dim)`
        with the class (and distillation) token's first: the table resized as `position_interpolation` says
        (bicubic antialiased with `position_antialias`), as for images of that size (`save_huggingface` writes it for a model
        fine-tuned at another size)."""
        if self.positions != "learned":
            raise InputError(
                f"the model has {self.positions} positions, not a learned table.", caller="ViT.position_table"
            )
        prefix = self.num_prefix_positions
        table = ops.cast(self.position_embedding.embeddings, dtype)
        grid = ops.reshape(table[prefix:], (self.grid_size, self.grid_size, self.hidden_dim))
        matrices = [
            bilinear_resize_matrix(self.grid_size, size)
            if self.position_interpolation == "bilinear"
            else bicubic_resize_matrix(self.grid_size, size, self.position_antialias)
            for size in (rows, cols)
        ]
        row_matrix, col_matrix = (ops.cast(matrix, dtype) for matrix in matrices)
        grid = ops.einsum("rR,cC,RCd->rcd", row_matrix, col_matrix, grid)
        return ops.concatenate([table[:prefix], ops.reshape(grid, (rows * cols, self.hidden_dim))], axis=0)

    def call(self, images, return_attention_weights: bool = False, masked_patches=None, training=None):
        # the head reads the class (and distillation) token only: the last block computes its output there alone
        heads_only = self.include_top and self.pooling in ("token", "distilled") and not return_attention_weights
        x, attention_weights = self._encoded(images, return_attention_weights, heads_only, masked_patches, training)
        if self.include_top and self.pooling == "distilled":  # DeiT's two heads, averaged at inference
            x = (self.head(x[:, 0]) + self.distillation_head(x[:, 1])) / 2
        elif self.include_top:
            x = self.head(self._pooled(x))
        return (x, attention_weights) if return_attention_weights else x

    def _pooled(self, x):
        if self.pooling == "attention":
            return self.attention_pool(x)
        patches = x[:, self.num_leading_tokens :]
        if self.pooling == "mean":
            return ops.mean(patches, axis=1)
        if self.pooling == "token_and_mean":  # DINOv2's classifier
            return ops.concatenate([x[:, 0], ops.mean(patches, axis=1)], axis=-1)
        return x[:, 0]

    def pooled_features(self, images, training=None):
        """`(batch, width)`: the one vector per image that the head reads, pooled as `pooling` says (the class
        token for "distilled"); SigLIP's and CLIP's image vector before their projection."""
        return self._pooled(self.features(images, training=training))

    def features(self, images, masked_patches=None, kept_patches=None, training=None):
        """The normalized token sequence `(batch, 1 + extra + patches, hidden_dim)`: the class token, the
        distillation token and registers where the model has them, then the patches; whatever
        `include_top` says. What a head, a probe or `embed_images` reads. `masked_patches` `(batch,
        patches)` bool: patches replaced by the mask token (a model with `mask_token`). `kept_patches`
        `(batch, kept)` int: the blocks see only these patches (raster indices), each with its position, in
        that order (a masked autoencoder's encoder, `ViTMAE`)."""
        self._build_on_demand()
        return self._encoded(images, False, False, masked_patches, training, kept_patches)[0]

    def hidden_states(self, images, layers=None, training=None) -> dict:
        """The token sequences between the blocks, as transformers' `output_hidden_states` numbers them: 0 the
        blocks' input (the embeddings), `i` block `i`'s output (1-based, before the final norm), for each of
        `layers` (default: every one): what a neck or a probe of an inner layer reads."""
        self._build_on_demand()
        wanted = range(self.num_layers + 1) if layers is None else layers
        if not all(isinstance(i, int) and 0 <= i <= self.num_layers for i in wanted):
            raise InputError(f"expected layer numbers in [0, {self.num_layers}]; received {layers!r}.", "layers",
                             "ViT.hidden_states")  # fmt: skip
        self._check_images(images)
        rows, cols = ops.shape(images)[1] // self.patch_size, ops.shape(images)[2] // self.patch_size
        x = self._embedded(self.patch_embedding(images), None, rows, cols, training)
        states = {0: x}
        for index, block in enumerate(self.blocks[: max(wanted, default=0)], 1):
            x = states[index] = block(x, training=training)
        return {i: states[i] for i in wanted}

    def _encoded(self, images, return_attention_weights: bool, heads_only: bool, masked_patches, training=None,
                 kept_patches=None):  # fmt: skip
        self._check_images(images)
        # ints, or tensors where a traced function leaves the image size unknown (TensorFlow's
        # `predict` retraces so once it has seen a second size)
        rows, cols = ops.shape(images)[1] // self.patch_size, ops.shape(images)[2] // self.patch_size
        x = self._embedded(self.patch_embedding(images), masked_patches, rows, cols, training, kept_patches)
        attention_weights = []
        for index, block in enumerate(self.blocks):
            if return_attention_weights:
                x, weights = block(x, return_attention_weights=True, training=training)
                attention_weights.append(weights)
            elif index == self.num_layers - 1 and heads_only:
                # every token is still a key and value: the same head tokens, most of the block's work skipped
                heads = ops.broadcast_to(ops.arange(self.num_prefix_positions, dtype="int32")[None],
                                         (ops.shape(x)[0], self.num_prefix_positions))  # fmt: skip
                x = block(x, output_positions=heads, training=training)
            else:
                x = block(x, training=training)
        return self.final_norm(x), attention_weights

    def _embedded(self, patches, masked_patches, rows, cols, training, kept_patches=None):
        """The block's input: class (and distillation) token and the patches with their positions, then the
        registers after the class token (they have none)."""
        batch = ops.shape(patches)[0]
        if masked_patches is not None:
            if not self.mask_token:
                raise InputError("the model has no mask token (mask_token=False).", "masked_patches", "ViT")
            masked = ops.expand_dims(ops.cast(masked_patches, "bool"), -1)
            patches = ops.where(masked, ops.cast(self.mask_weight, patches.dtype)[None], patches)
        prefix = [self.class_token] if self.use_class_token else []
        prefix += [self.distillation_weight] if self.distillation_token else []
        prefix = [ops.broadcast_to(ops.cast(token, patches.dtype), (batch, 1, self.hidden_dim)) for token in prefix]
        x = ops.concatenate([*prefix, patches], axis=1)
        x = x + self._positions(x, rows, cols)
        if kept_patches is not None:  # positions first: each kept patch keeps its own
            prefix = self.num_prefix_positions
            indices = ops.expand_dims(ops.cast(kept_patches, "int32"), -1)
            x = ops.concatenate([x[:, :prefix], ops.take_along_axis(x[:, prefix:], indices, axis=1)], axis=1)
        if self.num_register_tokens:
            registers = ops.broadcast_to(ops.cast(self.register_weight, x.dtype), (batch, self.num_register_tokens,
                                         self.hidden_dim))  # fmt: skip
            x = ops.concatenate([x[:, :1], registers, x[:, 1:]], axis=1)
        x = x if self.pre_norm is None else self.pre_norm(x)
        return self.embedding_dropout(x, training=training)


def _check_layout(image_size: int, patch_size: int, pooling: str, positions: str, distillation_token: bool,
                  use_class_token: bool, num_register_tokens: int, position_interpolation: str) -> None:  # fmt: skip
    """Refuses an image size its patches do not divide, and a pooling, positions or tokens the model has not."""
    if image_size % patch_size:
        raise InputError(
            f"image_size must be a multiple of patch_size; received image_size={image_size}, patch_size={patch_size}.",
            caller="ViT",
        )
    poolings = ("mean", "attention") + (("token", "token_and_mean") if use_class_token else ())
    poolings += ("distilled",) if distillation_token else ()
    checks = (("pooling", pooling, poolings), ("positions", positions, POSITIONS),
              ("position_interpolation", position_interpolation, ("bicubic", "bilinear")))  # fmt: skip
    for name, value, allowed in checks:
        if value not in allowed:
            raise InputError(f"{name} must be {' or '.join(map(repr, allowed))}; received {value!r}"
                             f"{'' if use_class_token else ' (use_class_token=False)'}.", caller="ViT")  # fmt: skip
    if not use_class_token and (distillation_token or num_register_tokens):
        raise InputError("a distillation token or registers follow the class token; received use_class_token=False "
                         f"with distillation_token={distillation_token}, num_register_tokens={num_register_tokens}.",
                         "use_class_token", caller="ViT")  # fmt: skip


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


# DINOv2's published configuration: 518-pixel images in 14-pixel patches, layer scale, a mask token; features
DINOV2 = dict(image_size=518, patch_size=14, layer_scale_init=1.0, mask_token=True, layer_norm_epsilon=1e-6,
              include_top=False)  # fmt: skip


def dinov2_small(**overrides) -> ViT:
    """DINOv2 ViT-S/14 (`Dinov2Model`): 12 layers, 6 heads, 384 wide. With registers: `num_register_tokens=4,
    position_antialias=True`."""
    return _vit(DINOV2 | dict(num_layers=12, num_heads=6, hidden_dim=384, intermediate_dim=1536), overrides)


def dinov2_base(**overrides) -> ViT:
    """DINOv2 ViT-B/14: 12 layers, 12 heads, 768 wide."""
    return _vit(DINOV2 | dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072), overrides)


def dinov2_large(**overrides) -> ViT:
    """DINOv2 ViT-L/14: 24 layers, 16 heads, 1024 wide."""
    return _vit(DINOV2 | dict(num_layers=24, num_heads=16, hidden_dim=1024, intermediate_dim=4096), overrides)


def dinov2_giant(**overrides) -> ViT:
    """DINOv2 ViT-g/14: 40 layers, 24 heads, 1536 wide, a SwiGLU MLP 4096 wide."""
    giant = dict(num_layers=40, num_heads=24, hidden_dim=1536, intermediate_dim=4096, gated_feed_forward=True)
    return _vit(DINOV2 | giant, overrides)


# DeiT's distilled classifiers: a distillation token, the two heads averaged, ImageNet's 1000 classes
DEIT = dict(distillation_token=True, pooling="distilled", layer_norm_epsilon=1e-12)


def deit_tiny_distilled(**overrides) -> ViT:
    """DeiT-Ti distilled (`DeiTForImageClassificationWithTeacher`): ViT-Ti/16 with a distillation token."""
    return _vit(DEIT | dict(num_layers=12, num_heads=3, hidden_dim=192, intermediate_dim=768), overrides)


def deit_small_distilled(**overrides) -> ViT:
    """DeiT-S distilled: ViT-S/16 with a distillation token."""
    return _vit(DEIT | dict(num_layers=12, num_heads=6, hidden_dim=384, intermediate_dim=1536), overrides)


def deit_base_distilled(**overrides) -> ViT:
    """DeiT-B distilled: ViT-B/16 with a distillation token."""
    return _vit(DEIT | dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072), overrides)
