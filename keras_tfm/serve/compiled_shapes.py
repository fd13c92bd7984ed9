"""The engine's compiled functions by cache shape: which shapes have run, a warm-up that compiles the
shapes a server will use before it says it is ready, and compiles of new shapes on a thread of their own
while the rows already decoding go on. A first call of a shape compiles it (seconds on JAX and
TensorFlow, a trace on PyTorch); on the engine's thread that would stall every row."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable

import keras
import numpy as np
from keras import ops

from keras_tfm import compat
from keras_tfm.convert.variables import return_freed_memory
from keras_tfm.generation import compiled, continuous
from keras_tfm.generation.continuous import WIDTH_STEP, cache_length, grown
from keras_tfm.generation.sampling import tracks_seen

# A function's key: ("prefill",), ("first", Features), ("chunk", Features, steps) or ("admit", prefilled cache shape);
# a shape: (rows, width or cache length; 0 for "first")
Key = tuple
Shape = tuple[int, int]
# A prompt alone (a request waiting for its first token) of up to 64 tokens is prefilled at the next multiple of
# 8 from 16, not of a cache length: its products are its time (SmolLM2's shape on JAX: 56, 72, 90 and 102 ms at
# 16, 32, 48 and 64 wide). Its cache is a cache length's (`continuous.prefill`): one program more a width.
ALONE_STEP, ALONE_SHORTEST, ALONE_LONGEST = 8, 16, 64
# Row counts grow four times (1, 4, 16, ..., and the batch limit): a step of 4 rows reads the same weights
# as one of 2, while each compiled shape costs seconds of warm-up and tens of MB resident (JAX, SmolLM2).
ROW_GROWTH = 4


class CompiledShapes:
    """`model`'s prefill and chunk functions, and the `(key, shape)` pairs each has been compiled for."""

    def __init__(self, model):
        self.model = model
        self.ready: set[tuple[Key, Shape]] = set()
        self.beside = 0  # shapes compiled on their own thread while rows decoded
        self.stalls = 0  # shapes compiled on the engine's thread while other requests' rows waited
        self._pending: dict[tuple[Key, Shape], concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="keras_tfm-compile", initializer=compat.torch_serial_here
        )

    def function(self, key: Key) -> Callable:
        """The compiled function of `key`, kept on the model beside `generate`'s (every engine of the
        model reuses it)."""
        with self._lock:  # the engine's and the compiling thread's
            return continuous.function(self.model, key)

    def call(self, key: Key, shape: Shape, others_wait: bool, *inputs):
        """`key`'s function on `inputs` of `shape`; a first call while `others_wait` counts as a stall."""
        pending = self._pending.pop((key, shape), None)
        if pending is not None:  # compiling on the side already: wait for it rather than compile twice
            concurrent.futures.wait([pending])  # (one that failed compiles again here)
        elif others_wait and (key, shape) not in self.ready:
            self.stalls += 1
        result = self.function(key)(*inputs)
        self.ready.add((key, shape))
        return result

    def compile(self, key: Key, shape: Shape) -> None:
        """Compiles `key` for `shape` by running it on zeros of that shape (on any thread), then hands the
        compiler's freed memory back to the system (glibc keeps it: 5 GB after the warm-up of SmolLM2 on JAX,
        2.4 GB when returned)."""
        self._compile(key, shape)
        return_freed_memory()

    def _compile(self, key: Key, shape: Shape) -> None:
        rows, length = shape
        vocabulary = self.model.decoding_vocabulary_size
        if key[0] == "prefill":
            self.function(key)(ops.zeros(shape, "int32"), ops.zeros((rows,), "int32"))
        elif key[0] == "first":
            features = key[1]
            seen = ops.zeros((rows, vocabulary if tracks_seen(features) else 1), "int32")
            bias = (ops.zeros((rows, vocabulary), "float32"),) if features.biased else ()
            logits = ops.zeros((rows, vocabulary), self.model.compute_dtype)
            self.function(key)(logits, seen, _idle_settings(rows), ops.zeros((rows,), "int32"), *bias)
        elif key[0] == "admit":  # its operations, compiled one by one on JAX, for these shapes
            filled, seen = self.model.empty_cache(*key[1]), ops.zeros((rows, vocabulary), "int32")
            sources = [min(row, key[1][0] - 1) for row in range(rows)]  # rows of `filled`
            cache, seen_rows = self.model.empty_cache(rows, length), np.zeros((rows, vocabulary), "int32")
            continuous.admit(cache, seen, filled, sources, list(range(rows)), seen_rows)
        else:
            features, settings = key[1], _idle_settings(rows)
            zeros = ops.zeros((rows,), "int32")
            seen = ops.zeros((rows, vocabulary), "int32")
            bias = (ops.zeros((rows, vocabulary), "float32"),) if features.biased else ()
            fed = tuple(ops.convert_to_tensor(part) for part in continuous.nothing_fed(rows, key[2]))
            self.function(key)(self.model.empty_cache(rows, length), zeros, zeros, seen, settings, fed, *bias)

    def available(self, wanted: Iterable[tuple[Key, Shape]]) -> bool:
        """Whether every `(key, shape)` of `wanted` is compiled; those that are not are compiled on the
        side (call again later). A compile that failed raises here."""
        missing = [item for item in wanted if item not in self.ready]
        for item in missing:
            if item not in self._pending and not self._submit(item, self.compile, *item):
                return False  # closed: the request is answered as the engine stops
        if not all(self._pending[item].done() for item in missing):
            return False
        for item in missing:
            self._pending.pop(item).result()
            self.ready.add(item)
            self.beside += 1
        return True

    def compile_later(self, plan: list[tuple[Key, Shape]], progress: Callable[[str], None] | None) -> None:
        """Compiles every `(key, shape)` of `plan` on the side, in order, telling `progress` after each; a
        request that needs one waits for it (`available`, `call`), and `settle` makes those done ready."""

        def compile_and_tell(done: int, key: Key, shape: Shape) -> None:
            self.compile(key, shape)
            if progress is not None:
                progress(f"warm-up beside {done}/{len(plan)}: {_described(key, shape)}")

        for done, item in enumerate(plan, 1):
            if (
                item not in self.ready
                and item not in self._pending
                and not self._submit(item, compile_and_tell, done, *item)
            ):
                return  # closed

    def _submit(self, item: tuple[Key, Shape], compile: Callable, *arguments) -> bool:
        """Compiles `item` on the side (`compile(*arguments)`); False where `close` came first."""
        with self._lock:
            if self._closed:
                return False
            self._pending[item] = self._pool.submit(compile, *arguments)
            return True

    def compiling(self) -> int:
        """How many shapes are compiling on the side now (0: the warm-up's plan is all compiled)."""
        return sum(not future.done() for future in list(self._pending.values()))

    def settle(self) -> None:
        """The shapes compiled on the side since the last call are ready (one that failed is dropped: it
        compiles again when a request needs it)."""
        for item, future in list(self._pending.items()):
            if future.done():
                del self._pending[item]
                if not future.cancelled() and future.exception() is None:
                    self.ready.add(item)
                    self.beside += 1

    def usable_chunk(self, features: continuous.Features, steps: int, shape: Shape) -> continuous.Features | None:
        """Features of a chunk compiled for `shape` that computes what `features` asks (the same, or more: a
        row is unchanged by features it does not use, and a wider top-k cut holds every narrower one), fewest
        first; None where none is compiled."""
        return self._fewest(("chunk",), features, shape, steps)

    def usable_first(self, features: continuous.Features, rows: int) -> continuous.Features | None:
        """Features of a compiled `("first", features)` for `rows` rows that computes what `features` asks,
        fewest first; None where none is compiled."""
        return self._fewest(("first",), features, (rows, 0))

    def _fewest(self, kind: tuple, features: continuous.Features, shape: Shape, *rest) -> continuous.Features | None:
        """The fewest features of a compiled `(*kind, features', *rest)` for `shape` covering `features`."""
        fits = [
            key[1]
            for key, ready_shape in self.ready
            if ready_shape == shape and key[:1] == kind and key[2:] == rest and _covers(key[1], features)
        ]
        return min(fits, key=sum) if fits else None

    def prefill_width(self, rows: int, width: int, length: int) -> int:
        """The width to prefill `rows` prompts that fit `width` in a cache of `length`: `width`, or while its
        prefill is not compiled, the narrowest compiled one up to `length` (a prompt is right-padded)."""
        if (("prefill",), (rows, width)) in self.ready:
            return width
        widths = [shape[1] for key, shape in self.ready if key == ("prefill",) and shape[0] == rows]
        return min([size for size in widths if width < size <= length], default=width)

    def holding(self, features: continuous.Features, steps: int, shape: Shape) -> Shape | None:
        """The smallest shape, fewest rows first, of at least `shape`'s rows and positions whose chunk
        computing `features` is compiled (rows decode alike in a larger cache); None where there is none."""
        shapes = [
            ready_shape
            for key, ready_shape in self.ready
            if ready_shape[0] >= shape[0] and ready_shape[1] >= shape[1] and _serves(key, features, steps)
        ]
        return min(shapes) if shapes else None

    def warm_up(
        self, plan: list[tuple[Key, Shape]], progress: Callable[[str], None] | None, stopped: Callable[[], bool]
    ) -> None:
        """Compiles every `(key, shape)` of `plan`, telling `progress` after each, until `stopped()` (a server
        closed while it warms up ends within one compile). On JAX and TensorFlow the chunks compile on this
        thread while the prefills and writes compile on the side one (XLA's compiler leaves the interpreter
        to the other thread); PyTorch traces one at a time."""
        start = time.monotonic()
        side = {}
        if keras.backend.backend() != "torch":
            side = {
                item: self._pool.submit(self.compile, *item)
                for item in plan
                if item[0][0] != "chunk" and item not in self.ready
            }
        for done, (key, shape) in enumerate([item for item in plan if item not in side] + list(side), 1):
            if stopped():
                return
            if (key, shape) in side:
                side[(key, shape)].result()
            elif (key, shape) not in self.ready:
                self.compile(key, shape)
            self.ready.add((key, shape))
            if progress is not None:
                seconds = time.monotonic() - start
                progress(f"warm-up {done}/{len(plan)}: {_described(key, shape)} ({seconds:.0f} s)")

    def close(self) -> None:
        """Cancels the compiles not yet started; one asked for after this is not started."""
        with self._lock:  # against a compile asked for on the engine's thread meanwhile
            self._closed = True
            self._pool.shutdown(wait=False, cancel_futures=True)


def _serves(key: Key, features: continuous.Features, steps: int) -> bool:
    """Whether `key` is a chunk of `steps` steps that computes what `features` asks."""
    return key[0] == "chunk" and key[2] == steps and _covers(key[1], features)


def _covers(has: continuous.Features, wanted: continuous.Features) -> bool:
    return all(have >= want for have, want in zip(has, wanted))


def _idle_settings(rows: int) -> continuous.RowSettings:
    return continuous.RowSettings(*(ops.convert_to_tensor(v) for v in continuous.idle_settings(rows)))


def merged(features: Iterable[continuous.Features]) -> continuous.Features:
    """The features of a chunk that computes what each of `features` asks."""
    return continuous.Features(*(max(values) for values in zip(*features)))


def _described(key: Key, shape: Shape) -> str:
    cache = f"{shape[0]} rows x {shape[1]} positions"
    if key[0] == "admit":
        return f"{key[1][0]} prompts of {key[1][1]} tokens written into a cache of {cache}"
    if key[0] == "first":
        return f"first tokens of {shape[0]} rows"
    return f"{'prefill' if key[0] == 'prefill' else 'decoding'} of {cache}"


def warm_up_plan(
    model, max_batch_size: int, length: int, features: Iterable[continuous.Features], steps: int
) -> tuple[list[tuple[Key, Shape]], list[tuple[Key, Shape]]]:
    """The shapes a server of `max_batch_size` rows uses for requests of up to `length` positions (prompt
    and reply), `(first, beside)`. First, what serves one row of any such request: the prefill of one prompt
    at the longest width, the chunk of one row at that cache length that computes each of `features` (say,
    greedy rows' and those of a request that names no settings), the write of the prompt into it, and the
    choice of a row's first token. Beside: first the prefills of a prompt alone at the widths between the cache
    lengths (`prefill_length`), then each row count with each cache length up to `length`'s. Each
    shape's chunk and first-token choice compute every one of `features`: where the backend takes branches,
    a chunk whose rows are all greedy skips the sampling (`Loop.branch`), and elsewhere each kind has its own."""
    top = cache_length(length, model.max_length)
    lengths = sorted({cache_length(WIDTH_STEP << p, model.max_length) for p in range(top.bit_length())} - {0})
    rows = sorted({rows_bucket(count, max_batch_size) for count in range(1, max_batch_size + 1)})
    lengths = [size for size in lengths if size <= top]
    kinds = list(dict.fromkeys(features))
    longest, every = (1, lengths[-1]), merged(kinds)
    first = [(("prefill",), longest), (("chunk", every, steps), longest), (("admit", longest), longest),
             (("first", every), (1, 0))]  # fmt: skip
    kinds = [every] if compiled.takes_branches() else kinds
    shapes = [(count, size) for size in lengths for count in rows]
    alone = {prefill_length(size, model.max_length, 1) for size in range(1, ALONE_LONGEST + 1)}
    plan = [(("prefill",), (1, width)) for width in sorted(alone - set(lengths)) if width < top]
    plan += [(("first", every), (count, 0)) for count in rows]
    for size in lengths:
        for count in rows:
            plan.append((("prefill",), (count, size)))
            plan.extend((("chunk", kind, steps), (count, size)) for kind in kinds)
    # prompts of (count, width) written into a cache of (rows, length)
    plan += [(("admit", new), cache) for cache in shapes for new in shapes if new[0] <= cache[0] and new[1] <= cache[1]]
    return first, [item for item in plan if item not in first]


def rows_bucket(rows: int, limit: int) -> int:
    """The compiled row count that holds `rows`: a power of `ROW_GROWTH`, but not past `limit`."""
    return grown(rows, limit, ROW_GROWTH)


def prefill_length(size: int, context: int, prompts: int) -> int:
    """The width to prefill `prompts` prompts of up to `size` tokens: `cache_length`'s, or for one prompt of up
    to `ALONE_LONGEST` tokens, the next multiple of `ALONE_STEP` from `ALONE_SHORTEST` (never past the
    `context`)."""
    if prompts == 1 and size <= ALONE_LONGEST:
        return min(max(ALONE_SHORTEST, -(-size // ALONE_STEP) * ALONE_STEP), context)
    return cache_length(size, context)
