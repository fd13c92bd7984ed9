"""The key/value-cached decoding loop shared by every generating model, compiled once per backend.

Prompts of different lengths are right-padded into one buffer. Decoding starts after the shortest
prompt; at each position a row keeps its own prompt token while it has one, and takes the sampled
token after that. Every position is thus written by a real token before any later query reads it,
so no padding mask is needed while decoding.

What the loop runs is a `Decoder` (fixed for a compiled function), what one call decodes a `Batch` (its
tensors), and where the loop stands a `LoopState`: `decode` runs it to the end, `CausalLM.stream` a
chunk at a time (`prefill`, then `decode_until`), and `beam_search.beam_decode` searches beams.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from keras import ops

from keras_tfm.generation.sampling import Chooser, RowSettings, banned_ngrams, choose, initial_seen, seen_with


class Decoder(NamedTuple):
    """What a decoding loop runs, fixed for one compiled function.

    `step(token_ids, cache, index, *context, output_logits=True) -> (logits, cache)` runs the model on
    `token_ids` placed at positions `index, index + 1, ...` (with `output_logits=False`, the prefill, it
    returns `None` for the logits). `while_loop` is `ops.while_loop` or a drop-in
    (`compiled.decoding_functions`). `chooser`: what the chooser computes (the numbers are the batch's);
    `vocabulary_size` is the logits' width (a repetition penalty needs it)."""

    step: Callable
    while_loop: Callable = ops.while_loop
    chooser: Chooser = Chooser()
    vocabulary_size: int | None = None


class Batch(NamedTuple):
    """The tensors of one decoding call: `buffer` and `prompt_mask` `(rows, total)` (the prompts,
    right-padded, and room for the new tokens), each row's prompt `lengths`, and how rows end:
    `max_new_tokens`, `stop_token_ids` (1-D) and the `pad_token_id` written after a row's end.
    `context`: what the step reads but never changes (a translator's encoder keys/values and source
    mask). `seeds` `(rows,)` int32: each row's random stream (`sampling.draw`). `values`: the call's numbers
    (`request.call_values`: its `RowSettings` but the seed, then its bias), tensors, so that new numbers
    replay the same program. Every value is a tensor, so that a traced loop body can be replayed on the
    next call."""

    buffer: object
    prompt_mask: object
    lengths: object
    max_new_tokens: object
    stop_token_ids: object
    pad_token_id: object
    seeds: object
    context: tuple = ()
    values: tuple = ()


class LoopState(NamedTuple):
    """Where the loop stands: the next position `t` to write, the `buffer` so far, the key/value
    `cache`, which rows are `done`, the tokens each row has `seen` (for a repetition penalty) and each
    new token's log-probability in `scores`."""

    t: object
    buffer: object
    cache: object
    done: object
    seen: object
    scores: object


def decode(decoder: Decoder, batch: Batch, prompt_width: int, cache, with_scores: bool = False):
    """Runs the loop to the end; returns the filled buffer, and with `with_scores` also `(rows, total)` float32: each generated token's log-probability under the
    distribution it was chosen from (0 at prompt and padding positions). `prompt_width`: the buffer's
    columns that hold prompt tokens (a Python int: the prefill's shape)."""
    state = prefill(decoder, batch, prompt_width, cache)
    state = decode_until(decoder, state, batch, ops.convert_to_tensor(ops.shape(batch.buffer)[1], "int32"), with_scores)
    return (state.buffer, state.scores) if with_scores else state.buffer


def prefill(decoder: Decoder, batch: Batch, prompt_width: int, cache) -> LoopState:
    """Runs every prompt position through the model at once, filling the cache; returns the state
    `decode_until` starts from."""
    # eager PyTorch would compute the prompt positions' unused logits: the step skips them
    _, cache = decoder.step(batch.buffer[:, :prompt_width], cache, 0, *batch.context, output_logits=False)
    start = ops.min(batch.lengths)
    rows, total = ops.shape(batch.buffer)
    done = ops.zeros((rows,), "bool")
    seen = initial_seen(batch.buffer, start, decoder.vocabulary_size, decoder.chooser.features)
    return LoopState(start, batch.buffer, cache, done, seen, ops.zeros((rows, total), "float32"))


def decode_until(decoder: Decoder, state: LoopState, batch: Batch, until, with_scores: bool = False) -> LoopState:
    """Writes positions from `state.t` on, until position `until`, the end of the buffer, or every row
    is done; returns the new state. With `with_scores`, `state.scores` receives each new token's
    log-probability."""
    rows, total = ops.shape(state.buffer)
    end = batch.lengths + batch.max_new_tokens  # (rows,) first position a row no longer writes
    constants = (batch.prompt_mask, end, batch.stop_token_ids, batch.pad_token_id, until, batch.seeds, batch.context,
                 batch.values)  # fmt: skip
    size = len(LoopState._fields)

    def cond(*loop_vars):
        t, done, until = loop_vars[0], loop_vars[3], loop_vars[size + 4]
        return ops.logical_and(ops.logical_and(t < total, t < until), ops.logical_not(ops.all(done)))

    def body(*loop_vars):
        updated = _step(decoder, LoopState(*loop_vars[:size]), loop_vars[size:], with_scores)
        return (*updated, *loop_vars[size:])

    return LoopState(*decoder.while_loop(cond, body, (*state, *constants))[:size])


def _step(decoder: Decoder, state: LoopState, constants: tuple, with_scores: bool) -> LoopState:
    """One position `t` of every row: its prompt token while it reads its prompt, else a new one."""
    prompt_mask, end, stop_token_ids, pad_token_id, _, seeds, context, values = constants
    t, buffer, cache, done, seen, scores = state
    rows = ops.shape(buffer)[0]
    previous = ops.slice(buffer, (0, t - 1), (rows, 1))
    logits, cache = decoder.step(previous, cache, t - 1, *context)
    vocabulary, chooser = logits.shape[-1], decoder.chooser
    features, ngram = chooser.features, chooser.no_repeat_ngram_size
    new_tokens = t - ops.sum(ops.cast(prompt_mask, "int32"), axis=1) if features.min_new_tokens else None
    banned = banned_ngrams(buffer, t, vocabulary, ngram) if ngram else None
    sampled, warped = choose(logits[:, -1, :], seen, RowSettings(*values[:-1], seeds),
                             ops.zeros((rows,), "int32") + ops.cast(t - 1, "int32"), features,
                             values[-1][None, :], banned, new_tokens, stop_token_ids, largest=chooser.largest)  # fmt: skip
    from_prompt = ops.take(prompt_mask, t, axis=1)
    current = ops.reshape(ops.slice(buffer, (0, t), (rows, 1)), (rows,))
    token = ops.where(from_prompt, current, sampled)
    token = ops.where(done, pad_token_id, token)
    buffer = ops.slice_update(buffer, (0, t), ops.reshape(token, (rows, 1)))
    generated = ops.logical_and(ops.logical_not(from_prompt), ops.logical_not(done))
    if with_scores:  # transformers' transition scores: log-softmax of the processed, warped logits
        chosen = ops.take_along_axis(ops.log_softmax(warped, axis=-1), ops.maximum(token, 0)[:, None], axis=-1)
        chosen = ops.where(generated[:, None], chosen, 0.0)
        scores = ops.slice_update(scores, (0, t), ops.cast(chosen, scores.dtype))
    stopped = ops.any(ops.equal(token[:, None], stop_token_ids[None, :]), axis=-1)
    done = ops.logical_or(done, ops.logical_and(generated, stopped))
    done = ops.logical_or(done, t + 1 >= end)
    seen = seen_with(seen, token, vocabulary, features, generated)
    return LoopState(t + 1, buffer, cache, done, seen, scores)
