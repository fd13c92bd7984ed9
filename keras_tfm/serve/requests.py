"""OpenAI request bodies (`/v1/completions`, `/v1/chat/completions`) checked field by field into one
`Job`; a bad field is a `RequestError` that the server answers with a 4xx in OpenAI's error schema."""

from __future__ import annotations

import dataclasses
import json
import math

from keras_tfm.errors import InputError
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.continuous import RowSettings
from keras_tfm.serve.settings import DEFAULTS


class RequestError(Exception):
    """A request the server refuses: its HTTP status, OpenAI's error `type` and the field at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclasses.dataclass
class Job:
    """One request's decoding: its prompt ids, its `GenerationConfig` (OpenAI's fields mapped onto it),
    how many choices, its stop strings, and whether it streams."""

    prompt: list[int]
    config: GenerationConfig
    n: int = 1
    stop: tuple[str, ...] = ()
    stream: bool = False
    chat: bool = False
    logprobs: int | None = None  # None: none; else each token's, and this many likeliest alternatives
    echo: bool = False  # the answer's text starts with the prompt's (completions)
    best_of: int = 1  # continuations drawn (at least `n`), of which the `n` likeliest are answered
    tools: list | None = None  # the functions the chat template is given and the reply's calls are read for
    grammar: str | None = None  # what every reply follows (`response_format`, a forced tool call): llguidance's

    @property
    def max_tokens(self) -> int:
        return self.config.max_new_tokens


def _field_number(body: dict, name: str, default, low: float, high: float, integer: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    kind = int if integer else (int, float)
    # ints compare exactly: a 400-digit one is out of range, not a float overflow
    finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if isinstance(value, bool) or not isinstance(value, kind) or not finite or not low <= value <= high:
        expected = "an integer" if integer else "a number"
        bounds = f" in [{low}, {high}]" if math.isfinite(low) or math.isfinite(high) else ""
        raise RequestError(f"`{name}` must be {expected}{bounds}; received {value!r:.80}.", name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(
            f"`stop` must be a string or a list of up to 4 non-empty strings; received {stop!r}.", "stop"
        )
    return tuple(stops)


# Every request field the server knows, by what it does. Used: decoding follows it. Kept: it changes no
# answer (bookkeeping for OpenAI's own service), accepted and left alone. Off only: not supported yet,
# accepted at the value that asks for nothing (so that a client sending the default still works) and
# refused by name at any other. Any other field is refused by name, as OpenAI refuses it.
USED = {
    "model", "max_tokens", "n", "seed", "stop", "stream", "stream_options", "logit_bias",
    *(name for name in RowSettings._fields if name != "seed"),  # the chooser's settings, as `sampling_fields`
}  # fmt: skip
USED_BY = {
    "completions": {"prompt", "logprobs", "echo", "best_of"},
    "chat": {
        "messages",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "response_format",
    },
}
KEPT = {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "parallel_tool_calls"}
OFF_ONLY = {  # field -> the values that ask for nothing
    "completions": {"suffix": ("",)},
    "chat": {
        "functions": ([],),
        "function_call": ("none",), "modalities": (["text"],),
        "audio": (), "prediction": (), "reasoning_effort": (), "verbosity": (), "web_search_options": (),
    },
}  # fmt: skip


def check_fields(body: dict, chat: bool) -> None:
    """Refuses, by name, a field the server does not know and a feature it does not support yet."""
    endpoint = "chat" if chat else "completions"
    off_only = OFF_ONLY[endpoint]
    for name, value in body.items():
        if name in USED or name in USED_BY[endpoint] or name in KEPT:
            continue
        if name not in off_only:
            raise RequestError(f"unrecognized request argument supplied: {name}.", name)
        if value is not None and value not in off_only[name]:
            raise RequestError(
                f"`{name}` is not supported by this server yet; leave it out"
                + (f" or send {off_only[name][0]!r}" if off_only[name] else "")
                + f"; received {value!r:.100}.",
                name,
            )


def _logit_bias(body: dict, vocabulary_size: int) -> dict[int, float] | None:
    """OpenAI's `logit_bias`: token ids (as strings) to numbers in [-100, 100], ids of the vocabulary."""
    bias = body.get("logit_bias")
    if bias is None:
        return None
    if not isinstance(bias, dict) or len(bias) > 300:
        raise RequestError(
            f"`logit_bias` must be an object of at most 300 token ids; received {bias!r:.100}.", "logit_bias"
        )
    checked = {}
    for key, value in bias.items():
        # ASCII digits alone ("²" is a digit to Python, not to int()), and no more than an id can have
        if not (key.isascii() and key.isdigit() and len(key) <= 10) or int(key) >= vocabulary_size:
            raise RequestError(
                f"`logit_bias` keys must be token ids in [0, {vocabulary_size}); received {key!r:.40}.", "logit_bias"
            )
        checked[int(key)] = _field_number({"logit_bias": value}, "logit_bias", None, -100.0, 100.0)
    return checked or None


# OpenAI's ranges, where its API sets one; the other fields are checked by `GenerationConfig` alone
OPENAI_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "repetition_penalty": (0.01, 10.0)}


def sampling_fields() -> tuple[str, ...]:
    """The `GenerationConfig` fields a request may set by name: those each row of the server's loop
    carries (`continuous.RowSettings`), the seed aside."""
    return tuple(name for name in RowSettings._fields if name != "seed")


def _setting(body: dict, name: str, default):
    """A request's value of the `GenerationConfig` field `name`, of the field's type (and in OpenAI's
    range, where it sets one)."""
    integer = isinstance(GenerationConfig.fields()[name].default, int)
    value = _field_number(body, name, default, *OPENAI_RANGES.get(name, (-math.inf, math.inf)), integer=integer)
    return value if integer else float(value)


@dataclasses.dataclass(frozen=True)
class Defaults:
    """What a request that leaves a field out gets: the checkpoint's generation settings where its
    `generation_config` has them, else OpenAI's (temperature 1, top_p 1), and a finite length."""

    max_tokens: int = DEFAULTS.default_max_tokens
    config: GenerationConfig = GenerationConfig(temperature=1.0)

    @classmethod
    def of(cls, generation_config: dict | None, max_tokens: int = DEFAULTS.default_max_tokens) -> Defaults:
        """The defaults of a model's `generation_config` (as `from_huggingface` reads it from
        `generation_config.json`): `do_sample` false means greedy, as in transformers."""
        config = generation_config or {}
        picked = {name: config[name] for name in sampling_fields() if config.get(name) is not None}
        if config.get("do_sample") is False:
            picked["temperature"] = 0.0
        # checked as a request's
        length = _field_number(
            {"max_tokens": config.get("max_new_tokens") or max_tokens}, "max_tokens", None, 1, 2**31, True
        )
        picked = {name: _setting(picked, name, value) for name, value in picked.items()}
        return cls(length, _config(**{"temperature": 1.0, **picked}))

    def as_dict(self) -> dict:
        return {"max_tokens": self.max_tokens, **{name: getattr(self.config, name) for name in sampling_fields()}}


def parse_job(
    body,
    prompt_ids: list[int],
    context: int,
    max_tokens_limit: int,
    chat: bool,
    defaults: Defaults = Defaults(),
    vocabulary_size: int = 2**31 - 1,
) -> Job:
    """The `Job` of a request body whose prompt encodes to `prompt_ids`, for a model of `context` tokens
    and `vocabulary_size` ids; the fields it leaves out take `defaults`."""
    check_fields(body, chat)
    if not prompt_ids:
        raise RequestError(
            "the prompt encodes to no tokens (an empty prompt, and a tokenizer that adds no start token); "
            "give at least one character.",
            "messages" if chat else "prompt",
        )
    room = context - len(prompt_ids)
    if room < 1:
        raise RequestError(
            f"the prompt has {len(prompt_ids)} tokens; this model's context is {context}, with room for none "
            "to generate.",
            "messages" if chat else "prompt",
        )
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    limit = min(room, max_tokens_limit)
    max_tokens = _field_number(body, name, min(limit, defaults.max_tokens), 1, limit, integer=True)
    stream = _flag(body, "stream")
    sampling = {name: _setting(body, name, getattr(defaults.config, name)) for name in sampling_fields()}
    sampling["seed"] = _field_number(body, "seed", None, -(2**63), 2**63 - 1, integer=True)
    sampling["logit_bias"] = _logit_bias(body, vocabulary_size)
    if sampling["top_p"] == 0:  # no token left to sample from but the likeliest
        sampling.update(temperature=0.0, top_p=1.0)
    job = Job(
        prompt=prompt_ids,
        config=_config(max_new_tokens=max_tokens, **sampling),
        n=(n := _field_number(body, "n", 1, 1, 16, integer=True)),
        stop=_stop(body),
        stream=stream,
        chat=chat,
        logprobs=_logprobs(body, chat),
        echo=_flag(body, "echo"),
        best_of=_field_number(body, "best_of", n, 1, 16, integer=True),
        tools=chat_tools(body) if chat else None,
    )
    if job.best_of < job.n:
        raise RequestError(f"`best_of` must be at least `n`={job.n}; received {job.best_of}.", "best_of")
    if job.best_of > job.n and job.stream:
        raise RequestError("`best_of` cannot be used with `stream` (the best are known at the end).", "best_of")
    return job


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"`{name}` must be true or false; received {value!r:.80}.", name)
    return bool(value)


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives each token's log-probability comes with (None: no log-probabilities): chat's
    `logprobs` (true or false) and `top_logprobs` (0 to 20); the completions' `logprobs` (0 to 5)."""
    if not chat:
        return _field_number(body, "logprobs", None, 0, 5, integer=True)
    wanted = _flag(body, "logprobs")
    top = _field_number(body, "top_logprobs", None, 0, 20, integer=True)
    if top is not None and not wanted:
        raise RequestError("`top_logprobs` needs `logprobs` set to true.", "top_logprobs")
    return (top or 0) if wanted else None


def _config(**settings) -> GenerationConfig:
    """The request's `GenerationConfig`; a value it refuses is a 400 naming the field."""
    try:
        return GenerationConfig(**settings)
    except InputError as error:
        field = {"max_new_tokens": "max_tokens"}.get  # the config's names that OpenAI's requests call otherwise
        raise RequestError(error.words(field), field(error.argument) or error.argument) from None


def chat_tools(body: dict) -> list[dict] | None:
    """The request's functions (OpenAI's `tools`), checked; None without any, or with `tool_choice`
    "none" (the model is not told of them). "required" or a named function forces a call (the app's
    grammar)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    named = isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
    if choice not in (None, "none", "auto", "required") and not named:
        raise RequestError(
            '`tool_choice` must be "none", "auto", "required" or {"type": "function", "function": {"name": '
            f"...}}}}; received {choice!r:.100}.",
            "tool_choice",
        )
    if not tools and (choice == "required" or named):
        raise RequestError("`tool_choice` forces a call: give the functions in `tools`.", "tool_choice")
    if tools is None or tools == [] or choice == "none":
        return None
    if not isinstance(tools, list) or len(tools) > 128 or not all(_is_function(tool) for tool in tools):
        raise RequestError(
            '`tools` must be a list of up to 128 {"type": "function", "function": {"name": ..., "parameters": '
            f"{{...}}}}}} objects; received {tools!r:.200}.",
            "tools",
        )
    if named and not isinstance(choice["function"].get("name"), str):
        raise RequestError(f"`tool_choice.function.name` must be a string; received {choice!r:.100}.", "tool_choice")
    if named and choice["function"]["name"] not in {tool["function"]["name"] for tool in tools}:
        raise RequestError(f"`tool_choice` names a function that is not in `tools`: {choice!r:.100}.", "tool_choice")
    return tools


def _is_function(tool) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return (
        isinstance(tool, dict)
        and tool.get("type") == "function"
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and bool(function["name"])
        and isinstance(function.get("parameters", {}), dict)
    )


def chat_messages(body: dict) -> list[dict]:
    """The conversation of a chat request: a non-empty list of messages with string roles and contents
    (a content given as text parts is joined); an assistant turn may hold `tool_calls` instead of text,
    and a `tool` turn answers one of them (its `tool_call_id`)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list of messages.", "messages")
    return [_message(index, message) for index, message in enumerate(messages)]


def _message(index: int, message) -> dict:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # [{"type": "text", "text": ...}]
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise RequestError(f"messages[{index}].content: only text parts are supported.", "messages")
        content = "".join(part["text"] for part in content)
    role = message.get("role") if isinstance(message, dict) else None
    calls = message.get("tool_calls") if role == "assistant" else None
    if calls is not None and not (isinstance(calls, list) and all(map(_is_call, calls))):
        raise RequestError(
            f'messages[{index}].tool_calls must be a list of {{"id", "type": "function", "function": '
            f'{{"name", "arguments": a JSON object as a string}}}}; received {calls!r:.200}.',
            "messages",
        )
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise RequestError(f"messages[{index}]: a `tool` message needs the `tool_call_id` it answers.", "messages")
    if role not in ("system", "user", "assistant", "developer", "tool") or not (
        isinstance(content, str) or (content is None and calls)
    ):
        raise RequestError(
            f"messages[{index}] must be an object with a `role` (system, user, assistant, tool) and a string "
            f"`content`; received {message!r:.200}.",
            "messages",
        )
    checked = {"role": "system" if role == "developer" else role, "content": content}
    if calls:
        checked["tool_calls"] = calls
    if role == "tool":
        checked["tool_call_id"] = message["tool_call_id"]
    return checked


def _is_call(call) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return False
    try:
        return isinstance(json.loads(function.get("arguments")), dict)
    except (TypeError, ValueError):
        return False


def completion_prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError(f"`prompt` must be a string; received {type(prompt).__name__}.", "prompt")
    return prompt
