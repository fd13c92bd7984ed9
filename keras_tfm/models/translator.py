"""Translator: the encoder-decoder Transformer of "Attention Is All You Need", with cached translation.

    source ids -> embedding * sqrt(d) + positions -> num_encoder_layers x EncoderBlock (padding mask)
    target ids -> embedding * sqrt(d) + positions -> num_decoder_layers x DecoderBlock
                  (causal self-attention; cross-attention over the encoder output, source padding masked)
               -> logits (tied to the target embedding by default)

`translate` encodes each sentence once, computes every decoder layer's cross-attention keys and
values once, and decodes with a self-attention key/value cache: greedy or beam search, compiled once
per shape and reused.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.export import decoding, formats
from keras_tfm.generation import compiled, orchestration, prompts
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.request import Request
from keras_tfm.layers import (
    DecoderBlock,
    EncoderBlock,
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
    shared_positions,
)
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.models.base import ZooModel


@keras.saving.register_keras_serializable(package="keras_tfm")
class Translator(ZooModel):
    """An encoder-decoder Transformer: `model({"source_ids": s, "target_ids": t})` gives the logits of
    each next target token, `(batch, target_length, target_vocabulary_size)`.

    Args:
        source_vocabulary_size, target_vocabulary_size: token ids of each side (the target defaults
            to the source's; they must be equal with `share_embeddings`).
        num_encoder_layers, num_decoder_layers, num_heads, hidden_dim, intermediate_dim: the stacks.
        max_length: longest source or target sequence (the learned position tables; `translate`'s
            bound for sinusoidal positions).
        positions: "sinusoidal" (fixed, as in the paper and Marian) or "learned".
        norm_first: pre-norm blocks (plus a final LayerNorm on each stack) instead of the paper's
            post-norm.
        share_embeddings: one token table for source and target (a joint vocabulary).
        tie_embeddings: the output projection reuses the target token table; False gives a separate
            `lm_head` without bias.
        scale_embeddings: multiply token embeddings by sqrt(hidden_dim) (the paper, Marian).
        use_output_bias: a bias on the logits (Marian's `final_logits_bias`).
        activation, dropout, attention_dropout, layer_norm_epsilon: of the blocks.
        remat: the blocks recompute their activations in training's backward pass (less memory).
        pad_token_id: marks source padding (ignored by attention) and pads translations.
        start_token_id: the first decoder input of every translation.
        end_token_id: ends a translation.

    Call arguments:
        inputs: a dict with "source_ids" `(batch, source_length)` and "target_ids"
            `(batch, target_length)` (the decoder input: `start_token_id` then the target shifted
            right), the pair `(source_ids, target_ids)`, or `source_ids` with `target_ids` next. Source positions equal to `pad_token_id`
            are masked; right padding of the target is hidden by the causal mask, so only the loss
            has to skip it (e.g. `SparseCategoricalCrossentropy(ignore_class=pad_token_id)`).

    Example:
    >>> model = transformer_small(source_vocabulary_size=8000, target_vocabulary_size=6000)
    >>> source, target = np.random.randint(1, 8000, (2, 12)), np.random.randint(1, 6000, (2, 9))
    >>> logits = model({"source_ids": source, "target_ids": target})  # (2, 9, 6000)
    >>> ids = model.translate(source, max_length=10, beam_size=4)  # (2, <= 10) token ids
    """

    def __init__(
        self,
        source_vocabulary_size: int,
        target_vocabulary_size: int | None = None,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        num_heads: int = 8,
        hidden_dim: int = 512,
        intermediate_dim: int = 2048,
        max_length: int = 256,
        positions: str = "sinusoidal",
        norm_first: bool = False,
        share_embeddings: bool = False,
        tie_embeddings: bool = True,
        scale_embeddings: bool = True,
        use_output_bias: bool = False,
        activation: str = "relu",
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        layer_norm_epsilon: float = 1e-5,
        pad_token_id: int = 0,
        start_token_id: int = 1,
        end_token_id: int = 2,
        remat: bool = False,
        **kwargs,
    ):
        check_arguments("Translator", locals(), optional=("target_vocabulary_size",))
        kwargs.setdefault("name", "translator")
        self._check_heads("Translator", hidden_dim, num_heads)
        super().__init__(**kwargs)
        target_vocabulary_size = target_vocabulary_size or source_vocabulary_size
        if share_embeddings and target_vocabulary_size != source_vocabulary_size:
            raise InputError(
                "share_embeddings=True needs one vocabulary; received source_vocabulary_size="
                f"{source_vocabulary_size}, target_vocabulary_size={target_vocabulary_size}.",
                caller="Translator",
            )
        if positions not in ("sinusoidal", "learned"):
            raise InputError(
                f"positions must be 'sinusoidal' or 'learned'; received {positions!r}.", caller="Translator"
            )
        self.source_vocabulary_size = source_vocabulary_size
        self.target_vocabulary_size = target_vocabulary_size
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = num_decoder_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.max_length = max_length
        self.positions = positions
        self.norm_first = norm_first
        self.share_embeddings = share_embeddings
        self.tie_embeddings = tie_embeddings
        self.scale_embeddings = scale_embeddings
        self.use_output_bias = use_output_bias
        self.activation = activation
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.pad_token_id = pad_token_id
        self.start_token_id = start_token_id
        self.end_token_id = end_token_id

        self._make_layers(remat)
        self._generate_functions = compiled.CompiledFunctions()
        self._compile_defaults()

    def build(self, inputs_shape=None):
        if self.use_output_bias:
            self.output_bias = self.add_weight(
                shape=(self.target_vocabulary_size,), initializer="zeros", name="output_bias"
            )
        ids = keras.KerasTensor((1, 2), "int32")  # builds sub-layers, computes nothing
        self.call({"source_ids": ids, "target_ids": ids})
        self.built = True

    def _id_inputs(self) -> dict:
        return {
            "source_ids": (self.source_vocabulary_size, "source_vocabulary_size"),
            "target_ids": (self.target_vocabulary_size, "target_vocabulary_size"),
        }

    def default_loss(self) -> keras.losses.Loss:
        from keras_tfm.losses import TokenCrossEntropy

        return TokenCrossEntropy(ignore_class=self.pad_token_id)  # padded targets teach nothing

    def _label_range(self) -> tuple[int, str]:
        return self.target_vocabulary_size, "target_vocabulary_size"

    def _make_layers(self, remat: bool) -> None:
        """The embeddings, positions, both stacks of blocks, their norms and the head, from the settings."""
        policy = self.dtype_policy
        self.source_embedding = TokenEmbedding(
            self.source_vocabulary_size, self.hidden_dim, dtype=policy, name="source_embedding"
        )
        self.target_embedding = (
            self.source_embedding
            if self.share_embeddings
            else TokenEmbedding(self.target_vocabulary_size, self.hidden_dim, dtype=policy, name="target_embedding")
        )
        if self.positions == "sinusoidal":
            self.source_positions = SinusoidalPositionEncoding(interleave=False, dtype=policy, name="source_positions")
            self.target_positions = self.source_positions
        else:
            self.source_positions = LearnedPositionEmbedding(self.max_length, dtype=policy, name="source_positions")
            self.target_positions = LearnedPositionEmbedding(self.max_length, dtype=policy, name="target_positions")
        self.embedding_dropout = keras.layers.Dropout(self.dropout, dtype=policy, name="embedding_dropout")
        block_args = dict(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation=self.activation,
            norm_first=self.norm_first,
            layer_norm_epsilon=self.layer_norm_epsilon,
            remat=remat,
            dtype=policy,
        )
        self.encoder_blocks = [
            EncoderBlock(**block_args, name=f"encoder_block_{i}") for i in range(self.num_encoder_layers)
        ]
        self.decoder_blocks = [
            DecoderBlock(**block_args, use_cross_attention=True, name=f"decoder_block_{i}")
            for i in range(self.num_decoder_layers)
        ]
        if self.norm_first:  # pre-norm stacks end un-normalized; the paper's post-norm blocks end with a LayerNorm
            self.encoder_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=policy, name="encoder_norm"
            )
            self.decoder_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=policy, name="decoder_norm"
            )
        self.lm_head = (
            None
            if self.tie_embeddings
            else keras.layers.Dense(self.target_vocabulary_size, use_bias=False, dtype=policy, name="lm_head")
        )

    def _embed(self, ids, embedding, positions, start_index=0, training=None):
        x = embedding(ids)
        if self.scale_embeddings:
            x = x * ops.cast(math.sqrt(self.hidden_dim), x.dtype)
        x = x + positions(x, start_index=start_index)
        return self.embedding_dropout(x, training=training)

    def encode(self, source_ids, training=None):
        """The encoder output `(batch, source_length, hidden_dim)` and the source padding mask."""
        source_mask = ops.not_equal(source_ids, self.pad_token_id)
        x = self._embed(source_ids, self.source_embedding, self.source_positions, training=training)
        for block in self.encoder_blocks:
            x = block(x, padding_mask=source_mask, training=training)
        if self.norm_first:
            x = self.encoder_norm(x)
        return x, source_mask

    def _logits(self, x):
        if self.norm_first:
            x = self.decoder_norm(x)
        logits = self.target_embedding(x, reverse=True) if self.tie_embeddings else self.lm_head(x)
        if self.use_output_bias:
            logits = logits + ops.cast(self.output_bias, logits.dtype)
        return logits

    def decode(self, target_ids, encoder_output, source_mask, training=None):
        """Logits of each next target token given the encoded source."""
        x = self._embed(target_ids, self.target_embedding, self.target_positions, training=training)
        for block in self.decoder_blocks:
            x = block(x, encoder_output, encoder_padding_mask=source_mask, training=training)
        return self._logits(x)

    def call(self, inputs, target_ids=None, training=None):
        if isinstance(inputs, dict):
            source_ids, target_ids = inputs["source_ids"], inputs["target_ids"]
        elif target_ids is None:
            source_ids, target_ids = inputs
        else:
            source_ids = inputs
        encoder_output, source_mask = self.encode(source_ids, training=training)
        return self.decode(target_ids, encoder_output, source_mask, training=training)

    def call_with_cache(
        self, token_ids, cache, cache_update_index, cross_cache, source_mask, output_logits: bool = True, logits_at=None
    ):
        """Logits for `token_ids` at positions `cache_update_index, ...` and the updated `cache`.

        `cache`: one self-attention key/value tensor `(batch, 2, heads, length, head_dim)` per
        decoder layer; `cross_cache`: one `(batch, 2, heads, source_length, head_dim)` per layer
        (`precompute_key_value` of the encoder output), read only; `source_mask`: `(batch,
        source_length)`. `output_logits=False` returns `None` instead of the logits (a prefill, which
        also skips all but the last block's keys and values: `DecoderBlock.update_cache`). `logits_at` `(batch,)`
        int32: the logits of each row's token at that index alone, `(batch, vocabulary)`."""
        x = self._embed(token_ids, self.target_embedding, self.target_positions, start_index=cache_update_index)
        updated = []
        with shared_positions.computed_once():  # one mask of positions for every layer
            for i, (block, layer_cache, layer_cross) in enumerate(zip(self.decoder_blocks, cache, cross_cache)):
                if not output_logits and i == len(self.decoder_blocks) - 1:  # nothing reads the last block's output
                    updated.append(block.update_cache(x, layer_cache, cache_update_index))
                    return None, tuple(updated)
                x, layer_cache, _ = block(
                    x,
                    encoder_padding_mask=source_mask,
                    self_attention_cache=layer_cache,
                    cache_update_index=cache_update_index,
                    cross_attention_cache=layer_cross,
                )
                updated.append(layer_cache)
        if logits_at is not None:
            x = ops.take_along_axis(x, ops.reshape(logits_at, (-1, 1, 1)), axis=1)[:, 0]
        return self._logits(x), tuple(updated)

    def _prepare_source(self, source_ids):
        vocabulary = self.source_vocabulary_size
        if (
            isinstance(source_ids, (list, tuple))
            and source_ids
            and isinstance(source_ids[0], (list, tuple, np.ndarray))
        ):
            ids = prompts.right_padded(source_ids, "source_ids", vocabulary, self.pad_token_id)
        else:
            ids = prompts.as_token_ids(ops.convert_to_numpy(source_ids), "source_ids", vocabulary)
            if ids.ndim == 1:  # one sentence, as `GPT.generate` takes one prompt
                ids = ids[None]
            if ids.ndim != 2:
                raise InputError(
                    f"`source_ids` must be (batch, length), one sentence "
                    f"(length,) or a list of lists; received shape {ids.shape}.",
                    caller="Translator.translate",
                )
        if ids.shape[0] == 0:
            raise InputError(
                f"`source_ids` must hold at least one source; received shape {ids.shape}.",
                caller="Translator.translate",
            )
        empty = np.flatnonzero(np.all(ids == self.pad_token_id, axis=1))
        if ids.shape[1] == 0 or empty.size:
            raise InputError(
                f"every source needs at least one token that is not "
                f"pad_token_id={self.pad_token_id}; row {empty[0] if empty.size else 0} has none.",
                caller="Translator.translate",
            )
        return ids

    def translate(
        self,
        source_ids,
        max_length: int | None = None,
        beam_size: int | None = None,
        length_penalty: float | None = None,
        config: GenerationConfig | None = None,
        **settings,
    ):
        """Translates a batch of sources (lists of ids of any lengths, or `(batch, length)` padded
        with `pad_token_id`), or one source (a list or 1-D array of ids, translated as a batch of one);
        or text: a string or a list of strings, with `model.tokenizer` (a Marian checkpoint's, attached
        by `from_huggingface`: `encode_source`, `decode_target`).

        Args:
            max_length: most target tokens per sentence, the end token included (`config`'s
                `max_new_tokens`; default 64).
            beam_size: 1 (default) is greedy; more runs beam search (`config`'s `num_beams`).
            length_penalty: beams are ranked by log-probability / length ** length_penalty.
            config, **settings: a `GenerationConfig` and fields overriding it, as in `CausalLM.generate`
                (`repetition_penalty`, `min_new_tokens`, `no_repeat_ngram_size`, sampling), over the
                target tokens; the stop and pad ids are the model's.

        Returns:
            int array `(batch, max_length)`: each translation (without the start token), ending with
            `end_token_id` unless cut at `max_length`, then `pad_token_id`. For text, the translations'
            text: a string for a string, a list for a list.
        """
        owner = "Translator.translate"
        names = dict(max_new_tokens=max_length, num_beams=beam_size, length_penalty=length_penalty)
        config = _translation_config(owner, config or GenerationConfig(max_new_tokens=64), **names, **settings)
        max_length = config.max_new_tokens
        texts = prompts.texts(source_ids)
        if texts is not None:
            source_ids = self._encode_sources(owner, texts)
        self._build_on_demand()
        source = self._prepare_source(source_ids)
        for name, length in (("source length", source.shape[1]), ("max_length + 1", max_length + 1)):
            if length > self.max_length:
                raise InputError(f"{name} {length} exceeds the model's max_length={self.max_length}.", caller=owner)
        starts, stops = [[self.start_token_id]] * source.shape[0], np.array([self.end_token_id], "int32")
        request = Request.of_config(starts, None, self.target_vocabulary_size, config, stops, self.pad_token_id)
        output, _ = orchestration.run(self, request, (ops.convert_to_tensor(source),))
        output = output[:, 1:]
        if texts is None:
            return output
        translations = []
        for row in output.tolist():
            end = row.index(self.end_token_id) if self.end_token_id in row else len(row)
            translations.append(self.tokenizer.decode_target(row[:end]))
        return translations[0] if isinstance(texts, str) else translations

    def export(
        self,
        filepath,
        format: str = "tf_saved_model",
        verbose=None,
        input_signature=None,
        max_length: int | None = None,
        **kwargs,
    ) -> None:
        """`ZooModel.export`; a SavedModel also holds greedy translation as its `translate` endpoint,
        which TensorFlow's loader or TensorFlow Serving runs without Keras: `translate(source_ids)` takes
        int32 sources `(batch, length)` padded with `pad_token_id` and returns `{"token_ids": (batch,
        max_length), "lengths": (batch,)}`, as `translate` returns them (the end token included), and
        each translation's length.

        Args:
            max_length: most target tokens per sentence, the end token included (as `translate`'s).
                None (default): 64, or the model's `max_length - 1` where that is less.
        """
        owner = "Translator.export"
        formats.check_decoding_settings(format, owner, max_length=max_length)
        formats.check_format(format, owner)
        endpoints = ()
        if format == "tf_saved_model":
            max_length = min(64, self.max_length - 1) if max_length is None else max_length
            _translation_config(owner, GenerationConfig(), max_new_tokens=max_length)
            if max_length + 1 > self.max_length:
                raise InputError(
                    f"max_length + 1 = {max_length + 1} exceeds the model's max_length={self.max_length}.",
                    "max_length",
                    caller=owner,
                )

            endpoints = (decoding.translate_endpoint(self, max_length),)
        self._write_export(filepath, format, verbose, input_signature, endpoints, **kwargs)

    def _encode_sources(self, owner: str, texts) -> list[list[int]]:
        if self.tokenizer is None:
            raise InputError(
                "text needs a tokenizer with both sides (a Marian checkpoint's, as `from_huggingface` attaches, "
                "or a `keras_tfm.data.TranslationTokenizer` of a source and a target tokenizer); "
                "`model.tokenizer` is None. Give token ids instead.",
                "source_ids",
                caller=owner,
            )
        sources = [
            np.asarray(self.tokenizer.encode_source(text)).tolist()
            for text in ([texts] if isinstance(texts, str) else texts)
        ]
        if not sources or not all(sources):
            raise InputError(f"every source needs at least one token; received {texts!r}.", "source_ids", caller=owner)
        return sources

    def compiled_decoding(self) -> compiled.CompiledFunctions:
        """The model, built, and its compiled decoding functions (`generation.protocol.DecodingModel`)."""
        self._build_on_demand()
        return self._generate_functions.of(self)

    @property
    def decoding_vocabulary_size(self) -> int:
        return self.target_vocabulary_size

    def decoding_cache(self, rows: int, length: int, source, copies: int = 1) -> tuple:
        """An empty self-attention cache for `rows` target rows of `length` positions, and the context
        every step reads: the encoder's keys and values of `source` and its mask, for `copies` beams of
        each source."""
        encoder_output, source_mask = self.encode(source)
        cross_cache = tuple(block.cross_attention.precompute_key_value(encoder_output) for block in self.decoder_blocks)
        if copies > 1:
            cross_cache = tuple(ops.repeat(part, copies, axis=0) for part in cross_cache)
            source_mask = ops.repeat(source_mask, copies, axis=0)
        head_dim = self.hidden_dim // self.num_heads
        cache = tuple(
            ops.zeros((rows, 2, self.num_heads, length, head_dim), self.compute_dtype) for _ in self.decoder_blocks
        )
        return cache, (cross_cache, source_mask)


def transformer_small(**overrides) -> Translator:
    """A Multi30k-sized Transformer: 3 + 3 layers, 8 heads, 256 wide, feed-forward 512 (about 9M
    parameters with ~8k-token vocabularies), dropout 0.1."""
    size = dict(source_vocabulary_size=8000, num_encoder_layers=3, num_decoder_layers=3, num_heads=8,
                hidden_dim=256, intermediate_dim=512, dropout=0.1)  # fmt: skip
    return Translator(**{**size, **overrides})


def transformer_base(**overrides) -> Translator:
    """Transformer base (Vaswani et al. 2017): 6 + 6 layers, 8 heads, 512 wide, feed-forward 2048,
    dropout 0.1, a shared 37,000-token vocabulary."""
    size = dict(source_vocabulary_size=37000, share_embeddings=True, num_encoder_layers=6, num_decoder_layers=6,
                num_heads=8, hidden_dim=512, intermediate_dim=2048, dropout=0.1)  # fmt: skip
    return Translator(**{**size, **overrides})


def transformer_big(**overrides) -> Translator:
    """Transformer big: 6 + 6 layers, 16 heads, 1024 wide, feed-forward 4096, dropout 0.3."""
    size = dict(source_vocabulary_size=37000, share_embeddings=True, num_encoder_layers=6, num_decoder_layers=6,
                num_heads=16, hidden_dim=1024, intermediate_dim=4096, dropout=0.3)  # fmt: skip
    return Translator(**{**size, **overrides})


def _translation_config(owner: str, config: GenerationConfig, **settings) -> GenerationConfig:
    """`config` with `translate`'s arguments, a bad one refused in `translate`'s names."""
    names = {"max_new_tokens": "max_length", "num_beams": "beam_size"}
    try:
        return GenerationConfig.of(config, owner, **settings)
    except InputError as error:
        raise InputError(error.words(names.get), names.get(error.argument, error.argument), owner) from None
