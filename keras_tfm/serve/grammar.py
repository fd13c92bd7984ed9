"""The grammars of OpenAI's requests: `response_format` (JSON, or JSON that follows a schema) and a forced
tool call, held by constrained decoding (`generation.grammar`)."""

from __future__ import annotations

from keras_tfm.serve.requests import RequestError


def response_schema(body: dict) -> dict | None:
    """The JSON schema a chat request's `response_format` asks for: any object for `json_object`, its
    schema for `json_schema`; None for text."""
    kind = body.get("response_format")
    if kind is None or kind == {"type": "text"}:
        return None
    if kind == {"type": "json_object"}:
        return {"type": "object"}
    described = kind.get("json_schema") if isinstance(kind, dict) else None
    schema = described.get("schema") if isinstance(described, dict) else None
    if not isinstance(kind, dict) or kind.get("type") != "json_schema" or not isinstance(schema, dict):
        raise RequestError(
            '`response_format` must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
            f'"json_schema": {{"name": ..., "schema": {{...}}}}}}; received {kind!r:.200}.',
            "response_format",
        )
    return schema


def tool_call_grammar(chat_template: str, tools: list[dict], tool_choice) -> str:
    """The grammar of a reply that calls one of `tools` (`tool_choice` "required") or the function
    `tool_choice` names, written as the chat template's family writes a call (`serve.tools`): Llama 3.1's
    JSON object of `parameters`, Mistral's JSON list, else a Qwen2.5 / Hermes `<tool_call>` block.
    Its arguments follow the function's `parameters` schema."""
    import json

    if isinstance(tool_choice, dict):
        tools = [tool for tool in tools if tool["function"]["name"] == tool_choice["function"]["name"]]
    llama = "<|python_tag|>" in chat_template or "ipython" in chat_template
    key = "parameters" if llama else "arguments"
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                key: tool["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", key],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if "[TOOL_CALLS]" in chat_template:
        call = {"type": "array", "items": call, "minItems": 1, "maxItems": 1}
    call["x-guidance"] = {"whitespace_flexible": False}  # llguidance's option: JSON as json.dumps writes it
    body = f"call: %json {json.dumps(call)}"
    if llama or "[TOOL_CALLS]" in chat_template:
        return f"start: call\n{body}\n"
    return f'start: "<tool_call>\\n" call "\\n</tool_call>"\n{body}\n'
