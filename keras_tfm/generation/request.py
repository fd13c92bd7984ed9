"""One decoding call as small typed objects: how tokens are chosen (`Strategy`), and the checked call
itself (`Request`: the prompts as a right-padded buffer, how rows stop, the chooser's settings, the seed).
`generate`, `stream`, `chat` and `translate` each make one and hand it to `orchestration`; a server's
requests of different lengths and settings are requests too."""

from __future__ import annotations

import dataclasses

import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.generation.beam_search import Batch, BeamSearch
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.prompts import prepare_prompts
from keras_tfm.generation.sampling import Chooser, RowSettings, bias_of, chooser_of, config_settings, row_seeds


@dataclasses.dataclass(frozen=True)
class Strategy:
    """How many continuations each prompt gets and how: by beam search over `num_beams` > 1 beams ranked by
    log-probability / length ** `length_penalty` (the best `num_return_sequences`), else by the chooser
    (greedy, or that many draws)."""

    num_beams: int = 1
    length_penalty: float = 1.0
    num_return_sequences: int = 1

    @property
    def search(self) -> BeamSearch | None:
        """The beam search, or None for greedy decoding and sampling."""
        return (
            BeamSearch(self.num_beams, self.length_penalty, self.num_return_sequences) if self.num_beams > 1 else None
        )


def strategy_of(config: GenerationConfig) -> Strategy:
    """How many continuations a `GenerationConfig` asks for, and whether by beam search."""
    return Strategy(config.num_beams, config.length_penalty, config.num_return_sequences)


@dataclasses.dataclass(frozen=True)
class Request:
    """One decoding call, checked: `buffer` and `prompt_mask` `(rows, total)` hold the prompts
    right-padded and room for `max_new_tokens` (rows repeated where a prompt is sampled several times),
    `lengths` each prompt's length (all NumPy); a row ends after a token of `stop_token_ids`, or after
    `max_new_tokens`, and is then filled with `pad_token_id`. Each token is chosen with `settings` (the
    config's `RowSettings`, NumPy scalars; each row's seed comes from `seed`), `logit_bias` and an n-gram ban of
    `no_repeat_ngram_size`."""

    buffer: np.ndarray
    prompt_mask: np.ndarray
    lengths: np.ndarray
    max_new_tokens: int
    stop_token_ids: np.ndarray
    pad_token_id: int
    strategy: Strategy = Strategy()
    settings: RowSettings = config_settings(GenerationConfig())
    logit_bias: tuple = ()
    no_repeat_ngram_size: int = 0
    seed: int | None = None
    return_scores: bool = False
    vocabulary_size: int = 1

    @classmethod
    def of_prompts(cls, token_ids, padding_mask, vocabulary_size: int, strategy: Strategy, **settings) -> Request:
        """The request of prompts (a list of id lists, or an array with `padding_mask`), checked against
        `vocabulary_size`; `settings`: the other fields."""
        biased = [i for i, _ in settings.get("logit_bias", ()) if i >= vocabulary_size]
        if biased:
            raise InputError(
                f"must name ids in [0, vocabulary_size={vocabulary_size}); received {biased[0]}.", "logit_bias"
            )
        buffer, prompt_mask, lengths = prepare_prompts(
            token_ids, padding_mask, settings["max_new_tokens"], settings["pad_token_id"], vocabulary_size
        )
        if strategy.num_beams == 1 and strategy.num_return_sequences > 1:  # samples: each prompt that many times
            buffer, prompt_mask, lengths = (
                np.repeat(a, strategy.num_return_sequences, axis=0) for a in (buffer, prompt_mask, lengths)
            )
        return cls(buffer, prompt_mask, lengths, strategy=strategy, vocabulary_size=vocabulary_size, **settings)

    @classmethod
    def of_config(cls, token_ids, padding_mask, vocabulary_size: int, config: GenerationConfig, stop_token_ids,
                  pad_token_id: int, return_scores: bool = False) -> Request:  # fmt: skip
        """The request of prompts decoded as `config` says (its strategy, settings, seed and `max_new_tokens`),
        ending at `stop_token_ids` and padded with `pad_token_id`: what every model's `generate` asks for, so
        that a new setting of the config reaches every model through here."""
        return cls.of_prompts(token_ids, padding_mask, vocabulary_size, strategy_of(config),
                              max_new_tokens=config.max_new_tokens, stop_token_ids=stop_token_ids,
                              pad_token_id=pad_token_id, settings=config_settings(config),
                              logit_bias=tuple(config.logit_bias or ()),
                              no_repeat_ngram_size=config.no_repeat_ngram_size, seed=config.seed,
                              return_scores=return_scores)  # fmt: skip

    @property
    def prompt_width(self) -> int:
        """The buffer's columns that hold prompt tokens."""
        return self.buffer.shape[1] - self.max_new_tokens

    @property
    def chooser(self) -> Chooser:
        """What the loop's chooser computes for these settings (not their numbers)."""
        return chooser_of(self.settings, self.no_repeat_ngram_size, biased=bool(self.logit_bias))

    @property
    def compiled_key(self) -> tuple:
        """What the compiled loop is made for (a new value of any of these is another trace): the strategy and
        the chooser, not the numbers, which `batch` gives as tensors (nor the prompts' width: the loop's room)."""
        return (self.strategy, self.chooser, self.return_scores)

    def batch(self, context: tuple = (), columns: int | None = None) -> Batch:
        """The request's tensors as the loop takes them; with `columns`, the buffer and prompt mask padded to
        that many (the loop's room: the columns past a row's end take padding)."""
        stops = self.stop_token_ids if self.stop_token_ids.size else np.array([-1], "int32")
        room = ((0, 0), (0, (columns or self.buffer.shape[1]) - self.buffer.shape[1]))
        return Batch(
            ops.convert_to_tensor(np.pad(self.buffer, room, constant_values=self.pad_token_id)),
            ops.convert_to_tensor(np.pad(self.prompt_mask, room)),
            ops.convert_to_tensor(self.lengths),
            ops.convert_to_tensor(self.max_new_tokens, "int32"),
            ops.convert_to_tensor(stops.astype("int32")),
            ops.convert_to_tensor(self.pad_token_id, "int32"),
            ops.convert_to_tensor(row_seeds(self.seed, self.buffer.shape[0])),
            context,
            call_values(self.settings, self.logit_bias, self.vocabulary_size),
        )


def check_return_scores(owner: str, return_scores, num_beams: int) -> None:
    if not isinstance(return_scores, bool) or (return_scores and num_beams > 1):
        raise InputError(
            f"`return_scores` must be True or False, and True only without beam search (num_beams=1), "
            f"which ranks whole sequences; received return_scores={return_scores!r} with num_beams={num_beams!r}.",
            "return_scores",
            caller=owner,
        )


def call_values(settings: RowSettings, logit_bias, vocabulary_size: int) -> tuple:
    """A call's numbers as a loop reads them (`Batch.values`): `settings`' but the seed, then the bias
    `(vocabulary,)` float32 with `logit_bias`, else `(1,)` zeros."""
    bias = bias_of(logit_bias, vocabulary_size) if logit_bias else np.zeros(1, "float32")
    return tuple(ops.convert_to_tensor(value) for value in (*settings[:-1], bias))
