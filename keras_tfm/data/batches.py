"""Batches as a pure function of (seed, epoch, step), so that a resumed run sees exactly the batches
the interrupted one would have seen."""

from __future__ import annotations

import numpy as np

from keras_tfm.errors import DataError


class EpochBatches:
    """The rows of each training batch: every epoch visits the `count` rows in its own shuffled order
    (seeded by `seed` and the epoch), in consecutive slices of `batch_size`; a slice that runs past
    the end wraps around to the start of that order, so every batch has `batch_size` rows (one
    compiled training step). `arrange(order)` may reorder each epoch's permutation (the translator
    sorts runs of batches by length).

    Example:
    >>> rows = EpochBatches(count=10, batch_size=4, seed=0)
    >>> rows(epoch=0, step=2)  # the last two rows of epoch 0's order, then its first two
    array([8, 1, 4, 6])
    """

    def __init__(self, count: int, batch_size: int, seed, arrange=None):
        if count < 1 or batch_size < 1:
            raise DataError(
                f"count and batch_size must be >= 1; received {count}, {batch_size}.", caller="EpochBatches"
            )
        self.count, self.batch_size = count, batch_size
        self.seed = list(np.atleast_1d(seed))
        self.arrange = arrange
        self._order: tuple[int, np.ndarray] | None = None  # the last epoch's order: each step of it reads it

    def order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            order = np.random.default_rng([*self.seed, epoch]).permutation(self.count)
            self._order = (epoch, order if self.arrange is None else self.arrange(order))
        return self._order[1]

    def __call__(self, epoch: int, step: int) -> np.ndarray:
        order = self.order(epoch)
        rows = order[(step * self.batch_size) % self.count :][: self.batch_size]
        if len(rows) < self.batch_size:
            rows = np.concatenate([rows, order[: self.batch_size - len(rows)]])
        return rows
