"""Choosing the next token from logits, the one chooser of every decoding loop (`generate`, `stream`,
beam-free export and the server's rows): controls (`controlled`: a bias, an n-gram ban, penalties,
`min_new_tokens`) change the scores, warps (temperature, top-k, top-p, min-p) cut them, and a draw picks a
token. A call's or a row's numbers are `RowSettings`, made from a `GenerationConfig` by `row_values`; what a
compiled loop computes is a `Chooser` (its features), so that new numbers replay the same program.

Each row draws from a counter-based generator: its noise is a function of the row's seed and the
position it reads, never of the other rows, so a seeded row gives the same tokens alone, in a batch, in
`generate`, in the server or in an exported model. (Keras' generators give one stream per call, shared
by every row of a batch.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from keras import ops

from keras_tfm.compat import on_xla_cpu
from keras_tfm.errors import InputError
from keras_tfm.generation.config import GenerationConfig, check_setting
from keras_tfm.layers.arguments import is_integer
from keras_tfm.layers.attention import LARGE_NEGATIVE

GOLDEN = 0x9E3779B9  # the seed of row `i` of a seeded call is `seed + i * GOLDEN` (mod 2**32)
DRAW_BLOCK = 256  # the tokens of a draw's second stage: SmolLM2's 49,152 are 192 blocks


@dataclass(frozen=True)
class Sampler:
    """How to pick the next token. `temperature=0` (the default) is greedy decoding.

    Args:
        temperature: divides the logits before sampling; 0 means argmax.
        top_k: sample only among the `top_k` most likely tokens (0, or at least the vocabulary
            size: no limit).
        top_p: sample only among the smallest set of tokens whose probability reaches `top_p`.
        min_p: sample only among the tokens at least `min_p` times as likely as the likeliest
            (0: no limit).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        for name in ("temperature", "top_k", "top_p", "min_p"):
            check_setting(name, getattr(self, name))

    def __call__(self, logits, seeds, positions):
        """`logits` (rows, vocabulary) -> token ids (rows,), each row's draw keyed by its `seeds` and
        `positions` `(rows,)`: `choose` with this sampler's numbers and no controls."""
        config = GenerationConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)
        settings = config_settings(config)
        return choose(logits, None, settings._replace(seed=seeds), positions, features_of(settings))[0]


def top_k_largest(logits, k: int):
    """`(rows, k)`: each row's `k` largest logits, largest first (`k` a Python int)."""
    return ops.top_k(logits, k, sorted=True)[0]


def sorted_largest(logits, k: int):
    """`top_k_largest` from a sort: JAX serializes `top_k` as a StableHLO composite that TensorFlow's SavedModel
    loader cannot read, and a sort it can."""
    return ops.flip(ops.sort(logits, axis=-1)[:, -k:], axis=-1)


def warp(logits, temperature, top_k=None, top_p=None, min_p=None, largest=top_k_largest, top_k_width: int = 0,
         uncut: bool = False):  # fmt: skip
    """`logits` `(rows, vocabulary)` float32 divided by `temperature`, then every token outside the
    `top_k` likeliest, the nucleus of `top_p` and the tokens at least `min_p` times as likely as the
    likeliest made very negative. Each setting is a number, a scalar tensor, or `(rows, 1)`: each row's (a
    `top_k` of 0 keeps every token); None skips its warp. The top-k cut reads its thresholds from the
    `top_k_width` largest logits (`largest(logits, width)`, largest first; 0 or past the vocabulary: all of
    them, a sort): each row's `top_k` is at most the width, or 0 where the width holds the vocabulary or with
    `uncut` (rows of `top_k` 0 beside rows that cut: they keep every token). The nucleus after a cut reads those
    largest, not a sort of the vocabulary: every other token is cut already (ties with the k-th past the width
    aside); an `uncut` row's is searched."""
    temperature, top_k, top_p, min_p = (
        s if s is None or isinstance(s, (int, float)) else ops.convert_to_tensor(s)
        for s in (temperature, top_k, top_p, min_p)
    )
    logits = logits / (temperature if isinstance(temperature, (int, float)) else ops.maximum(temperature, 1e-6))
    top = None
    if top_k is not None:  # the width's largest, read at k - 1 (a k of 0 reads the last: keeps them all)
        width = min(top_k_width or logits.shape[-1], logits.shape[-1])
        top = largest(logits, width)
        k = ops.reshape(ops.cast(top_k, "int32"), (-1, 1))
        index = ops.where(k > 0, ops.minimum(k, width), width) - 1
        threshold = ops.take_along_axis(top, ops.broadcast_to(index, (ops.shape(top)[0], 1)), axis=1)
        if uncut:
            threshold = ops.where(k > 0, threshold, float("-inf"))
        top = ops.where(top < threshold, LARGE_NEGATIVE, top)  # the cut logits' largest, still descending
        logits = ops.where(logits < threshold, LARGE_NEGATIVE, logits)
    if top_p is not None and uncut:
        logits = ops.where(k > 0, nucleus(logits, top_p, top), nucleus(logits, top_p))
    elif top_p is not None:
        logits = nucleus(logits, top_p, top)
    if min_p is not None:  # transformers' MinPLogitsWarper: p < min_p * max(p) is cut
        probabilities = ops.softmax(logits, axis=-1)
        floor = min_p * ops.max(probabilities, axis=-1, keepdims=True)
        logits = ops.where(probabilities < floor, LARGE_NEGATIVE, logits)
    return logits


def _shift_right(x, bits: int):
    """`x >> bits` of int32 bits read as unsigned (a logical shift)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def _int32(value: int):
    return ops.convert_to_tensor(np.array(value, np.uint32).astype(np.int32))


def _mix(x):
    """lowbias32 (C. Wellons' integer hash) on int32 bits; products wrap modulo 2**32 on every backend."""
    x = ops.bitwise_xor(x, _shift_right(x, 16))
    x = x * _int32(0x7FEB352D)
    x = ops.bitwise_xor(x, _shift_right(x, 15))
    x = x * _int32(0x846CA68B)
    return ops.bitwise_xor(x, _shift_right(x, 16))


def row_uniforms(seeds, positions, width: int):
    """`(rows, width)` float32 uniforms in (0, 1), a function of each row's seed and position only."""
    row_keys = _mix(ops.bitwise_xor(_mix(seeds), positions * _int32(GOLDEN)))
    bits = _mix(ops.expand_dims(row_keys, 1) + ops.arange(width, dtype="int32")[None, :])
    # 23 bits: k + 0.5 is exact in float32 for k < 2**23, so u < 1 (with 24, the largest k rounds to u = 1,
    # whose Gumbel noise is infinite: a masked token drawn, once in 2**24 draws)
    return (ops.cast(_shift_right(bits, 9), "float32") + 0.5) / float(1 << 23)


def draw(warped, seeds, positions):
    """A token of each row drawn from the softmax of its `warped` logits, the randomness keyed by its `seeds` and
    `positions` `(rows,)` int32, in two stages: a block of `DRAW_BLOCK` tokens by the blocks' probabilities (the
    inverse of their cumulative sum at one uniform), then a token of that block (Gumbel-max). That is the softmax's
    distribution, for two logarithms per token of one block rather than of the whole vocabulary (16 rows of 49,152
    tokens: 0.56 ms against 11.7 ms a step on JAX, 2-core Intel Xeon)."""
    seeds, positions = ops.convert_to_tensor(seeds, "int32"), ops.convert_to_tensor(positions, "int32")
    width = ops.shape(warped)[-1]
    blocks = -(-width // DRAW_BLOCK)
    # padded past the vocabulary with -inf: no mass, and never drawn even where every token is masked
    padded = ops.pad(ops.cast(warped, "float32"), ((0, 0), (0, blocks * DRAW_BLOCK - width)), constant_values=-np.inf)
    grouped = ops.reshape(padded, (-1, blocks, DRAW_BLOCK))
    mass = ops.sum(ops.exp(grouped - ops.max(padded, axis=-1)[:, None, None]), axis=-1)  # (rows, blocks)
    cumulative = ops.cumsum(mass, axis=-1)
    uniforms = row_uniforms(seeds, positions, DRAW_BLOCK + 1)  # the block's, then the block's tokens' noise
    # the first block whose cumulative mass reaches the uniform's share: never one without mass
    block = ops.sum(ops.cast(cumulative < uniforms[:, :1] * cumulative[:, -1:], "int32"), axis=-1)
    block = ops.minimum(block, blocks - 1)
    chosen = ops.take_along_axis(grouped, ops.reshape(block, (-1, 1, 1)), axis=1)[:, 0, :]
    inner = ops.argmax(chosen - ops.log(-ops.log(uniforms[:, 1:])), axis=-1)
    return ops.cast(block * DRAW_BLOCK + ops.cast(inner, "int32"), "int32")


def row_seeds(seed: int | None, rows: int) -> np.ndarray:
    """The seeds of `rows` rows of a call seeded with `seed` (None: a random one), int32 `(rows,)`."""
    seed = int(np.random.randint(0, 2**32)) if seed is None else int(seed)
    return ((seed + np.arange(rows, dtype=np.int64) * GOLDEN) % 2**32).astype(np.uint32).astype(np.int32)


def traced_row_seeds(seed, rows):
    """`row_seeds` of a traced int32 scalar `seed` (an exported model's input)."""
    return ops.cast(seed, "int32") + ops.arange(rows, dtype="int32") * _int32(GOLDEN)


def nucleus(logits, top_p, descending=None):
    """`logits` `(rows, vocabulary)` with every token outside the smallest set whose probability reaches
    `top_p` (a number, or `(rows, 1)`: each row's) made very negative; the likeliest is always kept, and a row
    of `top_p` 1 is unchanged. `descending`: the logits' largest, largest first, where no other token has
    probability (after a top-k cut); none: the threshold is searched (`nucleus_floor`), not sorted for."""
    if descending is not None:
        probabilities = ops.softmax(descending, axis=-1)
        mass_before = ops.cumsum(probabilities, axis=-1) - probabilities
        threshold = ops.min(ops.where(mass_before < top_p, descending, -LARGE_NEGATIVE), axis=-1, keepdims=True)
        return ops.where(logits < threshold, LARGE_NEGATIVE, logits)
    probabilities, top_p = ops.softmax(logits, axis=-1), ops.convert_to_tensor(top_p, "float32")
    cut = ops.where(probabilities > nucleus_floor(probabilities, top_p), logits, LARGE_NEGATIVE)
    return ops.where(top_p >= 1.0, logits, cut)


def nucleus_floor(probabilities, top_p):
    """`(rows, 1)`: for each row a value just below its smallest kept probability, the smallest whose strictly
    larger probabilities hold less than `top_p` (the last a sort's cumulative sum keeps): 48 halvings of [0, 1],
    after which the two ends are neighbouring float32 values about any kept probability over 6e-8. A few passes
    over the row, where XLA:CPU's sort of a vocabulary took 15-35x longer."""
    rows = ops.shape(probabilities)[0]
    low = ops.zeros((rows, 1), "float32")  # every token above it: mass >= top_p
    high = ops.ones((rows, 1), "float32")  # no token above it: mass 0 < top_p
    for _ in range(48):
        middle = low + (high - low) / 2
        below = ops.sum(ops.where(probabilities > middle, probabilities, 0.0), -1, keepdims=True) < top_p
        high, low = ops.where(below, middle, high), ops.where(below, low, middle)
    return low


def penalized(scores, seen, penalty):
    """transformers' repetition penalty: the scores of the tokens `seen` divided by `penalty` where
    positive, multiplied where negative (a number, or `(rows, 1)`: each row's)."""
    return ops.where(seen, ops.where(scores < 0, scores * penalty, scores / penalty), scores)


def seen_counted(seen, hot, generated):
    """Seen counts `(rows, vocabulary)` int32, `2 * generated + in the prompt` for each token, with the
    tokens `hot` (one-hot, int32): counted twice where the row `generated` them `(rows,)`, else marked."""
    if generated is None:
        return seen + 2 * hot
    return ops.where(ops.expand_dims(generated, 1), seen + 2 * hot, ops.maximum(seen, hot))


def counted_penalties(scores, seen, frequency, presence):
    """OpenAI's frequency and presence penalties (numbers, or `(rows, 1)`: each row's) from seen counts
    (`seen_counted`): `count * frequency + (count > 0) * presence` subtracted, the prompt not counted."""
    count = ops.cast(seen // 2, "float32")
    return scores - count * frequency - ops.cast(count > 0, "float32") * presence


class RowSettings(NamedTuple):
    """Each row's sampling, `GenerationConfig`'s fields of the same names: `temperature` (0: greedy), `top_k`
    (int32, 0: no limit), `top_p`, `min_p`, `repetition_penalty`, `frequency_penalty`, `presence_penalty`
    (float32), `min_new_tokens` (int32), and `seed` (int32), each `(rows,)` (the server's rows, each its own)
    or a scalar (`generate`'s call, one for every row)."""

    temperature: object
    top_k: object
    top_p: object
    min_p: object
    repetition_penalty: object
    frequency_penalty: object
    presence_penalty: object
    min_new_tokens: object
    seed: object


class Features(NamedTuple):
    """What a compiled chooser computes, fixed for its function: whether any row samples, the width of its
    top-k cut (`top_k`, an int: 0 none; else every sampling row's `top_k` is at most it; `top_k_width`), whether
    a row that samples keeps every token beside rows that cut (`uncut`), a nucleus (`top_p` < 1)
    or a cut by `min_p`, penalizes repeats (`penalty`: transformers' repetition penalty; `counts`: OpenAI's
    frequency and presence penalties), and whether the host gives each row a bias over the vocabulary
    (`biased`: OpenAI's `logit_bias`, and constrained decoding's token masks as `LARGE_NEGATIVE` biases in
    chunks of one step), whether the chunk also returns log-probabilities (`logprobs`: OpenAI's `logprobs`),
    and whether a row's stop tokens wait for its `min_new_tokens`. Rows that do not are unchanged by the
    others' features."""

    sampling: bool = False
    top_k: int = 0
    uncut: bool = False
    nucleus: bool = False
    min_p: bool = False
    penalty: bool = False
    counts: bool = False
    biased: bool = False
    logprobs: bool = False
    min_new_tokens: bool = False


def choose(logits, seen, settings: RowSettings, positions, features: Features, bias=None, banned=None,
           new_tokens=None, stop_token_ids=None, largest=top_k_largest, branch: bool = False):  # fmt: skip
    """The one chooser of every decoding loop: each row's next token from its `logits` `(rows, vocabulary)`,
    `(token (rows,) int32, warped)`, `warped` the scores it was drawn from (greedy rows: the controlled
    ones). First `controlled`, then greedy (temperature 0) or a draw from the warped scores (`warp`, with
    `largest` and the width `features.top_k`), keyed by the row's seed and position. With `branch` (a
    compiled loop that takes branches, `compiled.takes_branches`), a call in which no row samples skips the
    warps and the draw: rows of greedy requests then cost what a greedy chooser's do beside a sampling one."""
    scores = controlled(logits, seen, settings, features, bias, banned, new_tokens, stop_token_ids)
    greedy = first_largest(scores)
    if not features.sampling:
        return greedy, scores
    sampling = ops.convert_to_tensor(settings.temperature) > 0

    def sampled():
        warped = warp(scores, _column(settings.temperature), top_k=_column(settings.top_k) if features.top_k else None,
                      top_p=_column(settings.top_p) if features.nucleus else None,
                      min_p=_column(settings.min_p) if features.min_p else None, largest=largest,
                      top_k_width=features.top_k, uncut=features.uncut)  # fmt: skip
        drawn = draw(warped, ops.zeros_like(greedy) + ops.cast(settings.seed, "int32"), positions)
        return ops.where(sampling, drawn, greedy), warped

    return ops.cond(ops.any(sampling), sampled, lambda: (greedy, scores)) if branch else sampled()


def first_largest(scores):
    """`(rows,)` int32: the index of each row's largest score, the first where several tie (`argmax`'s; a row with
    a NaN: 0 or a NaN's). On XLA:CPU, as two plain reductions: its argmax, one reduction of (value, index) pairs,
    is 5x slower (16 rows of 49,152 scores: 2.0 against 0.4 ms, JAX, 2-core AMD EPYC); PyTorch's is faster alone."""
    if not on_xla_cpu():
        return ops.cast(ops.argmax(scores, axis=-1), "int32")
    width = ops.shape(scores)[-1]
    hits = ops.logical_not(scores < ops.max(scores, axis=-1, keepdims=True))  # never empty, NaNs or not
    return ops.min(ops.where(hits, ops.arange(width, dtype="int32")[None, :], width), axis=-1)


def controlled(logits, seen, settings: RowSettings, features: Features, bias=None, banned=None, new_tokens=None,
               stop_token_ids=None):  # fmt: skip
    """`logits` `(rows, vocabulary)` as float32 scores changed by the controls, in transformers' order: the
    host's `bias` added (with `features.biased`), the tokens `banned` (`(rows, vocabulary)` bool: an n-gram
    ban) made very negative in rows where that leaves a token the bias allows, the penalties on the tokens
    `seen` (int32 counts, `seen_counted`), and with `features.min_new_tokens` the `stop_token_ids` (1-D) made
    very negative in rows whose `new_tokens` `(rows,)` are fewer than their `min_new_tokens`, unless the row
    allows no other token (a grammar's end)."""
    scores = ops.cast(logits, "float32")
    if features.biased:
        scores = scores + bias
    if banned is not None:  # unless it bans every token the bias allows (a grammar's): then the grammar wins
        allowed = scores > LARGE_NEGATIVE / 2
        held = ops.any(ops.logical_and(allowed, ops.logical_not(banned)), axis=-1, keepdims=True)
        scores = ops.where(ops.logical_and(banned, held), LARGE_NEGATIVE, scores)
    if features.penalty:
        scores = penalized(scores, seen > 0, _column(settings.repetition_penalty))
    if features.counts:
        scores = counted_penalties(
            scores, seen, _column(settings.frequency_penalty), _column(settings.presence_penalty)
        )
    if features.min_new_tokens:
        is_stop = ops.any(ops.arange(scores.shape[-1])[:, None] == stop_token_ids[None, :], axis=-1)
        early = _column(new_tokens) < _column(settings.min_new_tokens)
        # a row whose mask leaves it nothing but a stop ends: waiting would choose a token it forbids
        others = ops.any(ops.logical_and(scores > LARGE_NEGATIVE / 2, ops.logical_not(is_stop)[None, :]), axis=-1,
                         keepdims=True)  # fmt: skip
        scores = ops.where(ops.logical_and(ops.logical_and(early, others), is_stop[None, :]), LARGE_NEGATIVE, scores)
    return scores


def _column(setting):
    """A setting, one for every row (a scalar) or each row's `(rows,)`, as `(rows or 1, 1)`."""
    return ops.reshape(ops.convert_to_tensor(setting), (-1, 1))


def bias_of(logit_bias, vocabulary_size: int) -> np.ndarray:
    """`(vocabulary,)` float32: what `logit_bias` (`(id, bias)` pairs) adds to each token's score, made on the
    host for every loop (`generate`'s and the server's rows)."""
    bias = np.zeros(vocabulary_size, "float32")
    for token, value in logit_bias or ():
        bias[token] += value
    return bias


def check_pad_id(owner: str, pad_token_id, vocabulary_size: int) -> None:
    """Refuses a `pad_token_id` that is not an id of the vocabulary."""
    if not is_integer(pad_token_id) or not 0 <= pad_token_id < vocabulary_size:
        raise InputError(
            f"`pad_token_id` must be an id in [0, vocabulary_size={vocabulary_size}); received {pad_token_id!r}.",
            "pad_token_id",
            caller=owner,
        )


def row_values(config: GenerationConfig, seed: int, dtypes: bool = False) -> tuple:
    """A row's `RowSettings` values from its `config` (each field of the config's name) and `seed` (with
    `dtypes`, `(value, dtype)` pairs: int32 for integer fields, float32 for the others)."""
    fields = GenerationConfig.fields()
    values = (*(getattr(config, name) for name in RowSettings._fields[:-1]), seed)
    kinds = (*("int32" if isinstance(fields[name].default, int) else "float32" for name in RowSettings._fields[:-1]),
             "int32")  # fmt: skip
    return tuple(zip(values, kinds)) if dtypes else values


def config_settings(config: GenerationConfig, seed: int = 0) -> RowSettings:
    """The `RowSettings` of a call decoding as `config` says, as NumPy scalars (`seed` stands for the rows')."""
    return RowSettings(*(np.asarray(value, dtype) for value, dtype in row_values(config, seed, dtypes=True)))


def features_of(settings: RowSettings) -> Features:
    """The features rows of these `settings` (NumPy scalars, or each row's `(rows,)`) need."""
    temperature, top_k, top_p, min_p, repetition, frequency, presence, minimum = (
        np.reshape(value, -1) for value in settings[:-1]
    )
    sampling = temperature > 0
    return Features(
        bool(sampling.any()),
        top_k_width(top_k[sampling]),
        bool((top_k[sampling] > 0).any() and (top_k[sampling] == 0).any()),
        bool((top_p[sampling] < 1).any()),
        bool((min_p[sampling] > 0).any()),
        bool((repetition != 1).any()),
        bool((frequency != 0).any() or (presence != 0).any()),
        min_new_tokens=bool((minimum > 0).any()),
    )


def top_k_width(top_k: np.ndarray) -> int:
    """The top-k width of rows that sample with these `top_k`: 0 where none cuts, else their largest rounded
    up to a power of two (so that every `top_k` up to it runs one program)."""
    if not (top_k > 0).any():
        return 0
    return 1 << (int(top_k.max()) - 1).bit_length()


class Chooser(NamedTuple):
    """What a compiled loop's chooser is made for, a part of its compile key: the `features` it computes (the
    width of its top-k cut among them: every `top_k` up to it runs the same program), the size of its n-gram
    ban (it shapes the comparisons) and how the cut reads the largest logits (`largest`). The numbers come as
    tensors (`RowSettings`, a bias), so that new ones replay the same program."""

    features: Features = Features()
    no_repeat_ngram_size: int = 0
    largest: Callable = top_k_largest


def chooser_of(settings: RowSettings, no_repeat_ngram_size: int = 0, biased: bool = False) -> Chooser:
    """The chooser of one call's `settings` (NumPy scalars), with an n-gram ban and a host's bias."""
    return Chooser(features_of(settings)._replace(biased=biased), no_repeat_ngram_size)


def tracks_seen(features: Features) -> bool:
    """Whether the loop keeps what each row has seen (`initial_seen`, `seen_with`): for the penalties."""
    return features.penalty or features.counts


def initial_seen(buffer, start, vocabulary_size: int, features: Features):
    """`(rows, vocabulary)` int32: 1 for each token `buffer[:, :start]` holds (`start`: a scalar, or each row's
    `(rows, 1)`): `seen_counted`'s prompt marks, a placeholder where nothing is tracked."""
    if not tracks_seen(features):
        return ops.zeros((ops.shape(buffer)[0], 1), "int32")
    positions = ops.arange(ops.shape(buffer)[1])[None, :] < start
    hits = ops.logical_and(ops.one_hot(buffer, vocabulary_size, dtype="int32") > 0, positions[..., None])
    return ops.cast(ops.any(hits, axis=1), "int32")


def seen_with(seen, token, vocabulary_size: int, features: Features, generated=None):
    """`seen` with each row's `token`, counted where the row `generated` it `(rows,)` (else it is a prompt token:
    seen, not counted; `seen_counted`)."""
    if not tracks_seen(features):
        return seen
    return seen_counted(seen, ops.one_hot(token, vocabulary_size, dtype="int32"), generated)


def banned_ngrams(buffer, t, vocabulary_size: int, n: int):
    """`(rows, vocabulary)`: the tokens that, written at position `t` (a scalar, or each row's own `(rows,)`),
    would repeat an n-gram (`n` tokens) of the row's tokens before `t` in `buffer` (transformers'
    `no_repeat_ngram_size`). Each step compares every earlier n-gram: a `(rows, length, vocabulary)`
    comparison per token."""
    rows, total = buffer.shape
    starts = total - n + 1  # n-grams that fit in the buffer, by their first position
    if starts < 1:
        return ops.zeros((rows, vocabulary_size), "bool")
    t = ops.reshape(ops.cast(t, "int32"), (-1, 1))  # (rows or 1, 1)
    matches = ops.logical_and(ops.arange(starts, dtype="int32")[None, :] + n - 1 < t, t >= n - 1)  # written
    for k in range(n - 1):  # the n-gram's first tokens equal the n - 1 tokens before `t`
        before = ops.take_along_axis(buffer, ops.zeros_like(buffer[:, :1]) + ops.maximum(t - n + 1 + k, 0), axis=1)
        matches = ops.logical_and(matches, buffer[:, k : k + starts] == before)
    following = buffer[:, n - 1 : n - 1 + starts]  # each n-gram's last token
    hits = ops.logical_and(ops.one_hot(following, vocabulary_size, dtype="int32") > 0, matches[..., None])
    return ops.any(hits, axis=1)
