"""Chat templates: a conversation rendered as the checkpoint's prompt text, as transformers'
`apply_chat_template` renders it (the same Jinja sandbox, filters and globals), so that the text and
its ids are transformers' own. Written here rather than importing transformers, which keras_tfm does
not need at run time; tests compare the two."""

from __future__ import annotations

import datetime
import functools
import json

from keras_tfm.errors import InputError


def check_messages(messages, owner: str) -> list[dict]:
    """Refuses what is not a non-empty list of messages, each a dict with a string `role` and a
    `content` (a string, or a list of content parts as multimodal templates take them)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InputError(
            f"messages must be a non-empty list of {{'role': ..., 'content': ...}} dicts; received {messages!r}.",
            "messages",
            caller=owner,
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise InputError(
                f"messages[{index}] must be a dict with a 'role' and a 'content'; received {message!r}.",
                "messages",
                caller=owner,
            )
        calls_only = message["content"] is None and message.get("tool_calls")  # an assistant turn of tool calls
        if not isinstance(message["role"], str) or not (isinstance(message["content"], (str, list)) or calls_only):
            raise InputError(
                f"messages[{index}] needs a string 'role' and a string (or list) 'content'; received {message!r}.",
                "messages",
                caller=owner,
            )
    return [{key: value for key, value in message.items() if value is not None} for message in messages]


def render_chat_template(template: str, messages, add_generation_prompt: bool = True, **variables) -> str:
    """The prompt text of `messages` under the Jinja chat `template`. `variables`: what else the
    template reads (the tokenizer's special tokens such as `bos_token`, `tools`, ...)."""
    import jinja2

    messages = check_messages(messages, "render_chat_template")
    try:
        return _compiled(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as error:
        raise InputError(
            f"the chat template refused the messages: {error}", "messages", caller="render_chat_template"
        ) from None


@functools.lru_cache(maxsize=16)
def _compiled(template: str):
    import jinja2
    from jinja2.ext import loopcontrols  # a submodule: `import jinja2` alone does not load it
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' filter: Jinja's own escapes HTML characters
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.datetime.now().strftime(format)
    return environment.from_string(template)
