"""The decoding engine behind the server: one thread owns the model and decodes the waiting jobs, those
that arrived together with the same sampling settings as the rows of one batch (prompts of any lengths,
each cut at its own `max_tokens` and stop strings); streams and seeded jobs decode alone."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading

import numpy as np

from keras_tfm.generation.orchestration import generated_end
from keras_tfm.serve.requests import Job, RequestError


@dataclasses.dataclass
class Choice:
    text: str
    tokens: int
    finish_reason: str


class Ticket:
    """A job in the engine: its events (`("text", piece)`, `("done", [Choice])`, `("error", error)`) arrive
    on an asyncio queue of the server's loop; `cancelled` (a client that left) frees its place."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop):
        self.job, self.loop = job, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = False

    def send(self, kind: str, value) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Engine:
    """Decodes `Ticket`s on its own thread. `max_batch_size` rows at most per batch; `max_queue` jobs
    waiting at most (more are refused with 429, before any work)."""

    def __init__(self, model, max_batch_size: int = 16, max_queue: int = 64, stream_chunk: int = 4):
        self.model, self.max_batch_size, self.max_queue, self.stream_chunk = (
            model,
            max_batch_size,
            max_queue,
            stream_chunk,
        )
        self.stop_ids = [int(i) for i in np.asarray(model._stop_ids(None)).reshape(-1)]
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._condition = threading.Condition()
        self._closed = False
        self.batch_sizes: collections.Counter = collections.Counter()  # rows per batch decoded
        self.streams_left = 0  # streams whose client left before the end
        self._thread = threading.Thread(target=self._run, name="keras_tfm-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Ticket:
        ticket = Ticket(job, asyncio.get_running_loop())
        with self._condition:
            if len(self._waiting) >= self.max_queue:
                raise RequestError(
                    f"the server has {self.max_queue} requests waiting, its limit; try again shortly.",
                    status=429,
                    kind="rate_limit_error",
                )
            self._waiting.append(ticket)
            self._condition.notify()
        return ticket

    def waiting(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify()
        self._thread.join(timeout=30)

    def _next_batch(self) -> list[Ticket] | None:
        """The oldest waiting ticket with every later one that can share its batch."""
        with self._condition:
            while not self._waiting and not self._closed:
                self._condition.wait()
            if self._closed:
                return None
            first = self._waiting.popleft()
            key, batch, rows = first.job.batch_key(), [first], first.job.n
            if key is not None:
                for ticket in list(self._waiting):
                    if ticket.job.batch_key() == key and rows + ticket.job.n <= self.max_batch_size:
                        self._waiting.remove(ticket)
                        batch.append(ticket)
                        rows += ticket.job.n
            return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            batch = [ticket for ticket in batch if not ticket.cancelled]
            if not batch:
                continue
            try:
                if batch[0].job.stream:
                    self._stream(batch[0])
                else:
                    self._decode(batch)
            except Exception as error:  # a fault in one batch answers its requests; the server goes on
                for ticket in batch:
                    ticket.send("error", RequestError(f"decoding failed: {error}", status=500, kind="server_error"))

    def _decode(self, batch: list[Ticket]) -> None:
        job = batch[0].job
        self.batch_sizes[len(batch)] += 1
        sampled = job.temperature > 0
        output = self.model.generate(
            [ticket.job.prompt for ticket in batch],
            max(ticket.job.max_tokens for ticket in batch),
            temperature=job.temperature,
            top_p=job.top_p,
            seed=job.seed,
            repetition_penalty=job.repetition_penalty,
            num_return_sequences=job.n if sampled else 1,
        )
        rows = iter(np.asarray(output))
        for ticket in batch:
            choices = [self._choice(next(rows), ticket.job) for _ in range(ticket.job.n if sampled else 1)]
            ticket.send("done", choices * (1 if sampled else ticket.job.n))

    def _choice(self, row: np.ndarray, job: Job) -> Choice:
        start = len(job.prompt)
        tokens = row[start : generated_end(row, start, job.max_tokens, self.stop_ids)]
        ended = tokens.size > 0 and int(tokens[-1]) in self.stop_ids
        text, stopped = cut_at_stop(self.model._decode_text(tokens), job.stop)
        return Choice(text, int(tokens.size), "stop" if ended or stopped else "length")

    def _stream(self, ticket: Ticket) -> None:
        job, model = ticket.job, self.model
        pieces = model.stream(
            job.prompt,
            job.max_tokens,
            chunk_size=self.stream_chunk,
            temperature=job.temperature,
            top_p=job.top_p,
            seed=job.seed,
            repetition_penalty=job.repetition_penalty,
        )
        tokens, sent, text, finish = [], "", "", "length"
        try:
            for piece in pieces:
                if ticket.cancelled:
                    self.streams_left += 1
                    return
                tokens += [int(i) for i in np.asarray(piece).reshape(-1)]
                text, stopped = cut_at_stop(model._decode_text(tokens), job.stop)
                ended = stopped or any(token in self.stop_ids for token in tokens)
                # hold back what could still become a stop string, and a character cut mid-way
                safe = len(text) if ended else max(len(text) - max(map(len, job.stop), default=1) + 1, 0)
                safe = safe if ended or not text.endswith("\ufffd") else min(safe, len(text) - 1)
                if safe > len(sent):
                    ticket.send("text", text[len(sent) : safe])
                    sent = text[:safe]
                if ended:
                    finish = "stop"
                    break
        finally:
            pieces.close()
        if len(text) > len(sent) and finish == "length":
            ticket.send("text", text[len(sent) :])
        ticket.send("done", [Choice(text, len(tokens), finish)])


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to the first of the stop strings (which is left out), and whether one was found."""
    cuts = [index for index in (text.find(stop) for stop in stops) if index >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)
