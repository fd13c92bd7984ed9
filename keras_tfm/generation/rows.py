"""The state of a batch's rows between two chunks of the row loop (`continuous.decode_chunk`): the key/value
cache, each row's seen tokens and what its `Loop` carries (`continuous.Rows`: stops, limits, history, context)
on the device; each row's next token, position, sampling settings and the prompt tokens it feeds on the host.
The server's engine, `stream` and `generate`'s constrained rows keep one `RowState` each and move it the same
way: `start` a row, `admit` its prefilled prompt, run a chunk on `chunk_inputs`, `advance` by what it
generated."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from keras import ops

from keras_tfm.generation import continuous
from keras_tfm.generation.continuous import NO_ROWS, Rows


class RowState:
    """Rows of a key/value `cache` (and their `seen` tokens), every row free (greedy settings, nothing fed);
    chunks of up to `steps` steps feed prompt tokens. `carried`: what the chunk's `Loop` reads beside (its
    `Rows`; none for the server's). `RowState.empty` makes the cache."""

    def __init__(self, cache, seen, steps: int, carried: Rows = NO_ROWS):
        self.cache, self.seen, self.steps = cache, seen, steps  # `seen`: `sampling.seen_counted`
        self.carried = carried
        rows = int(cache[0].shape[0])
        self.tokens, self.positions = np.zeros(rows, "int32"), np.zeros(rows, "int32")  # what each row feeds next
        self.settings = continuous.idle_settings(rows)  # `continuous.RowSettings` columns
        self.fed = continuous.nothing_fed(rows, steps)  # prompt tokens each row feeds in the next chunk
        self.made = np.zeros(rows, "int32")  # the new tokens each row has taken
        self.first = np.zeros(rows, bool)  # rows started since the last chunk: their first token comes next
        self.running = steps  # the steps of the chunk `chunk_inputs` last gave the inputs of

    @classmethod
    def empty(cls, model, rows: int, length: int, steps: int, carried: Rows = NO_ROWS) -> RowState:
        """`rows` free rows of an empty cache of `length` positions."""
        seen = ops.zeros((rows, model.decoding_vocabulary_size), "int32")
        return cls(model.empty_cache(rows, length), seen, steps, carried)

    @property
    def rows(self) -> int:
        return len(self.tokens)

    @property
    def length(self) -> int:
        return int(self.cache[0].shape[3])

    def start(self, row: int, prompt, prefilled: int, settings: Sequence, first: int | None = None) -> None:
        """Row `row` decodes `prompt` with `settings` (its `RowSettings` values, `sampling.row_values`), its
        first `prefilled` positions in the cache (`admit`): its first step feeds the prompt's token after them,
        the next steps the rest of it. Or, with its `first` new token (chosen from the prefill of the whole
        prompt, `continuous.first_tokens`), its first step feeds that token after the prompt."""
        if first is not None:
            self.tokens[row], self.positions[row] = first, len(prompt)
            self.fed[1][row], self.made[row], self.first[row] = 0, 1, False
        else:
            self.tokens[row], self.positions[row] = prompt[prefilled], prefilled
            rest = prompt[prefilled + 1 :]
            self.fed[0][row, : len(rest)], self.fed[1][row], self.made[row] = rest, len(rest), 0
            self.first[row] = True
        for setting, value in zip(self.settings, settings, strict=True):
            setting[row] = value

    def admit(self, filled, sources: list[int], rows: list[int], seen_rows: np.ndarray) -> None:
        """Rows `rows` of the cache hold rows `sources` of the prefilled cache `filled`, and have seen
        `seen_rows` (`continuous.admit`)."""
        self.cache, self.seen = continuous.admit(self.cache, self.seen, filled, sources, rows, seen_rows)

    def chunk_inputs(self, steps: int, bias=()) -> tuple:
        """`decode_chunk`'s inputs: `(cache, tokens, positions, seen, settings, fed[, bias][, carried])` (`bias`
        where given, `carried` where the loop reads any). The chunk runs `steps` steps, or, where a row has just
        started, only until its first new token (`running`)."""
        self.running = steps
        if self.first.any():
            self.running = min(steps, int(self.fed[1][self.first].max()) + 1)
        settings = continuous.RowSettings(*(ops.convert_to_tensor(setting) for setting in self.settings))
        fed = (ops.convert_to_tensor(self.fed[0][:, :steps]), ops.convert_to_tensor(self.fed[1]),
               ops.convert_to_tensor(self.made), ops.convert_to_tensor(np.array(self.running, "int32")))  # fmt: skip
        tokens, positions = ops.convert_to_tensor(self.tokens), ops.convert_to_tensor(self.positions)
        biased = () if isinstance(bias, tuple) else (bias,)
        extra = biased if self.carried is NO_ROWS else (bias, self.carried)
        return self.cache, tokens, positions, self.seen, settings, fed, *extra

    def advance(self, cache, seen, generated: np.ndarray, history=()) -> tuple[np.ndarray, np.ndarray]:
        """The state after a chunk that returned `cache`, `seen`, `generated` `(rows, steps)` (and the rows'
        `history`, where the loop keeps it): each row feeds its last token next, the chunk's `running` positions
        on (a row past the cache's end stays at its last). Returns the columns of `generated` the chunk ran, and
        how many of their first tokens each row took from its prompt (not chosen)."""
        generated = generated[:, : self.running]
        if not isinstance(history, tuple):
            self.carried = self.carried._replace(history=history)
        fed = self.fed[1]
        self.first[:] = False
        self.made = (self.made + generated.shape[1] - fed).astype("int32")
        self.cache, self.seen = cache, seen
        self.fed = continuous.nothing_fed(self.rows, self.steps)
        self.tokens = generated[:, -1].astype("int32")
        self.positions = np.minimum(self.positions + generated.shape[1], self.length - 1).astype("int32")
        return generated, fed

    def free(self, row: int) -> None:
        """Row `row` ended: what it computes from now on is dropped."""
        self.tokens[row] = self.positions[row] = 0
        self.first[row] = False

    def resized(self, busy: list[int], rows: int, length: int) -> RowState:
        """A state of `rows` rows and `length` positions whose first rows are the rows `busy` of this one
        (the others free). Nothing is fed: a chunk ran since any row started. (The server's: it carries no
        `Rows`.)"""
        # the free rows filled with copies of a busy one (admission overwrites them): one shape of copies per
        # pair of cache shapes, not one per count of busy rows
        kept = busy + busy[-1:] * (rows - len(busy))
        state = RowState(*continuous.resized(self.cache, self.seen, kept, rows, length), self.steps)
        for new, old in zip([state.tokens, state.positions, state.made, *state.settings],
                            [self.tokens, self.positions, self.made, *self.settings]):  # fmt: skip
            new[: len(busy)] = old[busy]
        return state
