"""The decoding engine behind the server, with continuous batching: one thread owns the model and a
key/value cache of a few rows (slots). Between two chunks of `chunk_steps` decoding steps, waiting
requests are prefilled into free rows and join the batch, whatever their prompt lengths and sampling
settings, and requests that ended (a stop token or string, their `max_tokens`, a client that left) give
their rows back. Streams get their text after every chunk.

Every compiled loop is for one cache shape, so the cache keeps a few shapes: rows 1, 4, 16, ... (up to
`max_batch_size`), length a power of two from 32 (up to the context; several prompts' prefill widths alike: a
request alone is prefilled whole, up to 64 tokens at the next multiple of 8, and takes its first token from the
prefill, one beside rows decoding leaves its prompt's last few tokens to its first chunk), grown when a
request needs more and shrunk when the rows that are left fit a smaller one that is compiled. A request
that needs a shape not compiled yet waits while it compiles on another thread (`compiled_shapes`), and
the rows decoding go on. The device side is `generation.continuous`; this file keeps the books."""

from __future__ import annotations

import asyncio
import collections
import random
import threading
from collections.abc import Callable

import numpy as np
from keras import ops

from keras_tfm import compat
from keras_tfm.convert.variables import return_freed_memory
from keras_tfm.generation import continuous
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.grammar import Constraint
from keras_tfm.generation.rows import RowState
from keras_tfm.generation.sampling import bias_of, features_of, row_seeds, row_values, tracks_seen
from keras_tfm.generation.text import TextDecoder
from keras_tfm.serve.compiled_shapes import CompiledShapes, cache_length, prefill_length, rows_bucket, warm_up_plan
from keras_tfm.serve.requests import Job, RequestError
from keras_tfm.serve.tickets import Choice, Logprob, Row, Ticket
from keras_tfm.serve.workers import close_at_exit


class Engine:
    """Decodes `Ticket`s on its own thread. `max_batch_size` rows at most decode together; `max_queue` jobs
    waiting at most (more are refused with 429, before any work); `chunk_steps` steps between two
    chances to join or leave. The thread compiles every shape requests of up to `warm_up_length` positions
    use, for greedy rows and rows of each of `warm_up_configs`, telling `progress` after each: those of one
    row first, then `ready` is set and it serves while the others compile beside."""

    def __init__(
        self,
        model,
        max_batch_size: int = 16,
        max_queue: int = 64,
        chunk_steps: int = 4,
        warm_up_length: int = 0,
        warm_up_configs: tuple[GenerationConfig, ...] = (),
        progress: Callable[[str], None] | None = None,
    ):
        self.model, self.max_batch_size, self.max_queue, self.chunk_steps = (
            model,
            max_batch_size,
            max_queue,
            chunk_steps,
        )
        model.compiled_decoding()  # the cache's shape is read from the built layers
        self.compiled = CompiledShapes(model)
        self.ready = threading.Event()
        features = [_settings_features([config]) for config in (GenerationConfig(), *warm_up_configs)]
        self._warm_up = (
            warm_up_plan(model, max_batch_size, warm_up_length, features, chunk_steps) if warm_up_length else ([], [])
        )
        self._progress = progress
        self.stop_ids = {int(i) for i in np.asarray(model.stop_ids()).reshape(-1)}
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._condition = threading.Condition()
        self._closed = self._draining = False
        self._slots: list[Row | None] = []
        self._state: RowState | None = None  # the rows' cache, tokens, positions and settings
        self.rows_per_chunk: collections.Counter = collections.Counter()  # busy rows in each chunk decoded
        self.shapes: collections.Counter = collections.Counter()  # (rows, length) of each chunk decoded
        self.joined_running = 0  # requests that joined rows already decoding
        self.clients_left = 0  # requests whose client left before the end
        self._thread = threading.Thread(target=self._run, name="keras_tfm-engine", daemon=True)
        self._thread.start()
        close_at_exit(self)

    def submit(self, job: Job) -> Ticket:
        if _rows_of(job) > self.max_batch_size:  # it would wait for rows that never come
            name = "best_of" if job.best_of > job.n else "n"
            raise RequestError(
                f"`{name}` must be at most {self.max_batch_size} (the server's `max_batch_size`) when sampling; "
                f"received {_rows_of(job)}.",
                name,
            )
        ticket = Ticket(job, asyncio.get_running_loop())
        with self._condition:
            if self._closed or self._draining:
                raise RequestError("the server is shutting down.", status=503, kind="server_error")
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

    def busy_rows(self) -> list[int]:
        """The rows of the cache decoding a request now."""
        return self._busy()

    def drain(self) -> None:
        """The server's shutdown began: the requests waiting get a 503 error now, new ones are refused, and
        the rows decoding go on to their end (or to `close`)."""
        with self._condition:
            self._draining, waiting = True, list(self._waiting)
            self._waiting.clear()
        for ticket in waiting:
            ticket.send("error", RequestError("the server shut down before answering.", None, 503, "server_error"))

    def close(self) -> None:
        """Stops after the chunk being decoded; the requests not yet answered get a 503 error."""
        with self._condition:
            self._closed = True
            self._condition.notify()
        self.compiled.close()
        self._thread.join(timeout=30)
        with self._condition:
            unanswered = list(self._waiting) + list({row.ticket: None for row in self._slots if row is not None})
            self._waiting.clear()
        for ticket in unanswered:
            ticket.send("error", RequestError("the server shut down before answering.", None, 503, "server_error"))

    def _busy(self) -> list[int]:
        return [slot for slot, row in enumerate(self._slots) if row is not None]

    def _next_tickets(self) -> list[Ticket] | None:
        """The waiting tickets whose rows fit beside the busy ones, oldest first (waits while there is
        nothing to do); None once the engine is closed. Going idle, it first hands what the answered requests
        freed back to the system (the C library would keep it: 1.4 GB more after 64 requests on JAX)."""
        with self._condition:
            idle = not self._waiting and not self._busy() and not self._closed
        if idle:
            return_freed_memory()
        with self._condition:
            while not self._waiting and not self._busy() and not self._closed:
                self._condition.wait()
            if self._closed:
                return None
            free, taken = self.max_batch_size - len(self._busy()), []
            while self._waiting and _rows_of(self._waiting[0].job) <= free:
                ticket = self._waiting.popleft()
                if ticket.cancelled:  # its client left while it waited
                    self.clients_left += 1
                    continue
                taken.append(ticket)
                free -= _rows_of(ticket.job)
            return taken

    def _run(self) -> None:
        compat.torch_parallel_here()
        first, beside = self._warm_up  # what one row needs, then ready: the rest compiles beside the rows
        try:
            self.compiled.warm_up(first, self._progress, lambda: self._closed)
        except Exception as error:  # shapes that did not compile compile when first used
            if self._progress is not None:
                self._progress(f"warm-up failed: {error}")
        self.ready.set()
        if not self._closed:
            self.compiled.compile_later(beside, self._progress)
        while (tickets := self._next_tickets()) is not None:
            self.compiled.settle()
            if tickets:
                try:
                    if not self._admit(tickets):  # their shapes compile beside the rows decoding
                        with self._condition:
                            self._waiting.extendleft(reversed(tickets))
                except Exception as error:  # a fault answers the requests it touched; the server goes on
                    self._fail(tickets, error)
            if self._busy():
                try:
                    self._advance()
                except Exception as error:
                    self._fail({row.ticket for row in self._slots if row is not None}, error)
                    self._slots, self._state = [], None

    def _fail(self, tickets, error: Exception) -> None:
        for ticket in tickets:
            for row in ticket.rows:
                if row in self._slots:
                    self._slots[self._slots.index(row)] = None
            ticket.send("error", RequestError(f"decoding failed: {error}", status=500, kind="server_error"))

    def _admit(self, tickets: list[Ticket]) -> bool:
        """Prefills the tickets' prompts and writes them into free rows (the cache grown if it must be); a row
        whose prompt the prefill holds whole takes its first token from it. False, with nothing done, while a
        shape this needs compiles beside the rows decoding."""
        busy, jobs = self._busy(), [t.job for t in tickets]
        rows = len(busy) + sum(_rows_of(job) for job in jobs)
        length = max([len(job.prompt) + job.max_tokens for job in jobs] + self._lengths_needed())
        prompts = [job.prompt for job in jobs]
        chunk = _chunk_key(self._jobs(busy) + jobs, self.chunk_steps)
        shape = self._shape(rows, length, chunk)
        count = rows_bucket(len(prompts), self.max_batch_size)
        # alone, a prompt's first token comes soonest from a prefill of all of it; beside rows decoding, its
        # last few tokens ride along the chunk they run anyway
        width = self._prefill_width(prompts, chunk[2] if busy else 0, shape[1])
        prefill = (("prefill",), (count, self.compiled.prefill_width(count, width, shape[1])))
        prefilled = [min(len(prompt), prefill[1][1]) for prompt in prompts]
        first = self._first_key(jobs) if any(size == len(p) for size, p in zip(prefilled, prompts)) else None
        written = ("admit", (count, cache_length(prefill[1][1], self.model.max_length))), shape  # the prefill's cache
        if busy:
            wanted = [prefill, written, *[first] * (first is not None)]
            wanted += [(chunk, shape)] * (self.compiled.usable_chunk(*chunk[1:], shape) is None)
            if not self.compiled.available(wanted):
                return False
            self.joined_running += len(tickets)
        elif self.compiled.usable_chunk(*chunk[1:], shape) is None:  # before the first token: the next waits on it
            self.compiled.compile(chunk, shape)
            self.compiled.ready.add((chunk, shape))
        self._reshape(*shape)
        ids, last = np.zeros(prefill[1], "int32"), np.zeros(count, "int32")
        for row, prompt, size in zip(ids, prompts, prefilled):
            row[:size] = prompt[:size]
        last[: len(prompts)] = np.asarray(prefilled) - 1
        filled, logits = self.compiled.call(*prefill, bool(busy), *(ops.convert_to_tensor(x) for x in (ids, last)))
        new, sources, seeds = self._new_rows(tickets)
        whole = [prefilled[source] == len(prompts[source]) for source in sources]
        seen_rows = np.zeros((len(new), self.model.decoding_vocabulary_size), "int32")
        for index, source in enumerate(sources):
            seen_rows[index, prompts[source]] = 1  # seen in the prompt, not generated
        chosen, scores = np.zeros(len(new), "int32"), None
        if first is not None:
            chosen, scores = self._first_tokens(first, bool(busy), new, logits, sources, seeds, seen_rows)
        slots = [slot for slot, row in enumerate(self._slots) if row is None][: len(new)]
        for index, (slot, row, source) in enumerate(zip(slots, new, sources)):
            self._slots[slot] = row
            settings = row_values(row.ticket.job.config, seeds[index])
            self._state.start(
                slot, prompts[source], prefilled[source], settings, chosen[index] if whole[index] else None
            )
            seen_rows[index, chosen[index]] += 2 * whole[index]  # its first token, generated
        # as many writes as the cache has rows (the last one repeated): one shape of writes per cache shape,
        # which the warm-up compiles, not one per count of new rows
        extra = len(self._slots) - len(slots)
        rows = (sources + sources[-1:] * extra, slots + slots[-1:] * extra)
        self._state.admit(filled, *rows, np.concatenate([seen_rows, np.repeat(seen_rows[-1:], extra, axis=0)]))
        self.compiled.ready.add(written)
        for index in np.flatnonzero(whole):
            taken = None if scores is None else [part[index : index + 1] for part in scores]
            self._took(slots[index], chosen[index : index + 1], taken)
        return True

    def _new_rows(self, tickets: list[Ticket]) -> tuple[list[Row], list[int], list[int]]:
        """The tickets' new rows (a row per continuation), the ticket (its prompt) of each, and each one's seed."""
        rows, sources, seeds = [], [], []
        for source, ticket in enumerate(tickets):
            job = ticket.job
            seeded = row_seeds(random.getrandbits(32) if job.config.seed is None else job.config.seed, _rows_of(job))
            for copy in range(_rows_of(job)):
                constraint = None if job.grammar is None else Constraint(self.model, job.grammar)
                ticket.rows.append(Row(ticket, self._decoder(job), constraint=constraint))
                rows.append(ticket.rows[-1])
                sources.append(source)
                seeds.append(int(seeded[copy]))
        return rows, sources, seeds

    def _first_key(self, jobs: list[Job]) -> tuple:
        """`(("first", features), shape)`: the function that chooses the first tokens of the rows of `jobs`."""
        count = rows_bucket(sum(_rows_of(job) for job in jobs), self.max_batch_size)
        features = _settings_features([job.config for job in jobs], jobs)
        return ("first", self.compiled.usable_first(features, count) or features), (count, 0)

    def _first_tokens(self, first: tuple, others_wait: bool, rows: list[Row], logits, sources, seeds, seen_rows):
        """`(chosen, scores)`: each new row's first token, chosen from the `logits` of its prompt's (`sources`:
        their rows) last token (`continuous.first_tokens`), with its seed; with log-probabilities, their
        `(picked, top ids, top values)` (else None)."""
        (key, shape), count = first, first[1][0]
        extra = count - len(rows)
        configs = [row.ticket.job.config for row in rows]
        settings = continuous.settings_of(configs, seeds)
        settings = [
            np.concatenate([column, idle[:extra]]) for column, idle in zip(settings, continuous.idle_settings(count))
        ]
        positions = [len(row.ticket.job.prompt) - 1 for row in rows] + [0] * extra  # its last prompt token's
        seen = seen_rows if tracks_seen(key[1]) else np.zeros((len(rows), 1), "int32")
        rows_bias = [self._row_bias(row) for row in rows] if key[1].biased else ()
        chosen, *scores = self.compiled.call(
            key,
            shape,
            others_wait,
            # gathered on the host: one program per count of new rows, and no eager operation to compile (JAX)
            ops.convert_to_tensor(ops.convert_to_numpy(logits)[sources + sources[-1:] * extra]),
            ops.convert_to_tensor(np.concatenate([seen, np.repeat(seen[-1:], extra, axis=0)])),
            continuous.RowSettings(*(ops.convert_to_tensor(column) for column in settings)),
            ops.convert_to_tensor(np.asarray(positions, "int32")),
            *([ops.convert_to_tensor(np.stack(rows_bias + rows_bias[-1:] * extra))] if key[1].biased else []),
        )
        scores = [ops.convert_to_numpy(part) for part in scores[0]] if scores else None
        return ops.convert_to_numpy(chosen).astype("int32"), scores

    def _prefill_width(self, prompts: list[list[int]], steps: int, length: int) -> int:
        """The prefill's width for `prompts` before a chunk of `steps` steps: the fewest positions after
        which each prompt has at most `steps` tokens left, which the chunk feeds (`RowState.start`). So beside
        rows decoding, a prompt of 34 tokens (a start token, a word mark and 32 more) fills a width of 32, not
        64; with `steps` 0, every prompt whole (one of up to 16 tokens alone: 16 wide)."""
        size = max(len(prompt) - steps for prompt in prompts)
        return min(prefill_length(size, self.model.max_length, len(prompts)), length)

    def _jobs(self, slots: list[int]) -> list[Job]:
        return [self._slots[slot].ticket.job for slot in slots]

    def _lengths_needed(self) -> list[int]:
        return [len(row.ticket.job.prompt) + row.ticket.job.max_tokens for row in self._slots if row is not None]

    def _length(self) -> int:
        return 0 if self._state is None else self._state.length

    def _shape(self, rows: int, length: int, chunk: tuple) -> tuple[int, int]:
        """The fewest rows and positions of the bucketed shapes that hold `rows` rows of `length` positions; or,
        while that shape's `chunk` is not compiled, the smallest larger one where it is (the warm-up compiles
        the smaller ones beside, and a row decodes alike in a longer cache)."""
        shape = self._bucketed(rows, length)
        if self.compiled.usable_chunk(*chunk[1:], shape) is None:
            return self.compiled.holding(*chunk[1:], shape) or shape
        return shape

    def _bucketed(self, rows: int, length: int) -> tuple[int, int]:
        return rows_bucket(rows, self.max_batch_size), cache_length(length, self.model.max_length)

    def _reshape(self, rows: int, length: int) -> None:
        """The cache in shape `(rows, length)` (bucketed); the busy rows move to its first rows."""
        if (rows, length) == (len(self._slots), self._length()):
            return
        busy = self._busy()
        if self._state is None or not busy:
            self._state = RowState.empty(self.model, rows, length, self.chunk_steps)
        else:
            self._state = self._state.resized(busy, rows, length)
        self._slots = [self._slots[slot] for slot in busy] + [None] * (rows - len(busy))

    def _advance(self) -> None:
        """One chunk of steps for every row; then each busy row takes its new tokens, and the rows that
        ended are given back."""
        busy = self._busy()
        shape = (len(self._slots), self._length())
        _, features, steps = _chunk_key(self._jobs(busy), self.chunk_steps)
        features = self.compiled.usable_chunk(features, steps, shape) or features
        bias = self._bias(busy, features.biased)
        self.shapes[shape] += 1
        self.rows_per_chunk[len(busy)] += 1
        others_wait = any(self._slots[slot].decoder.tokens for slot in busy)
        cache, seen, generated, *scores = self.compiled.call(
            ("chunk", features, steps),
            shape,
            others_wait,
            *self._state.chunk_inputs(steps, () if bias is None else ops.convert_to_tensor(bias)),
        )
        generated, fed = self._state.advance(cache, seen, ops.convert_to_numpy(generated))
        scores = [ops.convert_to_numpy(part)[:, : generated.shape[1]] for part in scores[0]] if scores else None
        for slot in busy:
            new = slice(fed[slot], None)  # after the prompt's tokens the chunk fed
            self._took(slot, generated[slot, new], None if scores is None else [part[slot, new] for part in scores])
        if busy := self._busy():  # the smallest cache whose loop is compiled; the smallest at all compiles beside
            chunk = _chunk_key(self._jobs(busy), self.chunk_steps)
            fewest = self._bucketed(len(busy), max(self._lengths_needed()))
            if self.compiled.usable_chunk(*chunk[1:], fewest) is None:
                self.compiled.available([(chunk, fewest)])
            self._reshape(*self._shape(len(busy), max(self._lengths_needed()), chunk))
        # a row alone is kept while idle: the next request alone is written into it (admission overwrites the
        # whole row), not into a new cache (5-10 ms of zeros before its first token on JAX)
        elif len(self._slots) > 1:
            self._slots, self._state = [], None

    def _took(self, slot: int, generated: np.ndarray, scores: list | None) -> None:
        """The row in `slot` takes its `generated` tokens (`_take`), and gives its row back if it ended."""
        row = self._slots[slot]
        self._take(row, generated, scores)
        if row.finish is not None:
            self._slots[slot] = None
            self._state.free(slot)
            self._finish(row.ticket)

    def _bias(self, busy: list[int], biased: bool) -> np.ndarray | None:
        """`(rows, vocabulary)`: what each row's `logit_bias` and grammar add to its scores (zeros for
        those without); None where the chunk is not `biased`."""
        if not biased:
            return None
        bias = np.zeros((len(self._slots), self.model.decoding_vocabulary_size), "float32")
        for slot in busy:
            bias[slot] = self._row_bias(self._slots[slot])
        return bias

    def _row_bias(self, row: Row) -> np.ndarray:
        """`(vocabulary,)`: what the row's `logit_bias` and grammar add to its scores at its next token."""
        bias = bias_of(row.ticket.job.config.logit_bias, self.model.decoding_vocabulary_size)
        return bias + row.constraint.bias() if row.constraint is not None else bias

    def _decoder(self, job: Job) -> TextDecoder:
        """A row's text decoder; the text of a row no one reads before its end is decoded once, at the end.
        A constrained row's grammar ends it, not a stop string: a `"stop"` reply is whole JSON or a whole call."""
        stop = () if job.grammar else job.stop
        incremental = job.stream or bool(stop)
        return TextDecoder(self.model.decode_text, self.stop_ids, stop, job.max_tokens, incremental=incremental)

    def _take(self, row: Row, generated: np.ndarray, scores: list | None) -> None:
        """The row's share of a chunk's tokens, through its `TextDecoder` (up to its `max_tokens`, a stop
        token or a stop string), with their log-probabilities where the job asks; a stream gets the text
        that no later token can change, and the log-probabilities of the tokens taken so far."""
        if row.ticket.cancelled:
            row.finish = "cancelled"
            return
        taken = len(row.decoder.tokens)
        try:
            complete = row.constraint is not None and row.constraint.take(generated[0])
        except RuntimeError as error:  # this request's grammar failed: it alone is answered so
            row.finish, row.ticket.failed = "error", True
            row.ticket.send("error", RequestError(f"decoding failed: {error}"[:500], None, 500, "server_error"))
            return
        piece = row.decoder.feed(generated, last=complete)
        row.finish = row.decoder.finish or ("stop" if complete else None)
        top = _alternatives(row.ticket.job)
        if top is not None:
            picked, top_ids, top_values = scores
            for step in range(len(row.decoder.tokens) - taken):
                alternatives = list(zip(top_ids[step, :top].tolist(), top_values[step, :top].tolist()))
                row.logprobs.append(Logprob(int(generated[step]), float(picked[step]), alternatives))
        if row.ticket.job.stream and (piece or (row.finish is not None and row.sent < len(row.logprobs))):
            row.ticket.send("text", (row.ticket.rows.index(row), piece, row.logprobs[row.sent :]))
            row.sent = len(row.logprobs)

    def _finish(self, ticket: Ticket) -> None:
        if ticket.failed or any(row.finish is None for row in ticket.rows):
            return
        if ticket.cancelled:
            self.clients_left += 1
            return
        job = ticket.job
        rows = ticket.rows
        if len(rows) > job.n:  # best_of: the n likeliest continuations, by their tokens' log-probabilities
            rows = sorted(rows, key=lambda r: -sum(entry.logprob for entry in r.logprobs))[: job.n]
        logprobs = job.logprobs is not None
        choices = [
            Choice(r.decoder.text, len(r.decoder.tokens), r.finish, r.logprobs if logprobs else None) for r in rows
        ]
        ticket.send("done", choices * (job.n // len(choices)))


def _rows_of(job: Job) -> int:
    """Rows a job decodes: one per continuation, one for all of a greedy job's (they are the same)."""
    return max(job.n, job.best_of) if job.config.temperature > 0 else 1


def _alternatives(job: Job) -> int | None:
    """How many alternatives a job's rows keep with each token's log-probability (None: no
    log-probabilities; `best_of` ranks its rows by theirs)."""
    if job.logprobs is None and job.best_of > job.n and job.config.temperature > 0:
        return 0
    return job.logprobs


def _chunk_key(jobs: list[Job], chunk_steps: int) -> tuple:
    """The chunk function that decodes the rows of `jobs`: `("chunk", features, steps)`."""
    return ("chunk", _settings_features([job.config for job in jobs], jobs), _steps(jobs, chunk_steps))


def _settings_features(configs: list[GenerationConfig], jobs: list[Job] = ()) -> continuous.Features:
    """What a chunk computes for rows of these `configs` (of these `jobs`: with their biases, grammars
    and log-probabilities)."""
    settings = continuous.settings_of(configs, [0] * len(configs))
    return features_of(settings)._replace(
        biased=any(job.config.logit_bias or job.grammar for job in jobs),
        logprobs=any(_alternatives(job) is not None for job in jobs),
    )


def _steps(jobs: list[Job], chunk_steps: int) -> int:
    """A constrained row's next tokens depend on the one it takes: chunks of one step while one decodes."""
    return 1 if any(job.grammar for job in jobs) else chunk_steps
