"""The row loop, the one decoding loop but beam search's: a fixed set of rows (slots) of one key/value cache,
each row at its own position with its own sampling settings and its own random stream.

- `chunk_body` runs every row some steps on (a compiled loop), each row feeding its last token at its own
  position (`call_with_cache` with a `(rows,)` `cache_update_index`); a `Loop` adds what `generate` asks for:
  rows that end by themselves, transition scores, an n-gram ban.
- `decode_rows` is `generate`'s and an exported model's call: the prompts prefilled, then the loop to the end.
- For the server (`serve.engine` keeps the books), a request joins the batch between two chunks and leaves
  when it ends: `admit` prefills new prompts and writes them into free rows of the cache, and `resized` copies
  the cache into more or fewer rows, or a longer or shorter length.

Each row chooses its tokens with `sampling`'s chooser and its own seed, so a seeded request gets the
same answer whoever it shares the batch with, and the answer `generate` gives with that seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from keras_tfm.generation import compiled
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.sampling import (
    Features,
    RowSettings,
    banned_ngrams,
    choose,
    initial_seen,
    row_values,
    seen_counted,
    top_k_largest,
)

WIDTH_STEP = 32  # the shortest cache of the server's rows (and prefill width of several prompts); longer ones double


def settings_of(configs: Sequence[GenerationConfig], seeds: Sequence[int]) -> RowSettings:
    """`RowSettings` (NumPy columns) of rows decoding with these `configs` and `seeds`, one each."""
    rows = [row_values(config, seed, dtypes=True) for config, seed in zip(configs, seeds, strict=True)]
    return RowSettings(*(np.array([value for value, _ in column], column[0][1]) for column in zip(*rows)))


def nothing_fed(rows: int, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A chunk's `fed` where no row feeds its prompt's tokens (nor has made any new token): all `steps` run."""
    return np.zeros((rows, steps), "int32"), np.zeros(rows, "int32"), np.zeros(rows, "int32"), np.array(steps, "int32")


def idle_settings(rows: int) -> list[np.ndarray]:
    """`RowSettings` values of `rows` free rows (what they compute is dropped): greedy decoding's, seed 0."""
    return [np.full(rows, value, dtype) for value, dtype in row_values(GenerationConfig(), 0, dtypes=True)]


TOP_LOGPROBS = 20  # the most alternatives a chunk returns per token (OpenAI's `top_logprobs` limit)


def logprobs_of(logits, chosen, top: int):
    """The model's log-probabilities (its raw logits' log-softmax, before any control or warp, as vLLM
    reports them): of the `chosen` tokens `(rows,)`, and the `top` likeliest tokens with theirs."""
    log_probabilities = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    picked = ops.take_along_axis(log_probabilities, ops.expand_dims(chosen, 1), axis=1)[:, 0]
    top_values, top_ids = ops.top_k(log_probabilities, top)
    return picked, ops.cast(top_ids, "int32"), top_values


class Loop(NamedTuple):
    """What a row loop does beside choosing tokens, fixed for its compiled function (a part of its key):
    - `ends`: rows end by themselves, after a stop token or their limit of new tokens, and the loop stops once
      every row has (`generate`, `stream`; the server's engine ends its rows on the host);
    - `scores`: it returns each new token's transition score;
    - `ngram`: the size of an n-gram ban (each row keeps its tokens by position, its `history`);
    - `largest`: how a top-k cut reads the largest scores (a sort in an exported SavedModel);
    - `aligned`: every row is at the same position (prompts of one length), so the model takes one position for
      all rows (fewer operations a step than a position per row);
    - `branch`: a step whose rows are all greedy skips the sampling its chooser computes for others (`choose`),
      where the backend compiles branches: the server's chunks, which greedy and sampling rows share."""

    ends: bool = False
    scores: bool = False
    ngram: int = 0
    largest: Callable = top_k_largest
    aligned: bool = False
    branch: bool = False


class Rows(NamedTuple):
    """A row loop's tensors beside the server's: `stops` (1-D) and each row's `limits` of new tokens with
    `Loop.ends` (and which rows are `done`), each new token's transition `scores` `(rows, steps)` with
    `Loop.scores`, each row's tokens by position (`history`, `(rows, cache length)`) with `Loop.ngram`, and the
    `context` every step reads (a translator's encoder keys and values and source mask)."""

    stops: object = ()
    limits: object = ()
    done: object = ()
    scores: object = ()
    history: object = ()
    context: tuple = ()


SERVER, NO_ROWS = Loop(branch=True), Rows()  # the server's engine's loop: it ends its rows and keeps no more


def decode_chunk(model, features: Features, steps: int, loop: Loop = SERVER):
    """A compiled `(cache, tokens, positions, seen, settings, fed[, bias][, rows]) -> (cache, seen, generated[,
    logprobs][, scores][, history])` (`chunk_body`): the server's chunk, and with a `loop`, `generate`'s."""
    # the cache and `seen`: callers replace them
    return compiled.compile_function(chunk_body(model, features, steps, loop), model, donated=(0, 3))


def chunk_body(model, features: Features, steps: int, loop: Loop = SERVER):
    """`(cache, tokens, positions, seen, settings, fed[, bias][, rows]) -> (cache, seen, generated[, logprobs][,
    scores][, history])`, a traceable function: every row feeds its token at its position, then the token it
    chose at the next, up to `steps` times; `generated` `(rows, steps)` holds the tokens fed next (`bias` `(rows,
    vocabulary)` float32, with `features.biased`: what the host adds to each row's scores at every step of the
    chunk). `fed`, `(tokens (rows, steps), counts (rows,), made (rows,), run ())` int32: a row's first `counts`
    steps feed those tokens of its prompt rather than the ones it chose (a new row whose prompt runs past its
    prefill; a new row's first token comes from the chunk anyway, so these steps cost it no time) and count no
    seen token; `made`: the new tokens the row has taken before the chunk (the stops wait for the row's
    `min_new_tokens`: `rows.stops` with `Loop.ends`, else the model's `stop_ids()`); `run`, a scalar: the steps
    this call runs, at most `steps` (a new row's first token returns after the prompt tokens it feeds, not a
    whole chunk later; the columns after are zeros). With `features.logprobs`, `logprobs` is `(chosen (rows,
    steps), top ids and top log-probabilities (rows, steps, k))` of `logprobs_of`. `rows`, a `Rows`, with a
    `Loop` (`Loop.scores`: `scores` the log-softmax of the scores each token was drawn from, transformers'
    transition scores). A row past the cache's end writes its last position again (its request has ended; the
    host drops what it generated). The `cache` and `seen` it is given are spent (JAX writes the new ones into
    their buffers): the caller goes on with those it returns."""
    top = min(TOP_LOGPROBS, model.decoding_vocabulary_size)
    stops = (
        ops.convert_to_tensor(np.asarray(model.stop_ids(), "int32").reshape(-1))
        if features.min_new_tokens and not loop.ends
        else None
    )

    def step_rows(i, cache, tokens, positions, seen, generated, settings, fed, bias, logprobs, rows):
        # a new tensor, not the input, so that PyTorch's trace computes what every layer derives from it (the
        # rotation, the mask) once: an input might alias the caches written in place (`compiled.torch_trace`)
        index = ops.min(positions) if loop.aligned else positions + 0
        logits, cache = model.call_with_cache(ops.expand_dims(tokens, 1), cache, index, *rows.context)
        logits = logits[:, -1, :]
        made = fed[2] + i - fed[1]  # the new tokens before this step's (negative while it feeds its prompt)
        banned = banned_ngrams(rows.history, positions + 1, logits.shape[-1], loop.ngram) if loop.ngram else None
        chosen, warped = choose(logits, seen, settings, positions, features, bias, banned, made,
                                rows.stops if loop.ends else stops, largest=loop.largest,
                                branch=loop.branch and compiled.takes_branches())  # fmt: skip
        prompted = i < fed[1]
        following = ops.where(prompted, ops.take(fed[0], i, axis=1), chosen)
        generated = ops.slice_update(generated, (0, i), ops.expand_dims(following, 1))
        if features.logprobs:
            picked, top_ids, top_values = logprobs_of(logits, chosen, top)
            logprobs = tuple(
                ops.slice_update(kept, (0, i, 0)[: len(kept.shape)], ops.expand_dims(new, 1))
                for kept, new in zip(logprobs, (picked, top_ids, top_values))
            )
        if features.penalty or features.counts:
            hot = ops.one_hot(chosen, ops.shape(seen)[1], dtype="int32")
            seen = seen_counted(seen, hot * ops.expand_dims(ops.cast(ops.logical_not(prompted), "int32"), 1), None)
        rows = _rows_after(rows, loop, i, positions, following, chosen, warped, ops.logical_not(prompted), made)
        last = ops.shape(cache[0])[3] - 1
        positions = ops.minimum(positions + 1, last)
        return i + 1, cache, following, positions, seen, generated, settings, fed, bias, logprobs, rows

    _, while_loop = compiled.decoding_functions(model.call_with_cache, model)

    def cond(i, *rest):
        going = i < rest[6][3]  # `fed`'s `run`
        return ops.logical_and(going, ops.logical_not(ops.all(rest[9].done))) if loop.ends else going

    def chunk(cache, tokens, positions, seen, settings, fed, bias=(), rows=NO_ROWS):
        count = ops.shape(tokens)[0]
        generated = ops.zeros((count, steps), "int32")
        logprobs = ()
        if features.logprobs:
            logprobs = (
                ops.zeros((count, steps), "float32"),
                ops.zeros((count, steps, top), "int32"),
                ops.zeros((count, steps, top), "float32"),
            )
        if loop.ends:
            rows = rows._replace(done=rows.limits <= fed[2])
        if loop.scores:
            rows = rows._replace(scores=ops.zeros((count, steps), "float32"))
        start = (ops.convert_to_tensor(0, "int32"), cache, tokens, positions, seen, generated, settings, fed, bias,
                 logprobs, rows)  # fmt: skip
        result = while_loop(cond, step_rows, start)
        rows = result[10]
        return (result[1], result[4], result[5], *((result[9],) if features.logprobs else ()),
                *((rows.scores,) if loop.scores else ()), *((rows.history,) if loop.ngram else ()))  # fmt: skip

    return chunk


def _rows_after(rows: Rows, loop: Loop, i, positions, following, chosen, warped, generating, made) -> Rows:
    """`rows` after step `i` fed the rows at `positions` and chose `chosen` (from `warped`), `following` next;
    `generating` `(rows,)`: the rows that chose a new token (not one of their prompt's), their `made`th."""
    if loop.scores:
        score = ops.take_along_axis(ops.log_softmax(warped, axis=-1), ops.expand_dims(chosen, 1), axis=1)
        score = ops.where(ops.expand_dims(generating, 1), score, 0.0)
        rows = rows._replace(scores=ops.slice_update(rows.scores, (0, i), ops.cast(score, "float32")))
    if loop.ngram:  # the token each row feeds next, at its next position
        placed = ops.arange(ops.shape(rows.history)[1], dtype="int32")[None, :] == ops.expand_dims(positions + 1, 1)
        rows = rows._replace(history=ops.where(placed, ops.expand_dims(following, 1), rows.history))
    if loop.ends:
        stopped = ops.any(ops.equal(ops.expand_dims(chosen, 1), ops.expand_dims(rows.stops, 0)), axis=1)
        ended = ops.logical_and(generating, ops.logical_or(stopped, made + 1 >= rows.limits))
        rows = rows._replace(done=ops.logical_or(rows.done, ended))
    return rows


def decode_rows(model, features: Features, steps: int, loop: Loop):
    """A traceable `(prompts, lengths, settings, limits, stops, bias, *inputs) -> (generated[, scores])`:
    right-padded `prompts` `(rows, width)` (row `i`'s first `lengths[i]` tokens) prefilled (`started`), then
    decoded by the row loop until each row ends (`Loop.ends`: a stop of `stops`, or its `limits` of new tokens)
    or `steps` new tokens; `generated` `(rows, steps)`: each row's new tokens from its first on. `settings`: each
    row's `RowSettings` `(rows,)`; `inputs`: the model's own (`decoding_cache`: a translator's source ids).
    What `generate` compiles, and an exported model's `generate` traces."""
    body = chunk_body(model, features, steps, loop)

    def run(prompts, lengths, settings, limits, stops, bias, *inputs):
        rows = ops.shape(prompts)[0]
        length = ops.shape(prompts)[1] + steps
        cache, tokens, seen, history, context = started(model, prompts, lengths, length, features, loop, inputs)
        nothing = ops.zeros_like(lengths)
        fed = (ops.zeros((rows, steps), "int32"), nothing, nothing, ops.convert_to_tensor(steps, "int32"))
        state = Rows(stops, limits, history=history, context=context)
        return body(cache, tokens, lengths - 1, seen, settings, fed, bias, state)[2:]

    return run


def started(model, prompts, lengths, length, features: Features, loop: Loop, inputs: tuple = ()) -> tuple:
    """`(cache, tokens, seen, history, context)`: right-padded `prompts` `(rows, width)` prefilled into a cache
    of `length` positions, each row to feed its prompt's last token (`tokens`) at `lengths - 1` next, the
    tokens each row has `seen` (a placeholder where no penalty reads them), its `history` with `loop.ngram`
    (the prompts in `length` positions) and the `context` of the model's `inputs`."""
    cache, context, _ = filled(model, prompts, length, inputs)
    tokens = ops.take_along_axis(prompts, ops.expand_dims(lengths - 1, 1), axis=1)[:, 0]
    seen = initial_seen(prompts, ops.expand_dims(lengths, 1), model.decoding_vocabulary_size, features)
    history = ()
    if loop.ngram:
        history = ops.pad(prompts, ((0, 0), (0, length - ops.shape(prompts)[1])))
    return cache, tokens, seen, history, context


def filled(model, prompts, length, inputs: tuple = (), last=None) -> tuple:
    """`(cache, context, logits)`: the keys and values of right-padded `prompts` `(rows, width)` in a cache of
    `length` positions (what follows a prompt's end is overwritten as the row decodes), the `context` of the
    model's `inputs`, and with `last` `(rows,)` the logits of each row's token at that index (else None): the one
    prefill, `generate`'s (`started`) and the server's (`prefill`)."""
    cache, context = model.decoding_cache(ops.shape(prompts)[0], length, *inputs)
    if last is None:
        return model.call_with_cache(prompts, cache, 0, *context, output_logits=False)[1], context, None
    logits, cache = model.call_with_cache(prompts, cache, 0, *context, logits_at=last)
    return cache, context, logits


def function(model, key: tuple):
    """The compiled function of `key`, `("prefill",)`, `("first", features)` or `("chunk", features, steps[,
    loop])`, kept on the model: every server engine of the model, `generate` and `stream` share it."""
    functions = model.compiled_decoding()
    if ("rows", key) not in functions:
        makers = {"prefill": prefill, "first": first_tokens, "chunk": decode_chunk}
        functions[("rows", key)] = makers[key[0]](model, *key[1:])
    return functions[("rows", key)]


def prefill(model):
    """A compiled `(token_ids, last) -> (cache, logits)`: right-padded prompts `(rows, width)` in a cache of
    `cache_length(width)` positions, which `admit` writes into rows of the server's, and the logits
    `(rows, vocabulary)` of each row's token at index `last` `(rows,)` (a prompt's last: its first new token's,
    `first_tokens`). A prompt alone is prefilled nearly at its own width into a cache of a cache length, so the
    writes into the server's rows are those of the cache lengths, not one set more for each width."""

    def fill(token_ids, last):
        cache, _, logits = filled(model, token_ids, _held(ops.shape(token_ids)[1], model.max_length), last=last)
        return cache, logits

    # one prompt's (a request alone, waiting for its first token) has a program of its own width; several
    # prompts' are products enough that one program of any shape costs little more (`specialized_where`)
    return compiled.specialized_where(lambda token_ids, last: ops.shape(token_ids)[0] == 1, fill, model)


def grown(size: int, limit: int, growth: int) -> int:
    """The smallest power of `growth` that holds `size`, but not past `limit` (and never below `size`)."""
    rounded = 1
    while rounded < size:
        rounded *= growth
    return max(size, min(rounded, limit))


def cache_length(size: int, context: int) -> int:
    """The server's cache length (and several prompts' prefill width) that holds `size` positions: a power of
    two from `WIDTH_STEP`, never past the `context` (a position table has no row beyond)."""
    return max(min(WIDTH_STEP, context), grown(size, context, 2))


def _held(width, context: int):
    """`cache_length(width, context)`, also of a `width` a traced function reads as a scalar tensor (TensorFlow's
    graph of several prompts, PyTorch's trace of one)."""
    if isinstance(width, int):
        return cache_length(width, context)
    lengths = sorted(
        {min(cache_length(WIDTH_STEP << power, context), context) for power in range(context.bit_length())}
    )
    lengths = ops.convert_to_tensor(np.asarray(lengths, "int32"))
    return ops.min(ops.where(lengths >= width, lengths, context))


def first_tokens(model, features: Features):
    """A compiled `(logits, seen, settings, positions[, bias]) -> (chosen[, logprobs])`: each row's first new
    token chosen from its prompt's last `logits` `(rows, vocabulary)` (`prefill`'s) by the chunk's chooser,
    its prompt's last token at `positions` (the key of its random draw, as in a chunk's step), none made
    before; `logprobs` as a chunk's (`logprobs_of`), of one step."""
    top = min(TOP_LOGPROBS, model.decoding_vocabulary_size)
    stops = (
        ops.convert_to_tensor(np.asarray(model.stop_ids(), "int32").reshape(-1)) if features.min_new_tokens else None
    )

    def first(logits, seen, settings, positions, bias=()):
        made = ops.zeros_like(positions)
        chosen, _ = choose(logits, seen, settings, positions, features, bias, None, made, stops)
        return (chosen, *((logprobs_of(logits, chosen, top),) if features.logprobs else ()))

    return compiled.compile_function(first, model)


def admit(cache, seen, filled, sources, slots, seen_rows):
    """`cache` and `seen` with rows `slots` `(k,)` replaced: by rows `sources` `(k,)` of the prefilled
    cache `filled` (its positions from 0, the rest zeros) and by `seen_rows` `(k, vocabulary)` (int32: 1
    for each token of the row's prompt, `sampling.seen_counted`). The `cache` and `seen` it is given are
    spent (JAX and PyTorch write the rows into them, a layer at a time)."""
    indices = ops.expand_dims(ops.convert_to_tensor(slots, "int32"), 1)
    sources = ops.convert_to_tensor(sources, "int32")
    on_torch = keras.backend.backend() == "torch"
    write = compiled.rows_replaced_in_place if on_torch else compiled.written_in_place(_rows_written)
    updated = tuple(write(layer, new, sources, indices) for layer, new in zip(cache, filled))
    return updated, compiled.written_in_place(ops.scatter_update)(
        seen, indices, ops.convert_to_tensor(seen_rows, "int32")
    )


def _rows_written(layer, filled, sources, indices):
    """A cache layer's rows `indices` `(k, 1)` replaced by rows `sources` `(k,)` of a prefilled layer."""
    new = ops.take(filled, sources, axis=0)
    room = ops.shape(layer)[3] - ops.shape(new)[3]
    new = ops.pad(new, ((0, 0), (0, 0), (0, 0), (0, room), (0, 0)))
    return ops.scatter_update(layer, indices, ops.cast(new, layer.dtype))


def resized(cache, seen, kept, rows: int, length: int):
    """The rows `kept` of `cache` and `seen`, now rows `0 ... len(kept) - 1` of a cache of `rows` rows and
    `length` positions (cut or padded with zeros)."""
    kept = ops.convert_to_tensor(np.asarray(kept, "int32"))
    added = rows - int(kept.shape[0])
    layers = []
    for layer in cache:
        layer = ops.take(layer, kept, axis=0)[:, :, :, :length]
        room = length - int(layer.shape[3])
        layers.append(ops.pad(layer, ((0, added), (0, 0), (0, 0), (0, room), (0, 0))))
    return tuple(layers), ops.pad(ops.take(seen, kept, axis=0), ((0, added), (0, 0)))
