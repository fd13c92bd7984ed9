"""Tool calls in a model's text, as the families we ship write them, read into OpenAI's `tool_calls`.

- Qwen2.5, Hermes and most chat templates since: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  one block per call, text around them the reply's content.
- Llama 3.1 and 3.2: the whole reply one JSON object `{"name": ..., "parameters": {...}}` (after
  `<|python_tag|>`, a special token the text no longer holds).
- Mistral: `[TOOL_CALLS]` (special, gone from the text) then a JSON list of `{"name", "arguments"}`.

A call is read only when its name is one of the request's tools; text that looks like a call to another
name stays content.
"""

from __future__ import annotations

import json
import re
import uuid

HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    """`(content, tool_calls)` of a reply's `text` for tools named `names`: the calls in OpenAI's shape
    (`{"id", "type": "function", "function": {"name", "arguments": a JSON string}}`) and the text that
    is not a call (None where nothing is left); `(text, [])` where it holds no call."""
    calls = []
    for block in HERMES.findall(text):
        call = _call(_json(block), names, "arguments")
        if call is None:
            return text, []
        calls.append(call)
    if calls:
        content = HERMES.sub("", text).strip()
        return content or None, calls
    whole = _json(text.strip())
    if isinstance(whole, dict) and (call := _call(whole, names, "parameters") or _call(whole, names, "arguments")):
        return None, [call]  # Llama's
    if isinstance(whole, list) and whole:  # Mistral's
        calls = [_call(item, names, "arguments") for item in whole]
        if all(calls):
            return None, calls
    return text, []


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(value, names: set[str], arguments_key: str) -> dict | None:
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get(arguments_key, {})
    if not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": value["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def template_messages(messages: list[dict]) -> list[dict]:
    """A conversation as chat templates read it (transformers' convention): an assistant turn's tool
    calls with their `arguments` as objects, not OpenAI's JSON strings."""
    rendered = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [
                {**call, "function": {**call["function"], "arguments": _json(call["function"]["arguments"])}}
                for call in message["tool_calls"]
            ]
            message = {**message, "tool_calls": calls}
        rendered.append(message)
    return rendered
