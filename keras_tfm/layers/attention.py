"""Multi-head attention: each output is a weighted average of value vectors, with weights
softmax(Q K^T / sqrt(key_dim)) over the keys; `num_heads` attentions run in parallel and their
results are merged by one output projection (W_o)."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_tfm.compat import get_keras_mask, on_xla_cpu
from keras_tfm.errors import InputError
from keras_tfm.layers import kv_cache, shared_positions
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.attention_inputs import check_inputs, check_per_row, shown, static_dims_differ
from keras_tfm.layers.attention_masks import position_mask
from keras_tfm.layers.feed_forward import projection
from keras_tfm.layers.quantization import QuantizationConfigMixin
from keras_tfm.layers.rotary import RotaryEmbedding

# Masked logits, and scores of what must never be chosen in decoding; softmax is taken in float32,
# where exp(-1e9) == 0 exactly.
LARGE_NEGATIVE = -1e9


@keras.saving.register_keras_serializable(package="keras_tfm")
class MultiHeadAttention(QuantizationConfigMixin, keras.layers.Layer):
    """Masked multi-head attention for self- and cross-attention, with an optional key/value cache.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each head's queries and keys.
        value_dim: size of each head's values; defaults to `key_dim`.
        dropout: dropout rate on the attention weights (training only).
        use_bias: whether the query, key and value projections have biases (and the output
            projection, unless `output_use_bias` says otherwise).
        output_dim: size of the output; defaults to the last dimension of `query`.
        kernel_initializer, bias_initializer: of the four projections.
        num_key_value_heads: grouped-query attention: keys and values have this many heads, each
            shared by `num_heads // num_key_value_heads` query heads (1: multi-query attention). The
            cache stores only these heads. Defaults to `num_heads`.
        output_use_bias: whether the output projection has a bias; defaults to `use_bias` (Qwen2:
            biases on queries, keys and values only).
        rotary_embedding: None, or the arguments of a `RotaryEmbedding` (a dict, e.g.
            `{"max_wavelength": 500000.0}`) that rotates queries and keys by their positions.
        sliding_window: None, or with a causal mask: query `i` sees only the keys at positions
            `i - sliding_window + 1 ... i` (Mistral; Qwen where enabled).
        query_key_norm_epsilon: None, or an RMS normalisation (with this epsilon and a learned
            scale) of each head's queries and keys before the rotation (Qwen3's QK-norm).

    Call arguments:
        query: `(batch, query_length, query_dim)`.
        value: `(batch, key_length, value_dim_in)`; defaults to `query` (self-attention).
        key: `(batch, key_length, key_dim_in)`; defaults to `value`.
        query_mask: `(batch, query_length)` Keras mask of `query`. It does not change the result;
            it is passed on as the mask of the output.
        value_mask: `(batch, key_length)` padding mask, True at real keys. Defaults to the Keras
            mask of `value` (for self-attention, of `query`).
        attention_mask: boolean `(batch, query_length, key_length)` or
            `(batch, num_heads | 1, query_length, key_length)`, True where a query may attend.
        use_causal_mask: forbid attending to later positions. With a cache, query `i` sits at
            position `cache_update_index + i`.
        cache: `(batch, 2, num_key_value_heads, cache_length, key_dim)` keys and values of earlier steps
            (heads before positions, as Hugging Face's caches).
            With `cache_update_index`, this call's keys and values are written at that index and
            the attention runs over the whole cache (self-attention decoding). Without it, the cache
            is used as precomputed keys and values (cross-attention decoding; see
            `precompute_key_value`).
        cache_update_index: int or scalar tensor, where to write into `cache`; or, for one new
            position per row, a `(batch,)` int tensor: each row's own position (rows that decode at
            different positions, as a server's). (`update_cache` writes the cache without attending.)
        return_attention_weights: also return the `(batch, num_heads, query_length, key_length)`
            attention weights.

    All masks are combined with a logical AND and applied by setting logits to a large negative
    number before the softmax, so masked weights are exactly 0. A query row with no visible key
    gets uniform weights (never NaN).

    Returns:
        `output` of shape `(batch, query_length, output_dim)`, followed, in this order, by the
        attention weights if `return_attention_weights`, and the updated cache if `cache` was given.

    Example:
    >>> attention = MultiHeadAttention(num_heads=4, key_dim=16)
    >>> x = np.random.rand(2, 10, 64).astype("float32")
    >>> y = attention(x, use_causal_mask=True)                                 # (2, 10, 64)
    >>> y, weights = attention(x, return_attention_weights=True)              # (2, 4, 10, 10)
    >>> llama = MultiHeadAttention(num_heads=8, key_dim=8, num_key_value_heads=2,
    ...                            rotary_embedding={"max_wavelength": 500000.0}, use_bias=False)
    >>> y = llama(x, use_causal_mask=True)                                     # (2, 10, 64)
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        output_dim: int | None = None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        num_key_value_heads: int | None = None,
        output_use_bias: bool | None = None,
        rotary_embedding: dict | None = None,
        sliding_window: int | None = None,
        query_key_norm_epsilon: float | None = None,
        **kwargs,
    ):
        check_arguments(
            "MultiHeadAttention",
            locals(),
            optional=(
                "value_dim",
                "output_dim",
                "num_key_value_heads",
                "output_use_bias",
                "rotary_embedding",
                "sliding_window",
                "query_key_norm_epsilon",
            ),
        )
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise InputError(
                f"num_heads must be a multiple of num_key_value_heads; received num_heads="
                f"{num_heads}, num_key_value_heads={num_key_value_heads}.",
                "num_key_value_heads",
                caller="MultiHeadAttention",
            )
        super().__init__(**kwargs)
        self.num_key_value_heads = num_key_value_heads or num_heads
        self.output_use_bias = use_bias if output_use_bias is None else output_use_bias
        self.rotary_embedding = None if rotary_embedding is None else dict(rotary_embedding)
        self.sliding_window = sliding_window
        self.query_key_norm_epsilon = query_key_norm_epsilon
        self.rotary = (
            None
            if rotary_embedding is None
            else RotaryEmbedding(**self.rotary_embedding, dtype=self.dtype_policy, name="rotary_embedding")
        )
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim or key_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.output_dim = output_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True
        self.weights_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        kv_heads = self.num_key_value_heads
        self.query_dense = projection(self, self.num_heads * self.key_dim, "query")
        self.key_dense = projection(self, kv_heads * self.key_dim, "key")
        self.value_dense = projection(self, kv_heads * self.value_dim, "value")
        self.output_dense = projection(self, self.output_dim or query_shape[-1], "output", self.output_use_bias)
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(tuple(query_shape[:-1]) + (self.num_heads * self.value_dim,))
        if self.rotary is not None:  # no weights; built, it is a finished layer to Keras (quantize, saving)
            self.rotary.build((None, None, self.num_heads, self.key_dim))
        if self.query_key_norm_epsilon is not None:
            self.query_norm = keras.layers.RMSNormalization(
                epsilon=self.query_key_norm_epsilon, dtype=self.dtype_policy, name="query_norm"
            )
            self.key_norm = keras.layers.RMSNormalization(
                epsilon=self.query_key_norm_epsilon, dtype=self.dtype_policy, name="key_norm"
            )
            self.query_norm.build((None, None, self.num_heads, self.key_dim))
            self.key_norm.build((None, None, kv_heads, self.key_dim))
        self.built = True

    def _split_heads(self, x, head_dim: int, num_heads: int | None = None):
        # -1 for the batch keeps a known length known (TensorFlow loses it next to an unknown batch)
        return ops.reshape(x, (-1, ops.shape(x)[1], num_heads or self.num_heads, head_dim))

    def _angles(self, x, start_index, angles=None):
        """The rotation of positions `start_index, ...` for `x` `(batch, length, ...)`; None without
        rotary positions. `angles`: ones already computed for these positions."""
        if self.rotary is None or angles is not None:
            return angles
        length = ops.shape(x)[1]
        # not `get_config`: Keras' own part of it, called in a JAX trace, cost a server 0.45 GB (SmolLM2)
        return shared_positions.shared(
            ("angles", tuple(self.rotary.rotation().items()), self.key_dim, self.compute_dtype),
            (length, start_index),
            lambda: self.rotary.angles(length, self.key_dim, self.compute_dtype, start_index),
        )

    def _positioned(self, heads, norm, angles):
        """Queries or keys `(batch, length, heads, key_dim)` after the QK-norm and the rotation."""
        if self.query_key_norm_epsilon is not None:
            heads = norm(heads)
        if angles is not None:
            heads = self.rotary.rotate(heads, angles)
        return heads

    def _key_value_heads(self, value, key, start_index=0, angles=None):
        keys = self._split_heads(self.key_dense(key), self.key_dim, self.num_key_value_heads)
        keys = self._positioned(keys, getattr(self, "key_norm", None), self._angles(key, start_index, angles))
        values = self._split_heads(self.value_dense(value), self.value_dim, self.num_key_value_heads)
        return keys, values

    def precompute_key_value(self, value, key=None, start_index=0, angles=None):
        """Keys and values of `value` (and `key`) as a cache for cross-attention decoding:
        `(batch, 2, num_key_value_heads, key_length, key_dim)`. Requires `value_dim == key_dim`.
        `start_index`: the position of the first key (for the rotation)."""
        self._check_cacheable()
        key = value if key is None else key
        keys, values = self._key_value_heads(value, key, start_index, angles)
        return ops.stack([kv_cache.to_cache_layout(keys), kv_cache.to_cache_layout(values)], axis=1)

    def update_cache(self, value, cache, cache_update_index, key=None, angles=None):
        """`cache` with the keys and values of `value` (and `key`) written at `cache_update_index`:
        the cache that `call(query, value, key, cache=cache, cache_update_index=...)` returns, without
        computing queries or attention. A prefill needs nothing else from the last decoder layer."""
        self._check_cacheable(cache)
        index = cache_update_index
        if isinstance(index, (int, np.integer)) and isinstance(cache.shape[3], int) and isinstance(value.shape[1], int):
            if not 0 <= index <= cache.shape[3] - value.shape[1]:  # a write there would be clamped, silently
                raise InputError(
                    f"`cache_update_index` must leave room for the {value.shape[1]} new "
                    f"positions in the cache of length {cache.shape[3]}: in [0, {cache.shape[3] - value.shape[1]}]; "
                    f"received {index}.",
                    caller="MultiHeadAttention",
                )
        check_per_row(index, value)
        new_entries = self.precompute_key_value(value, key, start_index=cache_update_index, angles=angles)
        # one update of the joint cache: a functional update copies its input (PyTorch)
        return kv_cache.write(cache, cache_update_index, ops.cast(new_entries, cache.dtype))

    def _check_cacheable(self, cache=None):
        if self.value_dim != self.key_dim:
            raise InputError(
                f"a key/value cache needs value_dim == key_dim; received "
                f"key_dim={self.key_dim}, value_dim={self.value_dim}.",
                caller="MultiHeadAttention",
            )
        if cache is not None and (
            len(cache.shape) != 5
            or static_dims_differ(cache.shape, (None, 2, self.num_key_value_heads, None, self.key_dim))
        ):
            raise InputError(
                f"`cache` must have shape (batch, 2, num_key_value_heads, cache_length, "
                f"key_dim) = (batch, 2, {self.num_key_value_heads}, cache_length, {self.key_dim}); received "
                f"shape {tuple(cache.shape)}.",
                caller="MultiHeadAttention",
            )

    def _combined_mask(
        self,
        batch,
        query_length,
        key_length,
        value_mask,
        attention_mask,
        use_causal_mask,
        cache_update_index,
        has_cache,
    ):
        """One boolean mask broadcastable to (batch, heads, query_length, key_length), or None.
        Sizes are ints, or scalar tensors where a traced function leaves them unknown."""
        masks = []
        if value_mask is not None:
            if len(value_mask.shape) != 2 or static_dims_differ(value_mask.shape, (batch, key_length)):
                raise InputError(
                    f"`value_mask` must have shape (batch, key_length) = "
                    f"{shown((batch, key_length))}; received shape {tuple(value_mask.shape)}.",
                    caller="MultiHeadAttention",
                )
            # expand_dims, not `[:, None, None, :]`: LiteRT has no strided slice that adds axes
            masks.append(ops.expand_dims(ops.cast(value_mask, "bool"), (1, 2)))
        if attention_mask is not None:
            rank = len(attention_mask.shape)
            expected = (batch, query_length, key_length) if rank == 3 else (batch, None, query_length, key_length)
            if (
                rank not in (3, 4)
                or static_dims_differ(attention_mask.shape, expected)
                or (rank == 4 and attention_mask.shape[1] not in (None, 1, self.num_heads))
            ):
                raise InputError(
                    f"`attention_mask` must have shape (batch, query_length, "
                    f"key_length) = {shown((batch, query_length, key_length))} or (batch, num_heads "
                    f"or 1, query_length, key_length); received shape {tuple(attention_mask.shape)}.",
                    caller="MultiHeadAttention",
                )
            attention_mask = ops.cast(attention_mask, "bool")
            masks.append(ops.expand_dims(attention_mask, 1) if rank == 3 else attention_mask)
        if use_causal_mask or has_cache:
            offset = 0 if cache_update_index is None else cache_update_index
            masks.append(
                shared_positions.shared(
                    ("position_mask", use_causal_mask, self.sliding_window),
                    (query_length, key_length, offset),
                    lambda: position_mask(query_length, key_length, offset, use_causal_mask, self.sliding_window),
                )
            )
        if not masks:
            return None
        mask = masks[0]
        for other in masks[1:]:
            mask = ops.logical_and(mask, other)
        return mask

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        attention_mask=None,
        use_causal_mask: bool = False,
        cache=None,
        cache_update_index=None,
        return_attention_weights: bool = False,
        training=None,
    ):
        if value is None:
            value = query
            value_mask = query_mask if value_mask is None else value_mask
        key = value if key is None else key
        check_inputs(query, value, key)
        if value_mask is None:
            value_mask = get_keras_mask(value)

        query_heads, key_heads, value_heads, cache = self._heads(query, value, key, cache, cache_update_index)
        # ints, or tensors where a traced function leaves them unknown (TensorFlow's `fit` and
        # `predict` retrace with unknown batch and length once shapes vary)
        batch, query_length = ops.shape(query)[0], ops.shape(query)[1]
        key_length = ops.shape(key_heads)[1]
        window_hides_keys = self.sliding_window is not None and not (
            isinstance(key_length, int) and key_length <= self.sliding_window
        )
        # TensorFlow has no fused kernel: its `is_causal` builds this same mask, with a slice LiteRT lacks
        self_attention_only_causal = (
            use_causal_mask
            and keras.backend.backend() != "tensorflow"
            and cache is None
            and value_mask is None
            and attention_mask is None
            and not window_hides_keys
        )
        mask = None
        if not self_attention_only_causal:
            mask = self._combined_mask(
                batch,
                query_length,
                key_length,
                value_mask,
                attention_mask,
                use_causal_mask,
                cache_update_index,
                cache is not None and cache_update_index is not None,
            )

        explicit = return_attention_weights or (training and self.dropout > 0)
        if self_attention_only_causal and self._unfused(query_heads, explicit):
            mask = self._combined_mask(batch, query_length, key_length, None, None, True, None, False)
        if cache is not None and not explicit and self._unfused(query_heads, explicit):
            attended, weights = self._attend_to_cache(query_heads, cache, mask), None
        else:
            attended, weights = self._attend(
                query_heads, key_heads, value_heads, mask, self_attention_only_causal, explicit, training
            )
        attended = ops.reshape(attended, (-1, ops.shape(attended)[1], self.num_heads * self.value_dim))
        output = self.output_dense(attended)

        extras = []
        if return_attention_weights:
            extras.append(weights)
        if cache is not None:
            extras.append(cache)
        return (output, *extras) if extras else output

    def _heads(self, query, value, key, cache, cache_update_index) -> tuple:
        """The query, key and value heads (the keys and values from the cache, written first when
        `cache_update_index` is given) and the cache (None without one)."""
        start_index = 0 if cache_update_index is None else cache_update_index
        check_per_row(start_index, query)
        angles = self._angles(query, start_index)
        query_heads = self._split_heads(self.query_dense(query), self.key_dim)
        query_heads = self._positioned(query_heads, getattr(self, "query_norm", None), angles)
        # self-attention's keys sit where its queries do: the same rotation
        key_angles = angles if key is query else None
        if cache is None:
            return query_heads, *self._key_value_heads(value, key, angles=key_angles), None
        self._check_cacheable(cache)
        if cache_update_index is not None:
            cache = self.update_cache(value, cache, cache_update_index, key, angles=key_angles)
        return query_heads, kv_cache.from_cache_layout(cache[:, 0]), kv_cache.from_cache_layout(cache[:, 1]), cache

    def _unfused(self, query_heads, explicit: bool) -> bool:
        """Whether the weights are computed here rather than by the fused op. The fused op needs equal
        key and value head sizes (JAX) and has no dropout on weights. On JAX with XLA:CPU only bfloat16
        takes it (cuDNN's flash attention on GPUs): its float16 form accumulates logits in float32,
        whose gradient XLA:CPU lacks, and in float32, where it has no kernel, its XLA form is slower
        than the einsums below (docs/layers.md)."""
        jax_unfused = keras.backend.backend() == "jax" and query_heads.dtype != "bfloat16" and on_xla_cpu()
        return explicit or self.value_dim != self.key_dim or jax_unfused

    def _attend(self, query_heads, key_heads, value_heads, mask, is_causal: bool, explicit: bool, training):
        """(the attended values `(batch, query_length, heads, value_dim)`, the weights or None)."""
        scale = 1.0 / float(self.key_dim) ** 0.5
        query_length, key_length = ops.shape(query_heads)[1], ops.shape(key_heads)[1]
        if not self._unfused(query_heads, explicit):
            groups = self.num_heads // self.num_key_value_heads
            key_heads, value_heads = ops.cast(key_heads, query_heads.dtype), ops.cast(value_heads, query_heads.dtype)
            if groups > 1 and not is_causal and (mask is None or mask.shape[1] == 1):
                return self._fused_in_groups(query_heads, key_heads, value_heads, mask, scale), None
            if groups > 1:  # the fused kernels want one key head per query head
                key_heads = ops.repeat(key_heads, groups, axis=2)
                value_heads = ops.repeat(value_heads, groups, axis=2)
            # Fused kernels (flash attention on GPU) where the backend has them.
            attended = ops.dot_product_attention(
                query_heads, key_heads, value_heads, mask=mask, scale=scale, is_causal=is_causal
            )
            return attended, None
        # query heads in groups that share a key/value head (one group each without GQA), so
        # that the keys and values are read as they are, not repeated
        groups = self.num_heads // self.num_key_value_heads
        grouped = ops.reshape(query_heads, (-1, query_length, self.num_key_value_heads, groups, self.key_dim))
        logits = ops.einsum("bqhgd,bkhd->bhgqk", grouped, key_heads)
        logits = ops.reshape(logits, (-1, self.num_heads, query_length, key_length))
        logits = ops.cast(logits, "float32") * scale
        if mask is not None:
            logits = ops.where(mask, logits, LARGE_NEGATIVE)
        weights = ops.cast(ops.softmax(logits, axis=-1), self.compute_dtype)
        dropped = self.weights_dropout(weights, training=training)
        dropped = ops.reshape(dropped, (-1, self.num_key_value_heads, groups, query_length, key_length))
        return ops.einsum("bhgqk,bkhd->bqhgd", dropped, ops.cast(value_heads, self.compute_dtype)), weights

    def _attend_to_cache(self, query_heads, cache, mask):
        """`_attend`'s einsums and softmax, reading the keys and values in the cache's layout `(batch, heads,
        length, dim)`: XLA:CPU then runs both products as plain batched matrix products, where over the
        `(batch, length, heads, dim)` view it multiplied by the values' transpose and transposed the logits
        (a decoding step of SmolLM2's shape, 16 rows x 512 positions: 185 ms, here 114 ms)."""
        groups, heads = self.num_heads // self.num_key_value_heads, self.num_key_value_heads
        query_length, key_length = ops.shape(query_heads)[1], ops.shape(cache)[3]
        keys, values = cache[:, 0], cache[:, 1]
        # (batch, heads, groups x queries, dim): the query heads that share a key/value head as its rows
        grouped = ops.reshape(query_heads, (-1, query_length, heads, groups, self.key_dim))
        grouped = ops.reshape(ops.transpose(grouped, (0, 2, 3, 1, 4)), (-1, heads, groups * query_length, self.key_dim))
        logits = ops.einsum("bhmd,bhkd->bhmk", ops.cast(grouped, keys.dtype), keys)
        scale = 1.0 / float(self.key_dim) ** 0.5
        logits = ops.reshape(ops.cast(logits, "float32") * scale, (-1, self.num_heads, query_length, key_length))
        if mask is not None:
            logits = ops.where(mask, logits, LARGE_NEGATIVE)
        weights = ops.cast(ops.softmax(logits, axis=-1), values.dtype)
        weights = ops.reshape(weights, (-1, heads, groups * query_length, key_length))
        attended = ops.einsum("bhmk,bhkd->bhmd", weights, values)
        attended = ops.reshape(attended, (-1, heads, groups, query_length, self.value_dim))
        return ops.cast(ops.transpose(attended, (0, 3, 1, 2, 4)), self.compute_dtype)

    def _fused_in_groups(self, query_heads, key_heads, value_heads, mask, scale: float):
        """The fused attention of grouped-query heads without repeating the keys and values (a copy of
        the whole cache in every layer at every decoding step): the query heads that share a key/value
        head become extra query rows of it. `mask` must be the same for every head."""
        groups, kv_heads = self.num_heads // self.num_key_value_heads, self.num_key_value_heads
        query_length, key_length = ops.shape(query_heads)[1], ops.shape(key_heads)[1]
        rows = ops.reshape(query_heads, (-1, query_length, kv_heads, groups, self.key_dim))
        rows = ops.reshape(ops.transpose(rows, (0, 3, 1, 2, 4)), (-1, groups * query_length, kv_heads, self.key_dim))
        if mask is not None:  # (batch, 1, query_length, key_length), once per group
            mask = ops.broadcast_to(mask, (ops.shape(mask)[0], 1, query_length, key_length))
            mask = ops.tile(mask, (1, 1, groups, 1))
        attended = ops.dot_product_attention(rows, key_heads, value_heads, mask=mask, scale=scale)
        attended = ops.reshape(attended, (-1, groups, query_length, kv_heads, self.value_dim))
        return ops.reshape(ops.transpose(attended, (0, 2, 3, 1, 4)), (-1, query_length, self.num_heads, self.value_dim))

    def compute_mask(self, query, value=None, key=None, query_mask=None, **kwargs):
        return query_mask

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            dropout=self.dropout,
            use_bias=self.use_bias,
            output_dim=self.output_dim,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            num_key_value_heads=self.num_key_value_heads,
            output_use_bias=self.output_use_bias,
            rotary_embedding=self.rotary_embedding,
            sliding_window=self.sliding_window,
            query_key_norm_epsilon=self.query_key_norm_epsilon,
        )
        return config
