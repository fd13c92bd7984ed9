"""Random windows of a token sequence, as nanoGPT trains a language model: each batch is `batch_size`
windows of `context + 1` ids at random starts, a pure function of (seed, epoch, step), so that a resumed
run sees the batches the interrupted one would have seen."""

from __future__ import annotations

import numpy as np


class TokenWindows:
    """Batches of `(inputs, next-token targets)` windows of `ids` (an array, or `TokenShards` read from
    disk as each batch asks).

    Example:
    >>> windows = TokenWindows(np.arange(100), context=8, batch_size=4, seed=0)
    >>> x, y = windows.batch(epoch=0, step=0)
    >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())
    ((4, 8), True)
    """

    def __init__(self, ids, context: int, batch_size: int, seed: int):
        self.ids, self.context, self.batch_size, self.seed = ids, context, batch_size, seed

    @property
    def steps_per_pass(self) -> int:
        """Batches that together hold about as many tokens as `ids`."""
        return len(self.ids) // (self.batch_size * self.context)

    def windows(self, count: int, rng: np.random.Generator, rows: slice = slice(None)) -> tuple:
        starts = rng.integers(0, len(self.ids) - self.context - 1, size=count)[rows]  # a process reads only its rows
        batch = np.stack([self.ids[s : s + self.context + 1] for s in starts])
        return batch[:, :-1], batch[:, 1:]

    def batch(self, epoch: int, step: int, rows: slice = slice(None)) -> tuple:
        """The training batch of `(epoch, step)`; `rows`: this process's rows of it."""
        return self.windows(self.batch_size, np.random.default_rng([self.seed, epoch, step]), rows)

    def fixed(self, batches: int) -> tuple:
        """`batches` batches of windows drawn once (validation): the same for every epoch and run."""
        return self.windows(batches * self.batch_size, np.random.default_rng([self.seed, 1 << 30]))
