"""Tool calls in a model's text, as the families we ship write them, read into OpenAI's `tool_calls`.

- Qwen2.5, Hermes and most chat templates since: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  one block per call, text around them the reply's content.
- Llama 3.1 and 3.2: the whole reply one JSON object `{"name": ..., "parameters": {...}}` (after
  `<|python_tag|>`, a special token the text no longer holds).
- Mistral: `[TOOL_CALLS]` (special, gone from the text) then a JSON list of `{"name", "arguments"}`.

A call is read only when its name is one of the request's tools; text that looks like a call to another
name stays content. `parse_tool_calls` reads a whole reply, `StreamedCalls` one as it streams.
"""

from __future__ import annotations

import functools
import json
import re
import uuid

OPEN, CLOSE = "<tool_call>", "</tool_call>"
HERMES = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)


def parse_tool_calls(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    """`(content, tool_calls)` of a reply's `text` for tools named `names`: the calls in OpenAI's shape
    (`{"id", "type": "function", "function": {"name", "arguments": a JSON string}}`) and the text that
    is not a call (None where nothing is left); `(text, [])` where it holds no call. A last call that the
    reply's end cut in its arguments has them as written (`finished_calls` tells)."""
    calls, closed = [], _closed(text)
    blocks = HERMES.findall(closed)
    for index, block in enumerate(blocks):
        call = _call(_json(block), names, "arguments")
        if call is None and index == len(blocks) - 1 and closed != text:  # from the text as it streamed
            call = _cut_call(text[text.rfind(OPEN) + len(OPEN) :], names)
        if call is None:
            return text, []
        calls.append(call)
    if calls:
        content = HERMES.sub("", closed).strip()
        return content or None, calls
    whole = _json(text.strip())
    if isinstance(whole, dict) and (call := _call(whole, names, "parameters") or _call(whole, names, "arguments")):
        return None, [call]  # Llama's
    if isinstance(whole, list) and whole:  # Mistral's
        calls = [_call(item, names, "arguments") for item in whole]
        if all(calls):
            return None, calls
    return text, []


def _closed(text: str) -> str:
    """`text` with its last block closed where the reply ended in it (`max_tokens` cut its closing tag,
    whole or in part): `StreamedCalls` has sent such a call by then, and vLLM reads it so."""
    opened = text.rfind(OPEN)
    if opened < 0 or CLOSE in text[opened:]:
        return text
    cut = next((size for size in range(len(CLOSE) - 1, 0, -1) if text.endswith(CLOSE[:size])), 0)
    return text[: len(text) - cut] + CLOSE


# the start of a Hermes call up to its arguments' value: `{"name": "...", "arguments": `
HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


def _cut_call(block: str, names: set[str]) -> dict | None:
    """The call of a block that the reply's end cut (`max_tokens`) as `StreamedCalls` sent it: its
    arguments whole where they ended before the cut, else their text as the model wrote it (not JSON);
    None where the block does not name a tool first."""
    head = HERMES_HEAD.match(block)
    name = _json(head.group(1)) if head else None
    if not isinstance(name, str) or name not in names or block[head.end() : head.end() + 1] != "{":
        return None
    call = _call({"name": name}, names, "arguments")
    try:
        call["function"]["arguments"] = json.dumps(json.JSONDecoder().raw_decode(block, head.end())[0])
    except ValueError:
        call["function"]["arguments"] = block[head.end() :]
    return call


def finished_calls(calls: list[dict]) -> bool:
    """Whether a reply's `calls` are all whole (`finish_reason` "tool_calls"), not cut in their arguments
    (the reply's own end says why: "length")."""
    return bool(calls) and all(_json(call["function"]["arguments"]) is not None for call in calls)


class StreamedCalls:
    """One choice's reply to a request with tools, read as it streams, into OpenAI's deltas: the text as
    `content` until a call opens (`<tool_call>`), the call's id and name once its text names them, then
    its `arguments` piece by piece as the model writes them (the model's JSON text, not re-encoded).
    A block that names another tool, or whose name follows its arguments, is sent once it closes (as
    content, or as one call). A reply that begins with `{` or `[` (Llama's and Mistral's calls are the
    whole reply) is read whole at its end, by `parse_tool_calls`."""

    def __init__(self, names: set[str]):
        self.names, self.calls = names, 0
        self._text, self._done, self._state = "", 0, "start"  # start, content, call, whole, ended
        self._open_call(None)

    def feed(self, piece: str, final: bool = False) -> list[dict]:
        """The deltas `piece` completes (with `final`, the reply's last: everything left)."""
        self._text += piece
        deltas, before = [], None
        while before != (self._state, self._done, self._arguments_at):
            before = (self._state, self._done, self._arguments_at)
            deltas += getattr(self, f"_{self._state}")(final)
        return deltas

    @property
    def cut(self) -> bool:
        """Whether the reply ended inside a call's arguments (sent as they were written, not JSON)."""
        return self._state == "call" and self._arguments_at is not None and not self._complete

    def _open_call(self, arguments_at: int | None) -> None:
        """Where an open call's arguments' text not yet sent starts, and the scan of its JSON from there."""
        self._arguments_at, self._depth, self._string, self._escaped, self._complete = (
            arguments_at,
            0,
            False,
            False,
            False,
        )

    def _start(self, final: bool) -> list[dict]:
        begun = self._text.lstrip()
        if begun or final:
            self._state = "whole" if begun[:1] in ("{", "[") else "content"
        return []

    def _whole(self, final: bool) -> list[dict]:
        if not final:
            return []
        content, calls = parse_tool_calls(self._text, self.names)
        self._done, self.calls, self._state = len(self._text), len(calls), "ended"
        deltas = [{"content": content}] if content else []
        return deltas + [{"tool_calls": [{"index": k, **call}]} for k, call in enumerate(calls)]

    def _ended(self, final: bool) -> list[dict]:
        return []

    def _content(self, final: bool) -> list[dict]:
        opened = self._text.find(OPEN, self._done)
        end = opened if opened >= 0 else len(self._text) - (0 if final else _held(self._text, OPEN))
        text, self._done = self._text[self._done : end], max(self._done, end)
        if opened >= 0:
            self._done, self._state, self._arguments_at = opened + len(OPEN), "call", None
        return [{"content": text}] if text else []

    def _call(self, final: bool) -> list[dict]:
        block = self._text[self._done :]
        if self._arguments_at is None:
            return self._head(block, final)
        if not self._complete:
            return self._arguments()
        closed = self._text.find(CLOSE, self._arguments_at)
        if closed >= 0:  # the call's text ended: back to content
            self._done, self._state, self._arguments_at = closed + len(CLOSE), "content", None
        return []

    def _head(self, block: str, final: bool) -> list[dict]:
        """The call's id and name where the block's text names one of the tools first."""
        head, closed = HERMES_HEAD.match(block), block.find(CLOSE)
        name = _json(head.group(1)) if head else None
        if isinstance(name, str) and name in self.names and block[head.end() : head.end() + 1] == "{":
            self._open_call(self._done + head.end())
            self.calls += 1
            call = _call({"name": name}, self.names, "arguments")
            call["function"]["arguments"] = ""
            return [{"tool_calls": [{"index": self.calls - 1, **call}]}]
        if closed < 0 and not final:
            return []
        block = block[:closed] if closed >= 0 else block  # not a call as it streamed: the block whole
        self._state, self._done = "content", self._done + len(block) + (len(CLOSE) if closed >= 0 else 0)
        call = _call(_json(block), self.names, "arguments")
        if call is None:
            return [{"content": OPEN + block + (CLOSE if closed >= 0 else "")}]
        self.calls += 1
        return [{"tool_calls": [{"index": self.calls - 1, **call}]}]

    def _arguments(self) -> list[dict]:
        """The arguments' JSON text from where it was last sent, up to its closing brace."""
        start = end = self._arguments_at
        while end < len(self._text) and not self._complete:
            character = self._text[end]
            if self._string:
                self._escaped, self._string = not self._escaped and character == "\\", self._escaped or character != '"'
            elif character == '"':
                self._string = True
            elif character in "{[":
                self._depth += 1
            elif character in "}]":
                self._depth -= 1
                self._complete = self._depth == 0
            end += 1
        self._arguments_at = end
        piece = self._text[start:end]
        return [{"tool_calls": [{"index": self.calls - 1, "function": {"arguments": piece}}]}] if piece else []


def _held(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag` (held until it is known)."""
    return next((n for n in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:n])), 0)


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


def template_messages(messages: list[dict], renders_calls: bool = True) -> list[dict]:
    """A conversation as chat templates read it (transformers' convention): an assistant turn's tool
    calls with their `arguments` as objects, not OpenAI's JSON strings. Where the template does not
    render calls (`renders_calls` False), they are written into the turn's text as `<tool_call>` blocks,
    so that the model still sees what it called."""
    rendered = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [
                {**call, "function": {**call["function"], "arguments": _json(call["function"]["arguments"])}}
                for call in message["tool_calls"]
            ]
            message = {**message, "tool_calls": calls}
            if not renders_calls:
                blocks = [f"{OPEN}\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}\n{CLOSE}" for c in calls]  # fmt: skip
                text = "\n".join(filter(None, [message.get("content"), *blocks]))
                message = {key: value for key, value in message.items() if key != "tool_calls"} | {"content": text}
        rendered.append(message)
    return rendered


PROBE = "keras_tfm_probe_function"  # a name no template writes unless it renders what it is given


@functools.lru_cache(maxsize=8)
def template_renders(template: str) -> tuple[bool, bool]:
    """Whether a chat template renders a request's tools, and an assistant turn's tool calls: each is
    rendered with a function named `PROBE`, and looked for in the text."""
    from keras_tfm.data.chat import render_chat_template

    function = {"type": "function", "function": {"name": PROBE, "parameters": {"type": "object"}}}
    call = {"id": "call_0", "type": "function", "function": {"name": PROBE, "arguments": {}}}
    asked = [{"role": "user", "content": "hi"}]
    answered = [*asked, {"role": "assistant", "content": None, "tool_calls": [call]}]
    shown = []
    for messages, tools in ((asked, [function]), (answered, None)):
        try:
            shown.append(PROBE in render_chat_template(template, messages, add_generation_prompt=False, tools=tools))
        except Exception:  # a template that refuses the probe's shape renders none of it
            shown.append(False)
    return shown[0], shown[1]
