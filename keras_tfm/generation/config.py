"""`GenerationConfig`: every setting of a decoding call once, with its range and its help.

`generate`, `stream`, `chat` and `translate` take one (their keyword arguments override its fields), the
command line derives its flags from its fields, the server maps OpenAI's request fields onto it, and
`export` fixes one into the exported loop. A field's check lives here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable

import numpy as np

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import is_integer, is_number


def _integer(low: int) -> tuple[Callable, str]:
    return (lambda v: is_integer(v) and v >= low), f"an integer >= {low}"


def _number(low: float, high: float = math.inf, open_low: bool = False) -> tuple[Callable, str]:
    def fits(v):
        return is_number(v) and (low < v if open_low else low <= v) and v <= high

    bounds = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
    return fits, (
        f"a finite number {'>' if open_low else '>='} {low:g}" if high == math.inf else f"a number in {bounds}"
    )


def _optional(check: tuple[Callable, str]) -> tuple[Callable, str]:
    return (lambda v: v is None or check[0](v)), f"{check[1]}, or None"


def _ids(v) -> bool:
    values = [v] if is_integer(v) else v
    flat = isinstance(values, (list, tuple, np.ndarray)) and np.ndim(values) == 1
    return v is None or (flat and all(is_integer(i) and i >= 0 for i in np.asarray(values).tolist()))


def _bias(v) -> bool:
    pairs = list(v.items()) if isinstance(v, dict) else v
    return v is None or (
        isinstance(pairs, (list, tuple))
        and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and is_integer(p[0]) and p[0] >= 0 and is_number(p[1])
            for p in pairs
        )
    )


def _schema(v) -> bool:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return False
    return v is None or v is True or isinstance(v, dict)


def setting(default, help: str, check: tuple[Callable, str], flag: bool = True):
    """A field: its default, its `help` (the flag's too, where `flag`), and its check `(fits, expected)`."""
    return dataclasses.field(default=default, metadata={"help": help, "check": check, "flag": flag})


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How a decoding call chooses and stops (transformers' meanings and names).

    Each field is listed with its help in `GenerationConfig.fields()`; an out-of-range value is refused
    with an `InputError` naming it. `replace(**overrides)` gives a copy with some fields changed.

    Example:
    >>> config = GenerationConfig(max_new_tokens=20, temperature=0.8, top_p=0.95, seed=0)
    >>> config.replace(temperature=0).greedy
    True
    """

    max_new_tokens: int = setting(128, "the most tokens to add to each prompt", _integer(1))
    min_new_tokens: int = setting(0, "the stop tokens are forbidden before a row has this many", _integer(0))
    stop_token_ids: tuple | int | None = setting(
        None, "an id or ids that end a row (kept); None: the checkpoint's end ids", (_ids, "a token id or a flat list of token ids (such as 2 or [2, 32000]), or None"),
        flag=False,
    )  # fmt: skip
    pad_token_id: int | None = setting(
        None,
        "fills a row after its end; None: the checkpoint's, else 0",
        _optional((is_integer, "an id")),
        flag=False,
    )
    temperature: float = setting(0.0, "divides the logits before a draw; 0 is greedy", _number(0.0))
    top_k: int = setting(0, "draw among the k likeliest tokens; 0: all", _integer(0))
    top_p: float = setting(1.0, "draw within the smallest set of tokens of this probability", _number(0.0, 1.0, True))
    min_p: float = setting(0.0, "draw among tokens at least this fraction as likely as the likeliest", _number(0, 1))
    repetition_penalty: float = setting(
        1.0, "> 1 discourages tokens already in the sequence", _number(0.0, open_low=True)
    )
    frequency_penalty: float = setting(
        0.0, "subtracted from a token's logit once per time it was generated (OpenAI's)", _number(-2.0, 2.0)
    )
    presence_penalty: float = setting(
        0.0, "subtracted from the logit of each token generated already (OpenAI's)", _number(-2.0, 2.0)
    )
    no_repeat_ngram_size: int = setting(0, "n > 0 forbids repeating an n-gram of the sequence", _integer(0))
    logit_bias: tuple | dict | None = setting(
        None, "token id -> a number added to its logit before a token is chosen (-100 bans it, 100 forces it)", (_bias, "a mapping of token ids to finite numbers, such as {50256: -100}, or None"),
        flag=False,
    )  # fmt: skip
    num_beams: int = setting(1, "> 1 runs beam search (deterministic)", _integer(1))
    length_penalty: float = setting(
        1.0, "beams are ranked by log-probability / length ** this", (is_number, "a finite number")
    )
    num_return_sequences: int = setting(1, "continuations per prompt (beams or draws)", _integer(1), flag=False)
    seed: int | None = setting(None, "makes sampling reproducible", _optional((is_integer, "an integer")))
    json_schema: str | dict | bool | None = setting(
        None, "the new text is JSON that follows this schema (True: any JSON object), by constrained decoding", (_schema, "a JSON schema (a dict or its JSON text), True for any object, or None"),
        flag=False,
    )  # fmt: skip

    def __post_init__(self):
        for field in dataclasses.fields(self):
            fits, expected = field.metadata["check"]
            value = getattr(self, field.name)
            if not fits(value):
                raise InputError(f"`{field.name}` must be {expected}; received {value!r:.80}.", field.name)
        if self.stop_token_ids is not None:  # one id or a list: a tuple of ints, hashable
            object.__setattr__(
                self, "stop_token_ids", tuple(np.asarray(self.stop_token_ids, "int64").reshape(-1).tolist())
            )
        if self.logit_bias is not None:  # a sorted tuple of (id, float) pairs: hashable, one per id
            pairs = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
            object.__setattr__(self, "logit_bias", tuple(sorted({int(i): float(b) for i, b in pairs}.items())) or None)
        if self.json_schema is not None:  # its JSON text, keys sorted: hashable, one per schema
            schema = {"type": "object"} if self.json_schema is True else self.json_schema
            schema = json.loads(schema) if isinstance(schema, str) else schema
            object.__setattr__(self, "json_schema", json.dumps(schema, sort_keys=True))
            if self.num_beams != 1:
                raise InputError(
                    f"constrained decoding chooses one token at a time by the grammar; received num_beams="
                    f"{self.num_beams!r} with it.",
                    "json_schema",
                )
        if self.num_beams > 1 and self.num_return_sequences > self.num_beams:
            raise InputError(
                f"beam search returns at most its `num_beams`={self.num_beams} beams; received "
                f"num_return_sequences={self.num_return_sequences}.",
                "num_return_sequences",
            )
        if self.num_beams == 1 and self.greedy and self.num_return_sequences > 1:
            raise InputError(
                f"greedy decoding has one continuation per prompt; received num_return_sequences="
                f"{self.num_return_sequences} (sample with a `temperature` > 0, or search with `num_beams`).",
                "num_return_sequences",
            )

    @classmethod
    def fields(cls) -> dict[str, dataclasses.Field]:
        return {field.name: field for field in dataclasses.fields(cls)}

    @classmethod
    def of(cls, config: GenerationConfig | None, caller: str, **overrides) -> GenerationConfig:
        """`config` (None: the defaults) with the `overrides` that are not None, checked; an unknown name
        or a bad value is an `InputError` naming `caller`."""
        if config is not None and not isinstance(config, GenerationConfig):
            raise InputError(f"expected a GenerationConfig or None; received {config!r:.80}.", "config", caller)
        unknown = sorted(set(overrides) - set(cls.fields()))
        if unknown:
            raise InputError(
                f"unknown decoding setting {unknown[0]!r}; the settings are {', '.join(cls.fields())}.",
                unknown[0],
                caller,
            )
        try:
            return (config or cls()).replace(**{k: v for k, v in overrides.items() if v is not None})
        except InputError as error:
            raise InputError(error.message, error.argument, caller) from None

    def replace(self, **overrides) -> GenerationConfig:
        return dataclasses.replace(self, **overrides)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_setting(name: str, value) -> None:
    """Refuses a value outside the range of the `GenerationConfig` field `name`."""
    fits, expected = GenerationConfig.fields()[name].metadata["check"]
    if not fits(value):
        raise InputError(f"`{name}` must be {expected}; received {value!r}.", name)
