"""Generating past a model's context, as nanoGPT does: each new token is chosen from the last tokens
that fit, the oldest cropped.

A model with a position table (GPT) cannot look further back than its `max_length`; this lets it go on
writing all the same. The context window slides a quarter at a time: the last three quarters of the
context are decoded again (one compiled prefill) and the next quarter is generated with the cache, so
each token sees between three quarters of the context and all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np


def windows(prompt: list[int], max_new_tokens: int, max_length: int) -> Iterator[tuple[int, int]]:
    """`(kept, count)` for each round: of the tokens so far, the last `kept` are the context, and `count`
    new tokens follow. The rounds add up to `max_new_tokens`."""
    keep = max(1, max_length * 3 // 4)
    length, left = len(prompt), max_new_tokens
    while left:
        kept = length if length + left <= max_length else min(length, keep, max_length - 1)
        count = min(left, max_length - kept)
        yield kept, count
        length, left = length + count, left - count


def cropped_stream(
    stream: Callable[..., Iterator[np.ndarray]],
    prompt: list[int],
    max_new_tokens: int,
    max_length: int,
    seed: int | None,
    stop_token_ids: np.ndarray,
) -> Iterator[np.ndarray]:
    """Yields arrays of new ids, as `stream(context, count, seed=...)` makes them round by round (each
    round's seed drawn from `seed`); ends at a stop id."""
    ids = list(prompt)
    draws = np.random.default_rng(seed)
    for kept, count in windows(prompt, max_new_tokens, max_length):
        round_seed = int(draws.integers(2**31)) if seed is not None else None
        made = 0
        for piece in stream(ids[len(ids) - kept :], count, seed=round_seed):
            ids.extend(int(token) for token in piece)
            made += len(piece)
            yield piece
        if made < count or np.isin(ids[-1:], stop_token_ids).any():
            return
