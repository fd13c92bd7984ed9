"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus) sampling."""

from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import is_integer, is_number
from keras_tfm.layers.attention import LARGE_NEGATIVE


@dataclass(frozen=True)
class Sampler:
    """How to pick the next token. `temperature=0` (the default) is greedy decoding.

    Args:
        temperature: divides the logits before sampling; 0 means argmax.
        top_k: sample only among the `top_k` most likely tokens (0, or at least the vocabulary
            size: no limit).
        top_p: sample only among the smallest set of tokens whose probability reaches `top_p`.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not is_number(self.temperature) or self.temperature < 0:
            raise InputError(f"`temperature` must be a finite number >= 0; received {self.temperature!r}.")
        if not is_integer(self.top_k) or self.top_k < 0:
            raise InputError(f"`top_k` must be an integer >= 0; received {self.top_k!r}.")
        if not is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InputError(f"`top_p` must be a number in (0, 1]; received {self.top_p!r}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def __call__(self, logits, seed_generator: keras.random.SeedGenerator | None = None):
        """`logits` (batch, vocabulary) -> token ids (batch,)."""
        return self.choose(self.warp(logits), seed_generator)

    def choose(self, warped, seed_generator: keras.random.SeedGenerator | None = None):
        """A token of each row of `warp`'s logits: the argmax (greedy) or a draw."""
        if self.greedy:
            return ops.cast(ops.argmax(warped, axis=-1), "int32")
        return keras.random.categorical(warped, 1, seed=seed_generator, dtype="int32")[:, 0]

    def warp(self, logits):
        """The logits a token is drawn from: divided by the temperature, those outside top-k and
        top-p made very negative (transformers' warpers); greedy decoding leaves them as they are."""
        logits = ops.cast(logits, "float32")
        if self.greedy:
            return logits
        logits = logits / self.temperature
        if self.top_k and self.top_k < logits.shape[-1]:  # a larger top_k keeps every token
            logits = ops.where(logits < self.kth_largest(logits), LARGE_NEGATIVE, logits)
        if self.top_p < 1.0:
            logits = nucleus(logits, self.top_p)
        return logits

    def kth_largest(self, logits):
        """`(rows, 1)`: each row's `top_k`-th largest logit."""
        return ops.top_k(logits, self.top_k, sorted=True)[0][:, -1:]


def nucleus(logits, top_p):
    """`logits` `(rows, vocabulary)` with every token outside the smallest set whose probability reaches
    `top_p` (a number, or `(rows, 1)`: each row's) made very negative; the likeliest is always kept."""
    descending = ops.flip(ops.sort(logits, axis=-1), axis=-1)
    probabilities = ops.softmax(descending, axis=-1)
    mass_before = ops.cumsum(probabilities, axis=-1) - probabilities
    threshold = ops.min(ops.where(mass_before < top_p, descending, -LARGE_NEGATIVE), axis=-1, keepdims=True)
    return ops.where(logits < threshold, LARGE_NEGATIVE, logits)


def penalized(scores, seen, penalty):
    """transformers' repetition penalty: the scores of the tokens `seen` divided by `penalty` where
    positive, multiplied where negative (a number, or `(rows, 1)`: each row's)."""
    return ops.where(seen, ops.where(scores < 0, scores * penalty, scores / penalty), scores)


@dataclass(frozen=True)
class LogitsControls:
    """What changes the next-token scores before a token is chosen, with transformers' meanings.

    Args:
        repetition_penalty: every token already in the sequence (prompt included) has its score
            divided by this where positive and multiplied where negative (> 1 discourages repeats;
            1 changes nothing).
        min_new_tokens: the stop tokens are forbidden until a row has this many new tokens.
        no_repeat_ngram_size: n > 0 forbids a token that would repeat an n-gram already in the
            sequence (prompt included). Each step compares every earlier n-gram: it costs a
            `(rows, length, vocabulary)` comparison per token.
    """

    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    no_repeat_ngram_size: int = 0

    def __post_init__(self):
        if not is_integer(self.no_repeat_ngram_size) or self.no_repeat_ngram_size < 0:
            raise InputError(f"`no_repeat_ngram_size` must be an integer >= 0; received {self.no_repeat_ngram_size!r}.")
        if not is_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise InputError(f"`repetition_penalty` must be a number > 0; received {self.repetition_penalty!r}.")
        if not is_integer(self.min_new_tokens) or self.min_new_tokens < 0:
            raise InputError(f"`min_new_tokens` must be an integer >= 0; received {self.min_new_tokens!r}.")

    @property
    def penalizes(self) -> bool:
        return self.repetition_penalty != 1.0

    def initial_seen(self, buffer, start, vocabulary_size: int):
        """`(rows, vocabulary)`: which tokens `buffer[:, :start]` holds (a placeholder without a penalty)."""
        if not self.penalizes:
            return ops.zeros((ops.shape(buffer)[0], 1), "bool")
        positions = ops.arange(ops.shape(buffer)[1])[None, :] < start
        hits = ops.logical_and(ops.one_hot(buffer, vocabulary_size, dtype="int32") > 0, positions[..., None])
        return ops.any(hits, axis=1)

    def seen_with(self, seen, token, vocabulary_size: int):
        if not self.penalizes:
            return seen
        return ops.logical_or(seen, ops.one_hot(token, vocabulary_size, dtype="int32") > 0)

    def banned_ngrams(self, buffer, t, vocabulary_size: int):
        """`(rows, vocabulary)`: the tokens that, written at position `t`, would repeat an n-gram of
        `buffer[:, :t]`."""
        n = self.no_repeat_ngram_size
        rows, total = buffer.shape
        starts = total - n + 1  # n-grams that fit in the buffer, by their first position
        if starts < 1:
            return ops.zeros((rows, vocabulary_size), "bool")
        last = ops.slice(buffer, (0, ops.maximum(t - n + 1, 0)), (rows, n - 1)) if n > 1 else None
        matches = (ops.arange(starts) + n - 1 < t)[None, :]  # the n-gram is already written
        matches = ops.logical_and(matches, t >= n - 1)
        for k in range(n - 1):
            matches = ops.logical_and(matches, buffer[:, k : k + starts] == last[:, k : k + 1])
        following = buffer[:, n - 1 : n - 1 + starts]  # each n-gram's last token
        hits = ops.logical_and(ops.one_hot(following, vocabulary_size, dtype="int32") > 0, matches[..., None])
        return ops.any(hits, axis=1)

    def __call__(self, scores, seen, new_tokens, stop_token_ids, buffer=None, t=None):
        """`scores` `(rows, vocabulary)`; `new_tokens` `(rows,)`: how many each row has generated;
        `buffer`, `t`: the tokens so far are `buffer[:, :t]` (for `no_repeat_ngram_size`)."""
        scores = ops.cast(scores, "float32")
        if self.no_repeat_ngram_size:
            scores = ops.where(self.banned_ngrams(buffer, t, scores.shape[-1]), LARGE_NEGATIVE, scores)
        if self.penalizes:
            scores = penalized(scores, seen, self.repetition_penalty)
        if self.min_new_tokens:
            vocabulary = ops.arange(scores.shape[-1])
            is_stop = ops.any(vocabulary[:, None] == stop_token_ids[None, :], axis=-1)
            too_early = (new_tokens < self.min_new_tokens)[:, None]
            scores = ops.where(ops.logical_and(too_early, is_stop[None, :]), LARGE_NEGATIVE, scores)
        return scores


NO_CONTROLS = LogitsControls()


def check_decoding(owner: str, **arguments) -> None:
    """Refuses decoding settings that would run silently wrong: `max_new_tokens`, `max_length`,
    `num_beams` and `beam_size` (integers >= 1), `length_penalty` (finite), `pad_token_id` (an id of
    the vocabulary: `vocabulary_size` is given with it)."""
    vocabulary_size = arguments.pop("vocabulary_size", None)
    for name, value in arguments.items():
        if name == "length_penalty":
            if not is_number(value):
                raise InputError(f"`length_penalty` must be a finite number; received {value!r}.", caller=owner)
            continue
        low = 0 if name == "pad_token_id" else 1
        if not is_integer(value) or value < low or (name == "pad_token_id" and value >= vocabulary_size):
            expected = (
                f"an id in [0, vocabulary_size={vocabulary_size})" if name == "pad_token_id" else "an integer >= 1"
            )
            raise InputError(f"`{name}` must be {expected}; received {value!r}.", caller=owner)


def check_return_sequences(owner: str, num_return_sequences, num_beams: int, temperature: float) -> None:
    """Refuses more continuations than the decoding can give: beams hold at most `num_beams`, and greedy
    decoding (temperature 0, one beam) has one."""
    if not is_integer(num_return_sequences) or num_return_sequences < 1:
        raise InputError(
            f"`num_return_sequences` must be an integer >= 1; received {num_return_sequences!r}.",
            "num_return_sequences",
            caller=owner,
        )
    if num_beams > 1 and num_return_sequences > num_beams:
        raise InputError(
            f"beam search returns at most its `num_beams`={num_beams} beams; received "
            f"num_return_sequences={num_return_sequences}.",
            "num_return_sequences",
            caller=owner,
        )
    if num_beams == 1 and temperature == 0 and num_return_sequences > 1:
        raise InputError(
            f"greedy decoding has one continuation per prompt; received num_return_sequences="
            f"{num_return_sequences} (sample with a `temperature` > 0, or search with `num_beams`).",
            "num_return_sequences",
            caller=owner,
        )


def logits_controls(owner: str, repetition_penalty, min_new_tokens, no_repeat_ngram_size) -> LogitsControls:
    """`LogitsControls` of a decoding call, a bad value refused as an `InputError` naming `owner`."""
    try:
        return LogitsControls(repetition_penalty, min_new_tokens, no_repeat_ngram_size)
    except ValueError as error:
        raise InputError(f"{error}", caller=owner) from None
