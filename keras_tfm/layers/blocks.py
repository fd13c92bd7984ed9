"""Transformer blocks: attention mixes tokens, a feed-forward network refines each token.

Pre-norm (`norm_first=True`, ViT/GPT):  Y = X + MHSA(LN(X));   X' = Y + FFN(LN(Y))
Post-norm (`norm_first=False`, original Transformer/BERT):  Z = LN(X + MHSA(X));  X' = LN(Z + FFN(Z))
"""

from __future__ import annotations

import keras

from keras_tfm.compat import get_keras_mask, set_keras_mask
from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.layers.attention_inputs import static_dims_differ
from keras_tfm.layers.block_base import _Block
from keras_tfm.layers.remat import rematerializable
from keras_tfm.layers.residual import residual


def _gather(x, positions):
    """`x[b, positions[b]]` for `x` of shape `(batch, length, ...)`."""
    for _ in range(len(x.shape) - 2):
        positions = positions[..., None]
    return keras.ops.take_along_axis(x, positions, axis=1)


@keras.saving.register_keras_serializable(package="keras_tfm")
class EncoderBlock(_Block):
    """Bidirectional self-attention + feed-forward, each with a residual connection and LayerNorm.

    Args:
        num_heads: attention heads.
        intermediate_dim: hidden width of the feed-forward network.
        key_dim: size per head; defaults to `hidden_dim // num_heads` (then `hidden_dim` must be
            divisible by `num_heads`).
        dropout: on each sub-layer's output before the residual addition.
        attention_dropout: on the attention weights.
        activation: of the feed-forward network ("gelu", "relu", "gelu_approximate", ...).
        norm_first: True for pre-norm (ViT, GPT), False for post-norm (original Transformer, BERT).
        layer_norm_epsilon, use_bias, kernel_initializer, bias_initializer.
        remat: in training, recompute the block's activations in the backward pass instead of
            storing them (`keras_tfm.layers.remat`): less memory, one more forward pass.
        num_key_value_heads: grouped-query self-attention (see `MultiHeadAttention`).
        normalization: "layer_norm" (`keras.layers.LayerNormalization`) or "rms_norm"
            (Keras' `keras.layers.RMSNormalization`: Hugging Face's Llama numbers in float32. Both
            normalise in float32; Keras scales before casting back, Hugging Face after, which under
            bfloat16 differs by a rounding), with `layer_norm_epsilon`.
        gated_feed_forward: a `GatedFeedForward` (SwiGLU with "silu") instead of `FeedForward`.
        attention_use_bias, attention_output_use_bias, feed_forward_use_bias: the biases of the
            query/key/value projections, of the attention's output projection and of the
            feed-forward network; each defaults to `use_bias` (the output's to `attention_use_bias`).
        rotary_embedding, sliding_window, query_key_norm_epsilon: of the self-attention (see
            `MultiHeadAttention`).
        norm_use_bias: the layer norms' offsets (ModernBERT's have none).
        normalize_attention_input: False: the self-attention reads the block's input as it comes (pre-norm
            only: ModernBERT's first block, whose input the embeddings' norm has just normalized).
        layer_scale_init: each branch's output scaled by a learned per-channel factor started at this
            (`LayerScale`: DINOv2, CaiT); None: none.
        drop_path_rate: stochastic depth in training: each example's branch dropped with this
            probability (`DropPath`).

    Call arguments:
        inputs: `(batch, length, hidden_dim)`.
        padding_mask: `(batch, length)`, True at real tokens; defaults to the Keras mask of
            `inputs` (e.g. from `TokenEmbedding(mask_zero=True)`). Pad tokens are never attended to.
        attention_mask: optional boolean `(batch, length, length)`, combined with the padding mask.
        return_attention_weights: also return the `(batch, num_heads, length, length)` weights.
        output_positions: optional int `(batch, num_positions)`: compute the output only at these
            positions, `(batch, num_positions, hidden_dim)`; every token is still a key and value.
            The same numbers as gathering the full output at those positions, for less work: a
            masked language model's last block, whose other outputs nothing reads, skips the
            queries, attention output and feed-forward network of every other token.

    Masks: the output keeps the input's Keras mask (gathered at `output_positions` when given).

    Example:
    >>> block = EncoderBlock(num_heads=4, intermediate_dim=256)
    >>> x = np.random.rand(2, 10, 64).astype("float32")
    >>> y = block(x)  # (2, 10, 64)
    >>> y = block(x, output_positions=np.array([[3, 7], [0, 1]]))  # (2, 2, 64)
    """

    def build(self, inputs_shape):
        hidden_dim = inputs_shape[-1]
        self.self_attention = self._attention(hidden_dim, "self_attention")
        self.self_attention_norm = self._norm("self_attention_norm")
        self.feed_forward = self._feed_forward()
        self.feed_forward_norm = self._norm("feed_forward_norm")
        self.self_attention.build(inputs_shape)
        self.self_attention_norm.build(inputs_shape)
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm.build(inputs_shape)
        self.after_attention = self._branch_output("self_attention", hidden_dim)
        self.after_feed_forward = self._branch_output("feed_forward", hidden_dim)
        self.built = True

    @rematerializable
    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        return_attention_weights: bool = False,
        output_positions=None,
        training=None,
    ):
        keras_mask = get_keras_mask(inputs)
        if padding_mask is None:
            padding_mask = keras_mask
        x, context = inputs, None  # context: keys and values when queries are a subset of tokens
        normalized_queries = None
        if output_positions is not None:
            if self.rotary_embedding is not None:  # gathered queries would be rotated as positions 0, 1, ...
                raise InputError("output_positions needs positions added before the block; this block rotates "
                                 "its queries (rotary_embedding): gather its output instead.", "output_positions",
                                 caller="EncoderBlock")  # fmt: skip
            output_positions = self._checked_positions(output_positions, inputs)
            x = _gather(inputs, output_positions)
            context = self.self_attention_norm(inputs) if self.norm_first else inputs
            if self.norm_first:  # the queries are already normalised, as part of the context
                normalized_queries = _gather(context, output_positions)
            if attention_mask is not None:
                attention_mask = _gather(attention_mask, output_positions)

        def attend(h):
            return self.self_attention(
                h,
                context,
                value_mask=padding_mask,
                attention_mask=attention_mask,
                return_attention_weights=return_attention_weights,
                training=training,
            )

        x, extras = residual(
            x,
            attend,
            self.self_attention_norm,
            self.after_attention,
            self.norm_first,
            training,
            normalized=normalized_queries,
        )
        x, _ = residual(
            x,
            lambda h: self.feed_forward(h, training=training),
            self.feed_forward_norm,
            self.after_feed_forward,
            self.norm_first,
            training,
        )
        if output_positions is not None and keras_mask is not None:
            # Keras would attach the input's (batch, length) mask to the shorter output.
            set_keras_mask(x, _gather(keras_mask, output_positions))
        return (x, *extras) if extras else x

    @staticmethod
    def _checked_positions(positions, inputs):
        if len(positions.shape) != 2 or static_dims_differ(positions.shape[:1], inputs.shape[:1]):
            raise InputError(
                f"`output_positions` must have shape (batch, num_positions) with batch = "
                f"{inputs.shape[0]}; received shape {tuple(positions.shape)}.",
                caller="EncoderBlock",
            )
        return keras.ops.cast(positions, "int32")


@keras.saving.register_keras_serializable(package="keras_tfm")
class DecoderBlock(_Block):
    """Causal self-attention, optional cross-attention over an encoder output, and feed-forward.

    Without cross-attention this is the GPT block; with it, the decoder block of the original
    Transformer (queries from the decoder, keys and values from the encoder output).

    Args: as `EncoderBlock`, plus
        use_cross_attention: add the cross-attention sub-layer (an encoder-decoder model).

    Call arguments:
        decoder_sequence: `(batch, target_length, hidden_dim)`.
        encoder_sequence: `(batch, source_length, encoder_dim)`, needed with cross-attention
            (unless `cross_attention_cache` is given).
        decoder_padding_mask: `(batch, target_length)` (or `(batch, cache_length)` when decoding
            with a cache), True at real tokens; defaults to the Keras mask of `decoder_sequence`.
        encoder_padding_mask: `(batch, source_length)`, True at real source tokens; defaults to the
            Keras mask of `encoder_sequence`.
        self_attention_cache, cache_update_index: key/value cache of the self-attention
            (see `MultiHeadAttention`); query `i` sits at position `cache_update_index + i`.
        cross_attention_cache: precomputed encoder keys/values
            (`block.cross_attention.precompute_key_value(encoder_sequence)`). `update_cache` fills
            the self-attention cache without computing the output (a prefill's last block).
        use_causal_mask: True (default) for autoregressive decoding.
        return_attention_weights: also return the attention weights.

    Returns:
        the output `(batch, target_length, hidden_dim)`, followed, in this order and only when
        asked for, by: self-attention weights, cross-attention weights (`return_attention_weights`),
        the updated self-attention cache, the cross-attention cache (when caches were given).

    Example:
    >>> block = DecoderBlock(num_heads=4, intermediate_dim=256, use_cross_attention=True)
    >>> target, source = np.zeros((2, 7, 64), "float32"), np.zeros((2, 9, 64), "float32")
    >>> y = block(target, source)  # (2, 7, 64)
    """

    def __init__(self, *args, use_cross_attention: bool = False, **kwargs):
        check_arguments("DecoderBlock", locals())
        super().__init__(*args, **kwargs)
        self.use_cross_attention = use_cross_attention

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        hidden_dim = decoder_sequence_shape[-1]
        self.self_attention = self._attention(hidden_dim, "self_attention")
        self.self_attention_norm = self._norm("self_attention_norm")
        self.self_attention.build(decoder_sequence_shape)
        self.self_attention_norm.build(decoder_sequence_shape)
        if self.use_cross_attention:
            encoder_sequence_shape = encoder_sequence_shape or decoder_sequence_shape
            self.cross_attention = self._attention(hidden_dim, "cross_attention", positional=False)
            self.cross_attention_norm = self._norm("cross_attention_norm")
            self.cross_attention.build(decoder_sequence_shape, encoder_sequence_shape)
            self.cross_attention_norm.build(decoder_sequence_shape)
        self.feed_forward = self._feed_forward()
        self.feed_forward_norm = self._norm("feed_forward_norm")
        self.feed_forward.build(decoder_sequence_shape)
        self.feed_forward_norm.build(decoder_sequence_shape)
        self.after_attention = self._branch_output("self_attention", hidden_dim)
        self.after_cross_attention = self._branch_output(
            "cross_attention", hidden_dim if self.use_cross_attention else None
        )
        self.after_feed_forward = self._branch_output("feed_forward", hidden_dim)
        self.built = True

    def compute_output_shape(self, decoder_sequence_shape, *args, **kwargs):
        # Named as in `build`: `summary()` passes the shapes `build` recorded, by name.
        return decoder_sequence_shape

    @rematerializable
    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        cache_update_index=None,
        cross_attention_cache=None,
        use_causal_mask: bool = True,
        return_attention_weights: bool = False,
        training=None,
    ):
        if decoder_padding_mask is None:
            decoder_padding_mask = get_keras_mask(decoder_sequence)
        if self.use_cross_attention and encoder_sequence is None and cross_attention_cache is None:
            raise InputError(
                "DecoderBlock(use_cross_attention=True) needs `encoder_sequence` or "
                "`cross_attention_cache`; received neither."
            )
        if not self.use_cross_attention and (encoder_sequence is not None or cross_attention_cache is not None):
            raise InputError(
                "DecoderBlock received `encoder_sequence` or `cross_attention_cache` but was built "
                "with use_cross_attention=False."
            )
        if encoder_padding_mask is None and encoder_sequence is not None:
            encoder_padding_mask = get_keras_mask(encoder_sequence)

        def self_attend(x):
            return self.self_attention(
                x,
                value_mask=decoder_padding_mask,
                use_causal_mask=use_causal_mask,
                cache=self_attention_cache,
                cache_update_index=cache_update_index,
                return_attention_weights=return_attention_weights,
                training=training,
            )

        x, self_extras = residual(
            decoder_sequence, self_attend, self.self_attention_norm, self.after_attention, self.norm_first, training
        )
        cross_extras = ()
        if self.use_cross_attention:

            def cross_attend(h):
                return self.cross_attention(
                    h,
                    encoder_sequence,
                    value_mask=encoder_padding_mask,
                    cache=cross_attention_cache,
                    return_attention_weights=return_attention_weights,
                    training=training,
                )

            x, cross_extras = residual(
                x, cross_attend, self.cross_attention_norm, self.after_cross_attention, self.norm_first, training
            )
        x, _ = residual(
            x,
            lambda h: self.feed_forward(h, training=training),
            self.feed_forward_norm,
            self.after_feed_forward,
            self.norm_first,
            training,
        )

        weights, caches = [], []
        for extras in (self_extras, cross_extras):
            if return_attention_weights:
                weights.append(extras[0])
                extras = extras[1:]
            caches.extend(extras)
        extras = weights + caches
        return (x, *extras) if extras else x

    def update_cache(self, decoder_sequence, self_attention_cache, cache_update_index):
        """The self-attention cache that `call` returns for these arguments, without the block's
        output: the keys and values of `decoder_sequence` written at `cache_update_index`. A prefill
        reads nothing else from the last block, so its queries, attention, cross-attention and
        feed-forward network are skipped."""
        keys_from = self.self_attention_norm(decoder_sequence) if self.norm_first else decoder_sequence
        return self.self_attention.update_cache(keys_from, self_attention_cache, cache_update_index)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(use_cross_attention=self.use_cross_attention)
        return config
