"""Continuous batching, the device side: a fixed set of rows (slots) of one key/value cache, each row at
its own position with its own sampling settings and its own random stream, so that a request can join
the batch between two chunks of steps and leave when it ends (`serve.engine` keeps the books).

- `admit` prefills new prompts and writes them into free rows of the cache.
- `decode_chunk` runs every row `steps` positions on (a compiled loop), each row feeding its last token
  at its own position (`call_with_cache` with a `(rows,)` `cache_update_index`).
- `resized` copies the cache into more or fewer rows, or a longer or shorter length.

Each row chooses its tokens with `sampling`'s chooser and its own seed, so a seeded request gets the
same answer whoever it shares the batch with, and the answer `generate` gives with that seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from keras import ops

from keras_tfm.generation import compiled
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.sampling import Features, RowSettings, choose, row_values, seen_counted


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


def decode_chunk(model, features: Features, steps: int):
    """A compiled `(cache, tokens, positions, seen, settings, fed[, bias]) -> (cache, seen, generated[,
    logprobs])`: every row feeds its token at its position, then the token it chose at the next, up to `steps`
    times; `generated` `(rows, steps)` holds the tokens fed next (`bias` `(rows, vocabulary)` float32,
    with `features.biased`: what the host adds to each row's scores at every step of the chunk). `fed`,
    `(tokens (rows, steps), counts (rows,), made (rows,), run ())` int32: a row's first `counts` steps feed those
    tokens of its prompt rather than the ones it chose (a new row whose prompt runs past its prefill; a new
    row's first token comes from the chunk anyway, so these steps cost it no time) and count no seen token;
    `made`: the new tokens the row has taken before the chunk (the model's `stop_ids()` wait for the row's
    `min_new_tokens`); `run`, a scalar: the steps this call runs, at most `steps` (a new row's first token
    returns after the prompt tokens it feeds, not a whole chunk later; the columns after are zeros). With
    `features.logprobs`, `logprobs` is `(chosen (rows, steps), top ids and top log-probabilities (rows,
    steps, k))` of `logprobs_of`. A row past the cache's end writes its last position again (its request
    has ended; the host drops what it generated). The `cache` and `seen` it is given are spent (JAX
    writes the new ones into their buffers): the caller goes on with those it returns."""
    top = min(TOP_LOGPROBS, model.decoding_vocabulary_size)
    stops = (
        ops.convert_to_tensor(np.asarray(model.stop_ids(), "int32").reshape(-1)) if features.min_new_tokens else None
    )

    def step_rows(i, cache, tokens, positions, seen, generated, settings, fed, bias, logprobs):
        logits, cache = model.call_with_cache(ops.expand_dims(tokens, 1), cache, positions)
        made = fed[2] + i - fed[1]  # the new tokens before this step's (negative while it feeds its prompt)
        chosen = choose(logits[:, -1, :], seen, settings, positions, features, bias, new_tokens=made,
                        stop_token_ids=stops)[0]  # fmt: skip
        prompted = i < fed[1]
        following = ops.where(prompted, ops.take(fed[0], i, axis=1), chosen)
        generated = ops.slice_update(generated, (0, i), ops.expand_dims(following, 1))
        if features.logprobs:
            picked, top_ids, top_values = logprobs_of(logits[:, -1, :], chosen, top)
            logprobs = tuple(
                ops.slice_update(kept, (0, i, 0)[: len(kept.shape)], ops.expand_dims(new, 1))
                for kept, new in zip(logprobs, (picked, top_ids, top_values))
            )
        if features.penalty or features.counts:
            hot = ops.one_hot(chosen, ops.shape(seen)[1], dtype="int32")
            seen = seen_counted(seen, hot * ops.expand_dims(ops.cast(ops.logical_not(prompted), "int32"), 1), None)
        last = ops.shape(cache[0])[3] - 1
        positions = ops.minimum(positions + 1, last)
        return i + 1, cache, following, positions, seen, generated, settings, fed, bias, logprobs

    _, while_loop = compiled.decoding_functions(model.call_with_cache, model)

    def chunk(cache, tokens, positions, seen, settings, fed, bias=()):
        rows = ops.shape(tokens)[0]
        generated = ops.zeros((rows, steps), "int32")
        logprobs = ()
        if features.logprobs:
            logprobs = (
                ops.zeros((rows, steps), "float32"),
                ops.zeros((rows, steps, top), "int32"),
                ops.zeros((rows, steps, top), "float32"),
            )
        start = (
            ops.convert_to_tensor(0, "int32"), cache, tokens, positions, seen, generated, settings, fed, bias, logprobs
        )  # fmt: skip
        result = while_loop(lambda i, *rest: i < rest[6][3], step_rows, start)  # `fed`'s `run`
        return (result[1], result[4], result[5], *((result[9],) if features.logprobs else ()))

    return compiled.compile_function(chunk, model, donated=(0, 3))  # the cache and `seen`: callers replace them


def function(model, key: tuple):
    """The compiled function of `key`, `("prefill",)` or `("chunk", features, steps)`, kept on the model:
    every server engine of the model and `generate`'s constrained rows share it."""
    functions = model.compiled_decoding()
    if ("rows", key) not in functions:
        functions[("rows", key)] = prefill(model) if key[0] == "prefill" else decode_chunk(model, *key[1:])
    return functions[("rows", key)]


def prefill(model):
    """A compiled `(token_ids) -> cache`: the keys and values of right-padded prompts `(rows, width)`,
    a cache of `width` positions (what follows a prompt's end is overwritten as the row decodes)."""

    def fill(token_ids):
        rows, width = ops.shape(token_ids)
        _, cache = model.call_with_cache(token_ids, model.empty_cache(rows, width), 0, output_logits=False)
        return cache

    return compiled.compile_function(fill, model)


def admit(cache, seen, filled, sources, slots, seen_rows):
    """`cache` and `seen` with rows `slots` `(k,)` replaced: by rows `sources` `(k,)` of the prefilled
    cache `filled` (its positions from 0, the rest zeros) and by `seen_rows` `(k, vocabulary)` (int32: 1
    for each token of the row's prompt, `sampling.seen_counted`). The `cache` and `seen` it is given are
    spent (JAX and PyTorch write the rows into them, a layer at a time)."""
    indices = ops.expand_dims(ops.convert_to_tensor(slots, "int32"), 1)
    sources = ops.convert_to_tensor(sources, "int32")
    write = compiled.written_in_place(_rows_written)
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
