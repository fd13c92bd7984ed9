"""What the engine gives a request: its `Ticket` (the events a handler awaits), the `Row` of each of its
continuations, and the `Choice`s and `Logprob`s of its answer; and a prompt's own log-probabilities (`echo`)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import NamedTuple

import numpy as np
from keras import ops

from keras_tfm.generation import continuous
from keras_tfm.generation.grammar import Constraint
from keras_tfm.generation.text import TextDecoder
from keras_tfm.serve.compiled_shapes import cache_length
from keras_tfm.serve.requests import Job


@dataclasses.dataclass
class Choice:
    text: str
    tokens: int
    finish_reason: str
    logprobs: list | None = None  # with the job's `logprobs`: a `Logprob` per token


class Logprob(NamedTuple):
    """One token's log-probability, and the job's number of likeliest alternatives with theirs (None for
    a prompt's first token, which nothing predicts)."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] | None


class Ticket:
    """A job in the engine: its events (`("text", (row, piece, [Logprob]))`: the text of its `row`-th
    continuation, `("done", [Choice])`, `("error", error)`) arrive
    on an asyncio queue of the server's loop; `cancelled` (a client that left) frees its rows."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop):
        self.job, self.loop = job, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self.failed = False  # answered with an error already
        self.rows: list[Row] = []

    def send(self, kind: str, value) -> None:
        if not self.loop.is_closed():  # a server already gone has no one to tell
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


@dataclasses.dataclass(eq=False)  # rows are found in the slots by identity
class Row:
    """One continuation of a ticket in a row of the cache: its `TextDecoder` (its tokens and text so far)
    and how it ended."""

    ticket: Ticket
    decoder: TextDecoder
    finish: str | None = None
    logprobs: list[Logprob] = dataclasses.field(default_factory=list)
    sent: int = 0  # the logprobs a stream has had
    constraint: Constraint | None = None  # the grammar its reply follows, a step at a time


def prompt_logprobs(model, prompt: list[int], top: int) -> list[Logprob]:
    """The prompt's tokens with their log-probabilities given the tokens before (the first's None), and
    the `top` likeliest at each position, by one forward pass (completions' `echo` with `logprobs`)."""
    ids = np.zeros((1, cache_length(len(prompt), model.max_length)), "int32")  # a few shapes: a compile each
    ids[0, : len(prompt)] = prompt  # right padding: causal attention keeps it from the real positions
    entries = [Logprob(prompt[0], None, None)]
    if len(prompt) > 1:
        logits = model(ops.convert_to_tensor(ids))[0, : len(prompt) - 1]
        chosen = ops.convert_to_tensor(np.asarray(prompt[1:], "int32"))
        picked, ids, values = (
            ops.convert_to_numpy(part) for part in continuous.logprobs_of(logits, chosen, max(top, 1))
        )
        for i, token in enumerate(prompt[1:]):
            entries.append(Logprob(token, float(picked[i]), list(zip(ids[i, :top].tolist(), values[i, :top].tolist()))))
    return entries
