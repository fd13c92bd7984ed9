"""What every decoder-only language model shares: next-token logits, the key/value cache, and `generate`.

A subclass (`GPT`, `DecoderLM`) makes `token_embedding`, `blocks` (`DecoderBlock`s), `final_norm` and
`lm_head` (None with `tie_embeddings`), and says how tokens become vectors at their positions (`_embed`).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.export import decoding, formats
from keras_tfm.export.decoding import EXPORTED_SETTINGS
from keras_tfm.export.formats import Endpoint
from keras_tfm.generation import compiled, constrained, orchestration, prompts, sliding
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.request import Request, check_return_scores
from keras_tfm.generation.sampling import check_pad_id
from keras_tfm.generation.text import TextDecoder
from keras_tfm.layers import shared_positions
from keras_tfm.layers.arguments import is_integer
from keras_tfm.layers.initializers import own_initializer
from keras_tfm.models.base import ZooModel


class CausalLM(ZooModel):
    """A decoder-only language model: `model(token_ids)` gives next-token logits at every position,
    and `generate` continues prompts with a key/value cache (see `GPT` and `DecoderLM`)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._generate_functions = compiled.CompiledFunctions()

    def default_loss(self) -> keras.losses.Loss:
        from keras_tfm.losses import TokenCrossEntropy

        return TokenCrossEntropy()

    def build(self, token_ids_shape=None):
        self.call(keras.KerasTensor((1, min(2, self.max_length)), "int32"))  # builds every sub-layer, computes nothing
        self.built = True

    def _id_inputs(self) -> dict:
        return {"token_ids": (self.vocabulary_size, "vocabulary_size")}

    def _label_range(self) -> tuple[int, str]:
        return self.vocabulary_size, "vocabulary_size"

    def _embed(self, token_ids, start_index=0, training=None):
        """Token vectors of `token_ids` at positions `start_index, ...` (the model's embeddings)."""
        raise NotImplementedError

    def _output_head(self, tie_embeddings: bool, initializer) -> keras.layers.Dense | None:
        """The `lm_head` of an untied model (a `Dense` to the vocabulary without bias), or None."""
        if tie_embeddings:
            return None
        return keras.layers.Dense(
            self.vocabulary_size,
            use_bias=False,
            kernel_initializer=own_initializer(initializer),
            dtype=self.dtype_policy,
            name="lm_head",
        )

    def _logits(self, hidden):
        """Next-token logits of the last block's output: the final norm, then the token table
        (`tie_embeddings`) or the `lm_head`."""
        hidden = self.final_norm(hidden)
        if self.tie_embeddings:
            return self.token_embedding(hidden, reverse=True)
        return self.lm_head(hidden)

    def call(self, token_ids, padding_mask=None, training=None):
        x = self._embed(token_ids, training=training)
        for block in self.blocks:
            x = block(x, decoder_padding_mask=padding_mask, training=training)
        return self._logits(x)

    def call_with_cache(self, token_ids, cache, cache_update_index, output_logits: bool = True, logits_at=None):
        """Logits for `token_ids` placed at positions `cache_update_index, ...`, reading and
        updating `cache`: one `(batch, 2, key/value heads, cache_length, head_dim)` key/value tensor per
        layer (a tuple, not one stacked tensor, so a step copies no layer's cache twice).
        `output_logits=False` returns `None` instead of the logits: a prefill that only fills the
        cache skips the vocabulary projection and, in the last block, everything but the keys and
        values (`DecoderBlock.update_cache`). `logits_at` `(batch,)` int32: the logits of each row's token at
        that index of `token_ids` alone, `(batch, vocabulary)` (a prefill whose rows choose their first token)."""
        x = self._embed(token_ids, start_index=cache_update_index)
        updated = []
        with shared_positions.computed_once():  # one rotation and one mask for every layer
            for i, (block, layer_cache) in enumerate(zip(self.blocks, cache)):
                if not output_logits and i == len(self.blocks) - 1:  # nothing reads the last block's output
                    updated.append(block.update_cache(x, layer_cache, cache_update_index))
                    return None, tuple(updated)
                x, layer_cache = block(x, self_attention_cache=layer_cache, cache_update_index=cache_update_index)
                updated.append(layer_cache)
        if logits_at is not None:
            x = ops.take_along_axis(x, ops.reshape(logits_at, (-1, 1, 1)), axis=1)[:, 0]
        return self._logits(x), tuple(updated)

    def compiled_decoding(self) -> compiled.CompiledFunctions:
        """The model, built, and its compiled decoding functions (`generation.protocol.DecodingModel`)."""
        self._build_on_demand()
        return self._generate_functions.of(self)

    @property
    def decoding_vocabulary_size(self) -> int:
        return self.vocabulary_size

    def decoding_cache(self, rows: int, length: int, copies: int = 1) -> tuple:
        """An empty key/value cache for `rows` rows of `length` positions, and no context."""
        return self.empty_cache(rows, length), ()

    def empty_cache(self, batch_size: int, length: int) -> tuple:
        attention = self.blocks[0].self_attention
        shape = (batch_size, 2, attention.num_key_value_heads, length, attention.key_dim)
        return tuple(ops.zeros(shape, self.compute_dtype) for _ in self.blocks)

    def generate(
        self,
        token_ids,
        max_new_tokens: int | None = None,
        padding_mask=None,
        config: GenerationConfig | None = None,
        return_scores: bool = False,
        **settings,
    ) -> np.ndarray:
        """Continues each prompt by up to `max_new_tokens` tokens with a key/value cache.

        Args:
            token_ids: a list of prompts (lists of ids, lengths may differ), or an int array
                `(batch, length)` with `padding_mask` (True at real tokens, padding on the right);
                or text: a string or a list of strings, encoded with `model.tokenizer`.
            max_new_tokens: tokens to add to each prompt (None: `config`'s).
            config: a `GenerationConfig` (None: its defaults: greedy, the checkpoint's end ids).
            return_scores: also return each new token's log-probability under the distribution it was
                chosen from (after the controls and warps: transformers'
                `compute_transition_scores(..., normalize_logits=True)`), float32 `(rows,
                max_new_tokens)`, 0 after a row's end. Greedy decoding and sampling.
            **settings: `GenerationConfig` fields overriding `config`'s: `temperature`, `top_k`,
                `top_p`, `min_p`, `seed`, `stop_token_ids` (None: the checkpoint's `eos_token_id`s;
                `()`: none), `pad_token_id`, `num_beams`, `length_penalty`, `repetition_penalty`,
                `min_new_tokens`, `no_repeat_ngram_size`, `num_return_sequences`, `logit_bias`,
                `frequency_penalty`, `presence_penalty`, and `json_schema`: the new text is JSON that
                follows this schema (a dict, or True for any object), by constrained decoding
                (llguidance; one compiled step per token, so slower than the whole-sequence loop).

        Returns:
            int array `(batch * num_return_sequences, prompt_length + max_new_tokens)`: row `i` holds
            its prompt followed directly by its new tokens, then `pad_token_id` (a prompt's
            continuations are consecutive rows). For text, the text of each prompt and its new tokens
            (up to and with a stop token), decoded by `model.tokenizer` without special tokens: a
            string for a string, a list for a list (lists of `num_return_sequences` strings when > 1).
            With `return_scores`, the pair `(output, scores)`.
        """
        owner = f"{type(self).__name__}.generate"
        config = GenerationConfig.of(config, owner, max_new_tokens=max_new_tokens, **settings)
        check_return_scores(owner, return_scores, config.num_beams)
        texts = prompts.texts(token_ids)
        if texts is not None:
            token_ids = self._encode_prompts(texts)
        request, output, scores, counts = self._generated(owner, token_ids, padding_mask, config, return_scores)
        output = orchestration.finish(request, output, texts, self.decode_text, counts)
        return (output, scores) if return_scores else output

    def _generated(self, owner: str, token_ids, padding_mask, config: GenerationConfig, return_scores=False):
        """`(request, output, scores, counts)`: the request's buffer decoded (`orchestration`, or
        `constrained` for a `json_schema`), each new token's scores, and each row's count of new tokens
        where a grammar ended it (else None)."""
        request = self._request(owner, token_ids, padding_mask, config, return_scores)
        if config.json_schema is None:
            return request, *orchestration.run(self, request), None
        if return_scores:
            raise InputError("is not computed with `json_schema`.", "return_scores", owner)
        output, counts = constrained.run(self, request, config)
        return request, output, None, counts

    def _request(
        self, owner: str, token_ids, padding_mask, config: GenerationConfig, return_scores=False, check_fits=True
    ) -> Request:
        """The checked `Request` of prompts decoded with `config` (the checkpoint's stop and pad ids where
        it names none); with `check_fits`, prompts and new tokens longer than `max_length` are refused."""
        pad_token_id = self._pad_id(config.pad_token_id)
        check_pad_id(owner, pad_token_id, self.vocabulary_size)
        stops = self.stop_ids(config.stop_token_ids)
        request = Request.of_config(token_ids, padding_mask, self.vocabulary_size, config, stops, pad_token_id,
                                    return_scores)  # fmt: skip
        if check_fits:
            self._check_fits(owner, request.buffer.shape[1], config.max_new_tokens)
        return request

    def stream(
        self,
        token_ids,
        max_new_tokens: int | None = None,
        chunk_size: int = 16,
        config: GenerationConfig | None = None,
        crop_context: bool = False,
        **settings,
    ):
        """Yields the continuation of one prompt as it is made: text pieces for a string (their
        concatenation is what `generate` adds to the prompt's text), arrays of new token ids for ids.

        `config` and `settings` are `generate`'s (greedy or sampling; beam search chooses its tokens
        only at the end). The compiled decoding loop hands over the first new token as soon as it is
        chosen, then `chunk_size` tokens at a time, keeping its cache between chunks: larger chunks cost
        less, smaller ones arrive sooner.

        `crop_context=True` goes on past `max_length` as nanoGPT does: each token is chosen from the
        last tokens that fit, the oldest cropped (`keras_tfm.generation.sliding`); without it, a prompt
        and `max_new_tokens` longer together than `max_length` are refused.

        Example:
        >>> lm = keras_tfm.gpt_shakespeare_char_cpu(num_layers=1)
        >>> pieces = list(lm.stream([1, 2, 3], max_new_tokens=8, chunk_size=4))  # 1, then 4, then 3 new ids
        >>> tuple(len(piece) for piece in pieces)
        (1, 4, 3)

        With a tokenizer (`lm.tokenizer`), a text prompt streams text:
        `for piece in lm.stream("Once upon a time", max_new_tokens=50): print(piece, end="")`.
        """
        owner = f"{type(self).__name__}.stream"
        config = GenerationConfig.of(config, owner, max_new_tokens=max_new_tokens, **settings)
        text = isinstance(token_ids, str)
        if not text and prompts.texts(token_ids) is not None:
            raise InputError(
                f"streams one prompt, a string or a list of ids; received {len(token_ids)} texts. "
                "Call `generate` for several prompts.",
                "token_ids",
                caller=owner,
            )
        for name in ("num_beams", "num_return_sequences"):
            if getattr(config, name) != 1:
                raise InputError(f"streams one continuation; received {name}={getattr(config, name)}.", name, owner)
        if config.json_schema is not None:
            raise InputError("is taken by `generate` and `chat`, not `stream`.", "json_schema", owner)
        if not is_integer(chunk_size) or chunk_size < 1:
            raise InputError(
                f"`chunk_size` must be an integer >= 1; received {chunk_size!r}.", "chunk_size", caller=owner
            )
        if not isinstance(crop_context, bool):
            raise InputError(f"expected True or False; received {crop_context!r}.", "crop_context", caller=owner)
        prompt = self._encode_prompts(token_ids)[0] if text else token_ids
        request = self._request(owner, prompt, None, config.replace(pad_token_id=0), check_fits=not crop_context)
        if request.buffer.shape[0] != 1:
            raise InputError(f"streams one prompt; received {request.buffer.shape[0]}.", "token_ids", caller=owner)
        if request.buffer.shape[1] > self.max_length:
            return self._cropped_stream(request, config, chunk_size, text)
        return orchestration.stream_pieces(self, request, chunk_size, text, self.decode_text)

    def _cropped_stream(self, request: Request, config: GenerationConfig, chunk_size: int, text: bool):
        """`stream` past `max_length` (`crop_context`): new ids, or text pieces whose concatenation is
        what the prompt's text gains."""
        prompt = request.buffer[0, : int(request.lengths[0])].tolist()
        rounds = sliding.cropped_stream(
            lambda context, count, seed: self.stream(context, count, chunk_size, config.replace(seed=seed)),
            prompt,
            request.max_new_tokens,
            self.max_length,
            request.seed,
            request.stop_token_ids,
        )
        if not text:
            yield from rounds
            return
        yield from orchestration.text_pieces(rounds, self.decode_text, prompt)

    def stop_ids(self, stop_token_ids=None) -> np.ndarray:
        """An id or ids as an int32 array of ids of the vocabulary; None: the checkpoint's end ids."""
        if stop_token_ids is None:
            ends = (self.generation_config or {}).get("eos_token_id")
            ends = [] if ends is None else [ends] if isinstance(ends, int) else list(ends)
            # an end id outside the vocabulary is never generated (a small model made from a GPT-2 config)
            stop_token_ids = [end for end in ends if 0 <= end < self.vocabulary_size]
        return prompts.stop_ids(stop_token_ids, self.vocabulary_size)

    def _pad_id(self, pad_token_id: int | None) -> int:
        if pad_token_id is None:
            pad_token_id = (self.generation_config or {}).get("pad_token_id")
            if not isinstance(pad_token_id, int) or not 0 <= pad_token_id < self.vocabulary_size:
                pad_token_id = 0
        return pad_token_id

    def export(
        self,
        filepath,
        format: str = "tf_saved_model",
        verbose=None,
        input_signature=None,
        config: GenerationConfig | None = None,
        cache_length: int | None = None,
        **kwargs,
    ) -> None:
        """`ZooModel.export`; a SavedModel also holds the decoding loop as its `generate` endpoint, which
        TensorFlow's loader or TensorFlow Serving runs without Keras:
        `generate(token_ids, lengths, max_new_tokens, seed)` takes int32 prompts `(batch, width)`
        (right-padded), each prompt's length `(batch,)`, how many tokens to add (a scalar, at most the
        exported `max_new_tokens`) and a seed (a scalar; greedy decoding ignores it), and returns
        `{"token_ids": (batch, width + max_new_tokens), "lengths": (batch,)}`: each prompt, its new
        tokens (up to and with a stop token), then the pad id; and where each row ends. Its rows equal
        `generate`'s with the same settings and seed.

        Args:
            config: the endpoint's `GenerationConfig` (default: greedy, the checkpoint's end ids, and
                `max_new_tokens` 128 or `max_length - 1` where that is less: the output's room); its
                fields may also be given as keyword arguments (`temperature=0.8`, `top_k`, `top_p`,
                `min_p`, `stop_token_ids`, `max_new_tokens`). Beam search and the logits controls are
                not exported.
            cache_length: exports the model's step over a key/value cache of this many positions, which
                the caller holds, so that a runtime without our loop decodes (LiteRT, onnxruntime):
                `decode(token_ids, position, cache)` takes int32 `token_ids` `(batch, length)` placed at
                positions `position ...` (an int32 scalar, shared by the rows) and the float `cache`
                `(num_layers, batch, 2, num_key_value_heads, cache_length, head_dim)` (zeros at first),
                and returns `{"logits": (batch, length, vocabulary_size), "updated_cache": ...}` to pass back.
                A LiteRT or ONNX file then holds this step instead of the forward pass (its signature or
                graph `decode`); a SavedModel gets it as one more endpoint. At most `max_length`.
        """
        owner = f"{type(self).__name__}.export"
        settings = {name: kwargs.pop(name) for name in list(kwargs) if name in GenerationConfig.fields()}
        given = dict(settings, config=config)
        formats.check_decoding_settings(format, owner, **given)
        formats.check_format(format, owner)
        step = None if cache_length is None else self._cached_step(owner, cache_length)
        if step is not None and format != "tf_saved_model":
            if input_signature is not None or kwargs:
                given = "input_signature" if input_signature is not None else next(iter(kwargs))
                raise InputError(
                    f"with cache_length, format={format!r} writes the cached step alone, whose signature is "
                    f"fixed; received {given}.",
                    given,
                    caller=owner,
                )
            return formats.write_function(self, filepath, format, step, verbose)
        endpoints = () if step is None else (step,)
        if format == "tf_saved_model":
            endpoints = (*endpoints, self._generate_endpoint(owner, config, settings))
        self._write_export(filepath, format, verbose, input_signature, endpoints, **kwargs)

    def _generate_endpoint(self, owner: str, config: GenerationConfig | None, settings: dict) -> Endpoint:
        """The SavedModel's `generate` endpoint with the export's settings, checked."""
        if config is None and settings.get("max_new_tokens") is None:
            settings["max_new_tokens"] = min(128, self.max_length - 1)
        config = GenerationConfig.of(config, owner, **settings)
        for name, field in GenerationConfig.fields().items():
            if name not in EXPORTED_SETTINGS and getattr(config, name) != field.default:
                raise InputError(
                    f"is not exported (greedy decoding and sampling are: {', '.join(EXPORTED_SETTINGS)}); "
                    f"received {name}.",
                    name,
                    owner,
                )
        self._check_fits(owner, 1 + config.max_new_tokens, config.max_new_tokens)
        stops, pad = self.stop_ids(config.stop_token_ids).tolist(), self._pad_id(config.pad_token_id)
        return decoding.generate_endpoint(self, config, stops, pad, config.max_new_tokens)

    def _cached_step(self, owner: str, cache_length) -> Endpoint:
        """The `decode` endpoint of `export(..., cache_length=)`, its length checked."""
        if not is_integer(cache_length) or not 1 <= cache_length <= self.max_length:
            raise InputError(
                f"must be an integer in [1, max_length={self.max_length}]; received {cache_length!r}.",
                "cache_length",
                caller=owner,
            )
        self._build_on_demand()
        return decoding.cached_step_endpoint(self, cache_length)

    def chat(
        self,
        messages: list[dict],
        max_new_tokens: int | None = None,
        config: GenerationConfig | None = None,
        **settings,
    ) -> str:
        """The model's reply to a conversation: the messages rendered with the checkpoint's chat template
        as transformers' `apply_chat_template` renders them (the same text and ids), then generated up
        to a stop id (by default the checkpoint's `eos_token_id`s) and decoded without special tokens.

        Args:
            messages: `[{"role": "system" | "user" | "assistant", "content": "..."}, ...]`.
            max_new_tokens: the longest reply, in tokens (None: `config`'s, or 256 without one).
            config, **settings: `generate`'s (sampling, `repetition_penalty`, `stop_token_ids`, ...).

        Example: `lm.chat([{"role": "user", "content": "What is a transformer?"}], max_new_tokens=64)`
        returns the reply as a string.
        """
        owner = f"{type(self).__name__}.chat"
        if self.tokenizer is None or not self.tokenizer.chat_template:
            raise InputError(
                "needs a tokenizer with a chat template (`model.tokenizer.chat_template`), as "
                "`from_huggingface` attaches for a checkpoint that has one; this model's tokenizer is "
                f"{type(self.tokenizer).__name__ if self.tokenizer is not None else None} without one.",
                "messages",
                caller=owner,
            )
        for name in ("num_return_sequences", "padding_mask"):
            if name in settings:
                raise InputError(f"replies to one conversation; `{name}` is not taken.", name, caller=owner)
        # the tokenizer checks the messages (an InputError naming `messages`) and renders them
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompt = np.asarray(self.tokenizer.encode(text)).tolist()  # the template holds the special tokens
        if config is None and max_new_tokens is None:
            max_new_tokens = 256
        config = GenerationConfig.of(config, owner, max_new_tokens=max_new_tokens, **settings)
        stops = self.stop_ids(config.stop_token_ids)
        _, output, _, counts = self._generated(
            owner, [prompt], None, config.replace(stop_token_ids=tuple(stops.tolist()))
        )
        length = config.max_new_tokens if counts is None else int(counts[0])
        decoder = TextDecoder(self.decode_text, stops, max_new_tokens=length)
        decoder.feed(output[0, len(prompt) :], last=True)
        return decoder.text

    def _check_fits(self, owner: str, total: int, max_new_tokens: int) -> None:
        """Refuses prompts and new tokens longer together than `max_length`."""
        if total > self.max_length:
            raise InputError(
                f"prompt length {total - max_new_tokens} + max_new_tokens {max_new_tokens} exceeds "
                f"max_length={self.max_length}.",
                "max_new_tokens",
                caller=owner,
            )

    def _encode_prompts(self, texts: str | list[str]) -> list[list[int]]:
        if self.tokenizer is None:
            raise InputError(
                f"{type(self).__name__}.generate: text needs a tokenizer, and `model.tokenizer` is None; set one "
                "(keras_tfm.data's tokenizers), load the model with `from_huggingface`, or give token ids.",
                "token_ids",
            )
        prompts = [
            np.asarray(self.tokenizer.encode_prompt(text)).tolist()
            for text in ([texts] if isinstance(texts, str) else texts)
        ]
        if not prompts or not all(prompts):
            raise InputError(
                f"{type(self).__name__}.generate: every prompt needs at least one token; received "
                f"{'no prompt' if not prompts else repr(texts)}.",
                "token_ids",
            )
        return prompts

    def decode_text(self, ids) -> str:
        """The text of token ids, without special tokens (`model.tokenizer`'s)."""
        return self.tokenizer.decode_text(ids)
