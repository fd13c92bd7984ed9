"""The decoding engine behind the server: one thread owns the model and decodes the waiting jobs, those
that arrived together with the same sampling settings as the rows of one batch (prompts of any lengths,
each cut at its own `max_tokens` and stop strings); streams and seeded jobs decode alone.

Every decoding loop is compiled for its shapes, so a batch is padded to a few sizes (`bucket`): rows to
a power of two, the prompts' width and the room for new tokens to a multiple of 32. A server then
compiles a handful of loops in its first minutes instead of one for nearly every batch, and each row
still stops at its own `max_tokens`."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading

import numpy as np

from keras_tfm.generation import orchestration
from keras_tfm.generation.orchestration import generated_end
from keras_tfm.generation.request import Request, Strategy
from keras_tfm.generation.sampling import LogitsControls, Sampler
from keras_tfm.serve.requests import Job, RequestError

WIDTH_STEP = 32  # prompt widths and rooms for new tokens are padded to multiples of this


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
        self.shapes: collections.Counter = collections.Counter()  # (rows, prompt width, room) decoded
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
        copies = job.n if job.temperature > 0 else 1
        output, _ = orchestration.run(self.model, self._request([t.job for t in batch], copies))
        rows = iter(np.asarray(output))
        for ticket in batch:
            choices = [self._choice(next(rows), ticket.job) for _ in range(copies)]
            ticket.send("done", choices * (1 if copies > 1 else ticket.job.n))

    def _request(self, jobs: list[Job], copies: int = 1) -> Request:
        """The jobs' prompts as one `Request` of bucketed shapes (`bucket`), `copies` rows each; rows added
        to fill the bucket repeat the first prompt for one token, and are dropped after."""
        rows = bucket(len(jobs), self.max_batch_size // copies, power_of_two=True)
        prompts = [job.prompt for job in jobs] + [jobs[0].prompt] * (rows - len(jobs))
        limits = [job.max_tokens for job in jobs] + [1] * (rows - len(jobs))
        width, room = max(map(len, prompts)), max(limits)
        room = bucket(room, self.model.max_length - width)  # the checked width + max_tokens fit the context
        width = bucket(width, self.model.max_length - room)
        ids = np.zeros((rows, width), "int32")
        for row, prompt in zip(ids, prompts):
            row[: len(prompt)] = prompt
        self.shapes[(rows * copies, width, room)] += 1
        job = jobs[0]
        sampler = Sampler(temperature=job.temperature, top_p=job.top_p if job.temperature > 0 else 1.0)
        return Request.of_prompts(
            ids,
            np.arange(width)[None] < np.array([len(p) for p in prompts])[:, None],
            self.model.vocabulary_size,
            Strategy(sampler, num_return_sequences=copies),
            max_new_tokens=room,
            stop_token_ids=np.asarray(self.stop_ids, "int32"),
            pad_token_id=self.model._pad_id(None),
            controls=LogitsControls(repetition_penalty=job.repetition_penalty),
            seed=job.seed,
            row_max_new_tokens=np.repeat(np.array(limits, "int32"), copies),
        )

    def _choice(self, row: np.ndarray, job: Job) -> Choice:
        start = len(job.prompt)
        tokens = row[start : generated_end(row, start, job.max_tokens, self.stop_ids)]
        ended = tokens.size > 0 and int(tokens[-1]) in self.stop_ids
        text, stopped = cut_at_stop(self.model._decode_text(tokens), job.stop)
        return Choice(text, int(tokens.size), "stop" if ended or stopped else "length")

    def _stream(self, ticket: Ticket) -> None:
        job, model = ticket.job, self.model
        pieces = orchestration.stream_pieces(model, self._request([job]), self.stream_chunk, False, model._decode_text)
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


def bucket(size: int, limit: int, power_of_two: bool = False) -> int:
    """`size` rounded up to a power of two, or to a multiple of `WIDTH_STEP`, but not past `limit`
    (and never below `size`)."""
    rounded = 1 << (size - 1).bit_length() if power_of_two else -(-size // WIDTH_STEP) * WIDTH_STEP
    return max(size, min(rounded, limit))
