"""The run's progress in one line: steps done of all, time elapsed and an estimate of the time left.

Keras' own progress is per epoch (a bar, or a line at its end); this line speaks of the whole run. It is
printed between epochs (after Keras' epoch line, never inside a bar) and at the end, and, with a line
per epoch (`verbose=2`, the default off a terminal), also every `every_seconds` within an epoch.
"""

from __future__ import annotations

import time

import keras

from keras_tfm.training.distribute import log


def duration(seconds: float) -> str:
    """`seconds` as "45 s", "12 min 5 s" or "2 h 3 min"."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class Progress(keras.callbacks.Callback):
    """Prints "step 400/6,535 (6%), 1 min 20 s elapsed, about 21 min left" as the run goes.

    Args:
        total_steps: the run's optimizer steps, those of earlier (resumed) runs included.
        done_steps: the steps done before this run started.
        verbose: Keras' `verbose` of the run: 0 prints nothing, 2 also prints within epochs.
        every_seconds: how often to print within an epoch with `verbose=2`.
    """

    def __init__(self, total_steps: int, done_steps: int = 0, verbose: int = 2, every_seconds: float = 60.0):
        super().__init__()
        self.total, self.done, self.verbose, self.every = total_steps, done_steps, verbose, every_seconds
        self.start = self.first_step_end = self.last_print = None
        self.steps_this_run = 0
        self.pending = False

    def line(self) -> str:
        now = time.monotonic()
        text = f"step {self.done:,}/{self.total:,} ({100 * self.done // max(self.total, 1)}%), "
        text += f"{duration(now - self.start)} elapsed"
        timed = self.steps_this_run - 1  # the first step compiles: the rate is measured after it
        if timed > 0 and self.done < self.total:
            left = (self.total - self.done) * (now - self.first_step_end) / timed
            text += f", about {duration(left)} left"
        return text

    def _print(self) -> None:
        self.last_print, self.pending = time.monotonic(), False
        log(self.line())

    def on_train_begin(self, logs=None):
        if self.start is None:  # a run's resumed part is fitted in a call of its own; the clock runs on
            self.start = self.last_print = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        self.steps_this_run += 1
        if self.steps_this_run == 1:
            self.first_step_end = time.monotonic()
        if self.verbose == 2 and time.monotonic() - self.last_print >= self.every:
            self._print()

    def on_epoch_end(self, epoch, logs=None):
        self.pending = self.verbose > 0  # printed once Keras has printed the epoch's own line

    def on_epoch_begin(self, epoch, logs=None):
        if self.pending:
            self._print()

    def on_train_end(self, logs=None):
        if self.pending:
            self._print()
