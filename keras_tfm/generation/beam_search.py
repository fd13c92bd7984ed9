"""Beam search over the cached decoding step: keep the `num_beams` highest-scoring continuations
(sum of token log-probabilities) of each prompt, and return the best one.

Rows are expanded to `batch * num_beams` beams. While a row is still reading its prompt its beams
stay in place; when it generates, every beam's `vocabulary` continuations compete, the best
`num_beams` survive, and buffers and caches are reordered to follow them. A beam that emits a stop
token is finished: it may only continue with padding at no cost, so its score stays comparable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from keras import ops, tree

from keras_tfm.generation.sampling import (
    Chooser,
    RowSettings,
    banned_ngrams,
    controlled,
    initial_seen,
    seen_with,
    tracks_seen,
)
from keras_tfm.layers.attention import LARGE_NEGATIVE


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


class BeamSearch(NamedTuple):
    """`num_beams` continuations kept per prompt, ranked by log-probability / length ** `length_penalty`;
    the best `num_return_sequences` of them returned."""

    num_beams: int
    length_penalty: float = 1.0
    num_return_sequences: int = 1


def beam_decode(decoder: Decoder, batch: Batch, prompt_width: int, cache, search: BeamSearch):
    """`batch.buffer`, `batch.prompt_mask`: `(rows, total)`; `cache` and `batch.context` sized for
    `rows * num_beams`. Returns the best `num_return_sequences` beams of each row, best first, `(rows *
    num_return_sequences, total)`. The chooser's controls change the log-probabilities, as transformers'
    beam search does; `context` is the same for every beam of a row, so it is never reordered."""
    step, vocabulary_size = decoder.step, decoder.vocabulary_size
    features, ngram = decoder.chooser.features, decoder.chooser.no_repeat_ngram_size
    controls = features.penalty or features.counts or features.biased or features.min_new_tokens or ngram
    buffer, prompt_mask, prompt_lengths, max_new_tokens, stop_token_ids, pad_token_id, _, context, values = batch
    num_beams = search.num_beams
    batch, total = buffer.shape
    beams = batch * num_beams
    buffer = ops.repeat(buffer, num_beams, axis=0)
    _, cache = step(buffer[:, :prompt_width], cache, 0, *context, output_logits=False)
    start = ops.min(prompt_lengths)
    end = prompt_lengths + max_new_tokens
    # only the first beam of each row is alive at first, so the beams do not start as copies
    scores = ops.tile(ops.convert_to_tensor([[0.0] + [LARGE_NEGATIVE] * (num_beams - 1)]), (batch, 1))
    finished = ops.zeros((batch, num_beams), "bool")
    beam_range = ops.arange(num_beams, dtype="int32")
    seen = initial_seen(buffer, start, vocabulary_size, features)

    def cond(t, *rest):  # to the last row's end: the columns past it keep their padding
        return t < ops.max(rest[6])

    def body(t, buffer, cache, scores, finished, seen, prompt_mask, end, stop_token_ids, pad_token_id, context, values):
        previous = ops.slice(buffer, (0, t - 1), (beams, 1))
        logits, cache = step(previous, cache, t - 1, *context)
        log_probs = ops.log_softmax(ops.cast(logits[:, -1, :], "float32"), axis=-1)
        if controls:
            lengths = ops.repeat(ops.sum(ops.cast(prompt_mask, "int32"), axis=1), num_beams, axis=0)
            banned = banned_ngrams(buffer, t, log_probs.shape[-1], ngram) if ngram else None
            log_probs = controlled(log_probs, seen, RowSettings(*values[:-1], None), features, values[-1][None, :],
                                   banned, t - lengths, stop_token_ids)  # fmt: skip
        vocabulary = log_probs.shape[-1]
        log_probs = ops.reshape(log_probs, (batch, num_beams, vocabulary))
        pad_only = ops.where(ops.arange(vocabulary) == pad_token_id, 0.0, LARGE_NEGATIVE)
        log_probs = ops.where(finished[..., None], pad_only, log_probs)

        candidates = ops.reshape(scores[..., None] + log_probs, (batch, num_beams * vocabulary))
        top_scores, top_index = ops.top_k(candidates, num_beams)
        top_index = ops.cast(top_index, "int32")
        origin, token = top_index // vocabulary, top_index % vocabulary

        prompt_token = ops.take(ops.reshape(ops.slice(buffer, (0, t), (beams, 1)), (batch, num_beams)), 0, axis=1)
        reading = ops.take(prompt_mask, t, axis=1)[:, None]  # (batch, 1): row still in its prompt
        stopped_row = (t >= end)[:, None]  # (batch, 1): row has all its new tokens
        frozen = ops.logical_or(reading, stopped_row)
        origin = ops.where(frozen, beam_range[None, :], origin)
        token = ops.where(reading, prompt_token[:, None], ops.where(stopped_row, pad_token_id, token))
        scores = ops.where(frozen, scores, top_scores)

        rows = ops.reshape(ops.arange(batch, dtype="int32")[:, None] * num_beams + origin, (beams,))
        buffer = ops.take(buffer, rows, axis=0)
        cache = tree.map_structure(lambda part: ops.take(part, rows, axis=0), cache)
        finished = ops.take_along_axis(finished, origin, axis=1)
        if tracks_seen(features):
            generated = ops.reshape(ops.broadcast_to(ops.logical_not(frozen), ops.shape(token)), (beams,))
            seen = ops.take(seen, rows, axis=0)
            seen = seen_with(seen, ops.reshape(token, (beams,)), vocabulary, features, generated)
        buffer = ops.slice_update(buffer, (0, t), ops.reshape(token, (beams, 1)))
        is_stop = ops.any(ops.equal(token[..., None], stop_token_ids[None, None, :]), axis=-1)
        finished = ops.logical_or(finished, ops.logical_and(is_stop, ops.logical_not(frozen)))
        return (t + 1, buffer, cache, scores, finished, seen, prompt_mask, end, stop_token_ids, pad_token_id, context,
                values)  # fmt: skip

    loop_vars = (start, buffer, cache, scores, finished, seen, prompt_mask, end, stop_token_ids, pad_token_id, context,
                 values)  # fmt: skip
    _, buffer, _, scores, *_ = decoder.while_loop(cond, body, loop_vars)

    tokens = ops.reshape(buffer, (batch, num_beams, total))
    return _best(tokens, scores, prompt_lengths, end, stop_token_ids, search)


def _best(tokens, scores, prompt_lengths, end, stop_token_ids, search: BeamSearch):
    """The best `search.num_return_sequences` of each row's beams `tokens` `(rows, num_beams, total)`, best first,
    `(rows * num_return_sequences, total)`, by length-normalized score: log-probability / (its new tokens up to
    and with its stop token) ** `length_penalty`."""
    rows, _, total = tokens.shape
    positions = ops.arange(total, dtype="int32")[None, None, :]
    generated = ops.logical_and(positions >= prompt_lengths[:, None, None], positions < end[:, None, None])
    # a generated padding id counts (transformers' lengths do); what a finished beam pads with after its stop does not
    stop = ops.cast(ops.logical_and(generated, ops.any(tokens[..., None] == stop_token_ids, axis=-1)), "int32")
    generated = ops.logical_and(generated, ops.cumsum(stop, axis=-1) - stop == 0)
    lengths = ops.maximum(ops.sum(ops.cast(generated, "float32"), axis=-1), 1.0)
    _, best = ops.top_k(scores / lengths**search.length_penalty, search.num_return_sequences)
    best = ops.take_along_axis(tokens, ops.cast(best, "int32")[..., None], axis=1)
    return ops.reshape(best, (rows * search.num_return_sequences, total))
