"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus) sampling."""

from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import ops

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
            raise ValueError(f"`temperature` must be a finite number >= 0; received {self.temperature!r}.")
        if not is_integer(self.top_k) or self.top_k < 0:
            raise ValueError(f"`top_k` must be an integer >= 0; received {self.top_k!r}.")
        if not is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"`top_p` must be a number in (0, 1]; received {self.top_p!r}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def __call__(self, logits, seed_generator: keras.random.SeedGenerator | None = None):
        """`logits` (batch, vocabulary) -> token ids (batch,)."""
        logits = ops.cast(logits, "float32")
        if self.greedy:
            return ops.cast(ops.argmax(logits, axis=-1), "int32")
        logits = logits / self.temperature
        if self.top_k and self.top_k < logits.shape[-1]:  # a larger top_k keeps every token
            kth_largest = ops.top_k(logits, self.top_k, sorted=True)[0][:, -1:]
            logits = ops.where(logits < kth_largest, LARGE_NEGATIVE, logits)
        if self.top_p < 1.0:
            descending = ops.flip(ops.sort(logits, axis=-1), axis=-1)
            probabilities = ops.softmax(descending, axis=-1)
            mass_before = ops.cumsum(probabilities, axis=-1) - probabilities
            # the smallest logit still inside the nucleus; the most likely token is always kept
            kept = ops.where(mass_before < self.top_p, descending, -LARGE_NEGATIVE)
            threshold = ops.min(kept, axis=-1, keepdims=True)
            logits = ops.where(logits < threshold, LARGE_NEGATIVE, logits)
        choice = keras.random.categorical(logits, 1, seed=seed_generator, dtype="int32")
        return choice[:, 0]


def check_decoding(owner: str, **arguments) -> None:
    """Refuses decoding settings that would run silently wrong: `max_new_tokens`, `max_length`,
    `num_beams` and `beam_size` (integers >= 1), `length_penalty` (finite), `pad_token_id` (an id of
    the vocabulary: `vocabulary_size` is given with it)."""
    vocabulary_size = arguments.pop("vocabulary_size", None)
    for name, value in arguments.items():
        if name == "length_penalty":
            if not is_number(value):
                raise ValueError(f"{owner}: `length_penalty` must be a finite number; received {value!r}.")
            continue
        low = 0 if name == "pad_token_id" else 1
        if not is_integer(value) or value < low or (name == "pad_token_id" and value >= vocabulary_size):
            expected = (
                f"an id in [0, vocabulary_size={vocabulary_size})" if name == "pad_token_id" else "an integer >= 1"
            )
            raise ValueError(f"{owner}: `{name}` must be {expected}; received {value!r}.")
