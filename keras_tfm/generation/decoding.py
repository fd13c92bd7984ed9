"""The key/value-cached decoding loop shared by every generating model, compiled once per backend.

Prompts of different lengths are right-padded into one buffer. Decoding starts after the shortest
prompt; at each position a row keeps its own prompt token while it has one, and takes the sampled
token after that. Every position is thus written by a real token before any later query reads it,
so no padding mask is needed while decoding.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.generation.sampling import NO_CONTROLS, LogitsControls, Sampler


def as_token_ids(values, argument: str, vocabulary_size: int, mask=None) -> np.ndarray:
    """`values` as an int32 array, refusing what is not a token id of the vocabulary (at `mask`)."""
    try:
        array = np.asarray(values)
    except ValueError:  # ragged nesting
        array = np.asarray(values, dtype=object)
    if array.dtype == object or array.dtype.kind in "USb":
        raise InputError(f"must hold integer token ids; received {_short(values)}.", argument)
    if array.dtype.kind == "f" and np.array_equal(array, np.round(array)):
        array = array.astype("int64")
    if array.size and array.dtype.kind not in "iu":
        raise InputError(f"must hold integer token ids; received {array.dtype} values.", argument)
    real = array if mask is None else array[mask]
    if real.size and (real.min() < 0 or real.max() >= vocabulary_size):
        wrong = real.min() if real.min() < 0 else real.max()
        raise InputError(f"must hold ids in [0, vocabulary_size={vocabulary_size}); received {wrong}.", argument)
    return array.astype("int32")


def stop_ids(stop_token_ids, vocabulary_size: int) -> np.ndarray:
    """`stop_token_ids` (one id, or a flat list of ids) as a 1-D int32 array of ids of the vocabulary."""
    if isinstance(stop_token_ids, (int, np.integer)) and not isinstance(stop_token_ids, bool):
        stop_token_ids = [stop_token_ids]
    flat = isinstance(stop_token_ids, (list, tuple, np.ndarray)) and np.ndim(stop_token_ids) == 1
    if not flat or not all(
        isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in np.asarray(stop_token_ids).tolist()
    ):
        if not (isinstance(stop_token_ids, (list, tuple, np.ndarray)) and len(stop_token_ids) == 0):
            raise InputError(
                f"expected a token id or a flat list of token ids, such as 2 or [2, 32000]; received "
                f"{_short(stop_token_ids)}.",
                "stop_token_ids",
            )
    return as_token_ids(np.asarray(stop_token_ids, "int64").reshape(-1), "stop_token_ids", vocabulary_size)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def texts(inputs) -> str | list[str] | None:
    """`inputs` if it is text (a string, or a non-empty list of strings), else None (token ids). A list
    that mixes text and ids is refused."""
    if isinstance(inputs, str):
        return inputs
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(text, str) for text in inputs):
        return list(inputs)
    if isinstance(inputs, (list, tuple)) and any(isinstance(item, str) for item in inputs):
        kinds = sorted({type(item).__name__ for item in inputs})
        raise InputError(
            f"expected text (a string or a list of strings) or token ids (lists of ints); received a list of "
            f"{' and '.join(kinds)}.",
            "token_ids",
        )
    return None


def right_padded(rows, argument: str, vocabulary_size: int, pad_token_id: int) -> np.ndarray:
    """A list of id lists as one `(batch, longest)` int32 array, padded on the right."""
    rows = [as_token_ids(row, argument, vocabulary_size) for row in rows]
    ids = np.full((len(rows), max(len(row) for row in rows)), pad_token_id, "int32")
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids


def prepare_prompts(token_ids, padding_mask, max_new_tokens: int, pad_token_id: int, vocabulary_size: int):
    """Right-padded `(batch, prompt_length + max_new_tokens)` buffer, its prompt mask, and lengths.

    `token_ids` is a list of id lists, or an array `(batch, length)` (with `padding_mask` when rows
    are padded; padding must be on the right)."""
    if isinstance(token_ids, (list, tuple)) and token_ids and isinstance(token_ids[0], (list, tuple, np.ndarray)):
        ids = right_padded(token_ids, "token_ids", vocabulary_size, pad_token_id)
        lengths = np.array([len(row) for row in token_ids])
        mask = np.arange(ids.shape[1])[None] < lengths[:, None]
    else:
        ids = np.asarray(ops.convert_to_numpy(token_ids))
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2:
            raise InputError(f"must be (batch, length) or a list of lists; received shape {ids.shape}.", "token_ids")
        mask = (
            np.ones(ids.shape, bool) if padding_mask is None else np.asarray(ops.convert_to_numpy(padding_mask), bool)
        )
        if mask.shape != ids.shape:
            raise InputError(f"must have the shape of `token_ids` {ids.shape}; received {mask.shape}.", "padding_mask")
        ids = as_token_ids(ids, "token_ids", vocabulary_size, mask)
        lengths = mask.sum(axis=1)
        if not np.array_equal(mask, np.arange(ids.shape[1])[None] < lengths[:, None]):
            raise InputError("must mark padding on the right of each prompt only.", "padding_mask")
    if ids.shape[0] == 0:
        raise InputError(f"must hold at least one prompt; received shape {ids.shape}.", "token_ids")
    if lengths.min() < 1:
        raise InputError("every prompt needs at least one token; received an empty prompt.", "token_ids")
    if max_new_tokens < 1:
        raise InputError(f"must be >= 1; received {max_new_tokens}.", "max_new_tokens")
    total = ids.shape[1] + max_new_tokens
    buffer = np.full((ids.shape[0], total), pad_token_id, "int32")
    buffer[:, : ids.shape[1]] = np.where(mask, ids, pad_token_id)
    prompt_mask = np.zeros((ids.shape[0], total), bool)
    prompt_mask[:, : ids.shape[1]] = mask
    return buffer, prompt_mask, lengths.astype("int32")


_SEED_VESSEL: list = []


def _seed_vessel() -> keras.random.SeedGenerator:
    """One SeedGenerator whose state is threaded through the loop explicitly (compiled code cannot
    keep Python-side random state), created once outside every model."""
    if not _SEED_VESSEL:
        _SEED_VESSEL.append(keras.random.SeedGenerator(0))
    return _SEED_VESSEL[0]


def initial_seed_state(seed: int | None):
    seed = int(np.random.randint(0, 2**31 - 1)) if seed is None else int(seed)
    return ops.convert_to_tensor([seed, 0], dtype=_seed_vessel().state.dtype)


def decode(
    step: Callable,
    cache,
    buffer,
    prompt_mask,
    prompt_lengths,
    prompt_width: int,
    max_new_tokens,
    stop_token_ids,
    pad_token_id,
    seed_state,
    sampler: Sampler,
    while_loop: Callable = ops.while_loop,
    context: tuple = (),
    controls: LogitsControls = NO_CONTROLS,
    vocabulary_size: int | None = None,
    with_scores: bool = False,
):
    """Runs the loop in `keras.ops`; returns the filled buffer and the advanced seed state, and with
    `with_scores` also `(batch, total)` float32: each generated token's log-probability under the
    distribution it was chosen from (0 at prompt and padding positions).

    `step(token_ids, cache, index, *context) -> (logits, cache)` runs the model on `token_ids`
    placed at positions `index, index + 1, ...` (with `output_logits=False`, the prefill, it returns
    `None` for the logits, which nothing reads); `context` holds what it reads but never changes
    (a translator's encoder keys/values and source mask). `controls` change the scores before the
    sampler chooses (`vocabulary_size`: the logits' width, which a repetition penalty needs). `while_loop` is `ops.while_loop` or a
    drop-in (see `compiled.decoding_functions`); every per-call value is a loop variable, so that a
    traced body can be replayed on the next call."""
    batch, total = buffer.shape
    t, cache, done, seen = prefill(
        step, cache, buffer, prompt_lengths, prompt_width, context, controls, vocabulary_size
    )
    end = prompt_lengths + max_new_tokens  # (batch,) first position a row no longer writes
    _, buffer, _, _, seed_state, _, scores = decode_until(
        step,
        (t, buffer, cache, done, seed_state, seen, ops.zeros((batch, total), "float32")),
        (prompt_mask, end, stop_token_ids, pad_token_id, ops.convert_to_tensor(total, "int32")),
        sampler,
        while_loop,
        context,
        controls,
        with_scores,
    )
    return (buffer, seed_state, scores) if with_scores else (buffer, seed_state)


def prefill(
    step, cache, buffer, prompt_lengths, prompt_width: int, context=(), controls=NO_CONTROLS, vocabulary_size=None
):
    """Runs every prompt position through the model at once, filling the cache; returns the state
    `decode_until` starts from: `(first position to write, cache, done rows, tokens seen)`."""
    # eager PyTorch would compute the prompt positions' unused logits: the step skips them
    _, cache = step(buffer[:, :prompt_width], cache, 0, *context, output_logits=False)
    start = ops.min(prompt_lengths)
    done = ops.zeros((buffer.shape[0],), "bool")
    return start, cache, done, controls.initial_seen(buffer, start, vocabulary_size)


def decode_until(
    step,
    state: tuple,
    constants: tuple,
    sampler,
    while_loop=ops.while_loop,
    context=(),
    controls=NO_CONTROLS,
    with_scores: bool = False,
):
    """Writes positions from `state`'s `t` on, until position `until` (the last of `constants`), the end
    of the buffer, or every row is done; returns the new state `(t, buffer, cache, done, seed_state,
    seen, scores)`. `constants`: `(prompt_mask, end, stop_token_ids, pad_token_id, until)`. With
    `with_scores`, `scores` (batch, total) receives each new token's log-probability. `decode` runs
    it once to the end; `CausalLM.stream` runs it a chunk at a time."""
    batch, total = state[1].shape
    vessel = _seed_vessel()

    def cond(
        t, buffer, cache, done, seed_state, seen, scores, prompt_mask, end, stop_token_ids, pad_token_id, until, context
    ):
        return ops.logical_and(ops.logical_and(t < total, t < until), ops.logical_not(ops.all(done)))

    def body(
        t, buffer, cache, done, seed_state, seen, scores, prompt_mask, end, stop_token_ids, pad_token_id, until, context
    ):
        previous = ops.slice(buffer, (0, t - 1), (batch, 1))
        logits, cache = step(previous, cache, t - 1, *context)
        vocabulary = logits.shape[-1]
        new_tokens = t - ops.sum(ops.cast(prompt_mask, "int32"), axis=1) if controls.min_new_tokens else None
        warped = sampler.warp(controls(logits[:, -1, :], seen, new_tokens, stop_token_ids, buffer, t))
        with keras.StatelessScope(state_mapping=[(vessel.state, seed_state)]) as scope:
            sampled = sampler.choose(warped, vessel)
        advanced = scope.get_current_value(vessel.state)
        seed_state = seed_state if advanced is None else advanced
        from_prompt = ops.take(prompt_mask, t, axis=1)
        current = ops.reshape(ops.slice(buffer, (0, t), (batch, 1)), (batch,))
        token = ops.where(from_prompt, current, sampled)
        token = ops.where(done, pad_token_id, token)
        buffer = ops.slice_update(buffer, (0, t), ops.reshape(token, (batch, 1)))
        generated = ops.logical_and(ops.logical_not(from_prompt), ops.logical_not(done))
        if with_scores:  # transformers' transition scores: log-softmax of the processed, warped logits
            chosen = ops.take_along_axis(ops.log_softmax(warped, axis=-1), ops.maximum(token, 0)[:, None], axis=-1)
            chosen = ops.where(generated[:, None], chosen, 0.0)
            scores = ops.slice_update(scores, (0, t), ops.cast(chosen, scores.dtype))
        stopped = ops.any(ops.equal(token[:, None], stop_token_ids[None, :]), axis=-1)
        done = ops.logical_or(done, ops.logical_and(generated, stopped))
        done = ops.logical_or(done, t + 1 >= end)
        seen = controls.seen_with(seen, token, vocabulary)
        return (
            t + 1,
            buffer,
            cache,
            done,
            seed_state,
            seen,
            scores,
            prompt_mask,
            end,
            stop_token_ids,
            pad_token_id,
            until,
            context,
        )

    loop_vars = (*state, *constants, context)
    return tuple(while_loop(cond, body, loop_vars)[:7])
