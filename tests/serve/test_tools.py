"""Tools and structured output: calls read from each family's replies, streamed as OpenAI streams them,
tool results sent back, and replies held to a JSON schema or a forced call whatever the weights."""

from __future__ import annotations

import concurrent.futures
import json

import pytest

from tests.checks import chat_model
from tests.serve.helpers import MESSAGES, Server, accumulated

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")


@pytest.mark.backend_independent
def test_tool_calls_in_a_reply_are_read_for_each_family():
    from keras_tfm.serve.tools import finished_calls, parse_tool_calls

    names = {"get_weather"}
    content, calls = parse_tool_calls(
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', names
    )  # Qwen2.5 / Hermes
    assert content == "Let me look." and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"} and calls[0]["type"] == "function"
    _, calls = parse_tool_calls('{"name": "get_weather", "parameters": {"city": "Oslo"}}', names)  # Llama 3.1
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    content, calls = parse_tool_calls('[{"name": "get_weather", "arguments": {"city": "Rome"}}]', names)  # Mistral
    assert content is None and len(calls) == 1
    for cut in ("", "\n<", "</tool_call"):  # a call whose closing tag `max_tokens` cut
        content, calls = parse_tool_calls('Cut: <tool_call>\n{"name": "get_weather", "arguments": {}}' + cut, names)
        assert content == "Cut:" and len(calls) == 1 and finished_calls(calls), cut
    content, calls = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa<', names)
    assert content is None and calls[0]["function"]["arguments"] == '{"city": "Pa<'  # cut in its arguments
    assert not finished_calls(calls)
    for text in ('{"name": "delete_files", "arguments": {}}', "<tool_call>not json</tool_call>", "plain",
                 '<tool_call>{"name": "get_weather", "argum'):  # fmt: skip
        assert parse_tool_calls(text, names) == (text, [])  # no call to a tool the request gave, or no call


@pytest.mark.backend_independent
def test_tool_calls_stream_as_openai_streams_them():
    """Fed a character at a time, a reply streams as content until a call opens, then the call's id and
    name, then its arguments piece by piece as they are written; put together, the deltas are the calls
    and content of the whole reply. A block naming another tool is content; Llama's and Mistral's calls
    (the whole reply) and a block whose name follows its arguments come whole at their end."""
    from keras_tfm.serve.tools import StreamedCalls, finished_calls, parse_tool_calls

    def parsed(arguments: str):  # a call cut in its arguments has them as written
        return arguments if arguments.endswith("</") else json.loads(arguments)

    names = {"get_weather", "get_time"}
    arguments = '{"city": "Pa}ri\\"s", "days": [1, {"a": 2}]}'
    replies = [
        f'Let me look.\n<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>',
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        '[{"name": "get_time", "arguments": {}}]',
        'Plain <tool_c text, <tool_call>{"name": "delete_files", "arguments": {}}</tool_call> and more',
        'Cut by max_tokens: <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool',
        'Cut in its arguments: <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa</',
        'Cut after its arguments: <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}} and mo',
    ]
    for reply in replies:
        reader, deltas, fed = StreamedCalls(names), [], []
        for position, character in enumerate(reply):
            new = reader.feed(character)
            deltas += new
            fed += [position] * len(new)
        deltas += reader.feed("", final=True)
        content, calls = accumulated(deltas)
        expected_content, expected = parse_tool_calls(reply, names)
        assert content.strip() == (expected_content or ""), reply
        assert [(name, parsed(text)) for _, name, text in calls] == [
            (call["function"]["name"], parsed(call["function"]["arguments"])) for call in expected
        ]
        assert all(identity.startswith("call_") for identity, _, _ in calls) and reader.calls == len(expected)
        assert reader.cut == (bool(expected) and not finished_calls(expected)), reply
    # the first reply streamed: its text before the call was whole, the call's name before its arguments
    # ended, its arguments (the model's JSON text) in pieces
    reader, deltas, fed = StreamedCalls(names), [], []
    for position, character in enumerate(replies[0]):
        new = reader.feed(character)
        deltas, fed = deltas + new, fed + [position] * len(new)
    head = next(i for i, delta in enumerate(deltas) if delta.get("tool_calls"))
    assert fed[0] < replies[0].index("<tool_call>") and fed[head] <= replies[0].index(arguments)
    pieces = [d["tool_calls"][0]["function"]["arguments"] for d in deltas[head + 1 :] if d.get("tool_calls")]
    assert len(pieces) > 10 and "".join(pieces).startswith(arguments)


def test_the_openai_client_gets_tool_calls_and_sends_tool_results(monkeypatch):
    """Tools go to the chat template; a reply that calls one comes back as `tool_calls` (streamed too); a
    history holding the calls and the tool's answer is taken; a forced call must name one of the tools.
    (The tiny model's text is replaced by a call: its random weights write none.)"""
    model = chat_model(max_length=512)
    model.tokenizer.chat_template = (
        "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}{% for m in messages %}<{{ m['role'] }}>"
        "{{ m['content'] or '' }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}{% endfor %}<assistant>"
    )
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    asked = [{"role": "user", "content": "weather in paris"}]
    expected = model.tokenizer.encode(model.tokenizer.apply_chat_template(asked, tools=[weather]))
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    written = [call]
    monkeypatch.setattr(model, "decode_text", lambda ids: written[0])
    with Server(model) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        request = dict(model="tiny", messages=asked, tools=[weather], max_tokens=4, temperature=0)
        reply = client.chat.completions.create(**request)
        assert reply.usage.prompt_tokens == len(expected)  # the tools were rendered
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (called,) = choice.message.tool_calls
        assert called.function.name == "get_weather" and json.loads(called.function.arguments) == {"city": "Paris"}
        streamed = list(client.chat.completions.create(**request, stream=True))
        deltas = [choice.delta.model_dump() for chunk in streamed for choice in chunk.choices]
        assert [(name, json.loads(arguments)) for _, name, arguments in accumulated(deltas)[1]] == [
            ("get_weather", {"city": "Paris"})
        ]
        assert streamed[-1].choices[0].finish_reason == "tool_calls"
        history = [
            *asked,
            {"role": "assistant", "content": None, "tool_calls": [called.model_dump()]},
            {"role": "tool", "tool_call_id": called.id, "content": "sunny"},
        ]
        assert client.chat.completions.create(**{**request, "messages": history}).choices[0].message.tool_calls
        forced = {"type": "function", "function": {"name": "get_time"}}
        with pytest.raises(openai.BadRequestError, match="`tool_choice` names a function that is not in `tools`"):
            client.chat.completions.create(**request, tool_choice=forced)
        # a grammar this vocabulary cannot write (its tokens all read as the call's text) is refused at once
        with pytest.raises(openai.BadRequestError, match="no token of the model's vocabulary begins a reply"):
            client.chat.completions.create(**request, tool_choice="required")
        # one that fails while decoding (here: let through): that request alone fails, its neighbour is answered
        from keras_tfm.generation.grammar import Constraint

        monkeypatch.setattr(Constraint, "check_writable", lambda self: None)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            broken = pool.submit(client.chat.completions.create, **request, tool_choice="required")
            fine = pool.submit(client.chat.completions.create, **request)
            assert fine.result().choices[0].message.tool_calls
            with pytest.raises(openai.InternalServerError, match="decoding failed: the grammar refused"):
                broken.result()
        plain = client.chat.completions.create(**{**request, "tool_choice": "none"})
        assert plain.choices[0].message.content == call and not plain.choices[0].message.tool_calls
        written[0] = '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa'  # max_tokens cut its arguments
        cut = client.chat.completions.create(**request).choices[0]
        assert cut.finish_reason == "length" and cut.message.tool_calls[0].function.arguments == '{"city": "Pa'
        streamed = list(client.chat.completions.create(**request, stream=True))
        deltas = [choice.delta.model_dump() for chunk in streamed for choice in chunk.choices]
        assert accumulated(deltas)[1][0][1:] == ("get_weather", '{"city": "Pa')
        assert streamed[-1].choices[0].finish_reason == "length"
        # a template that renders neither tools nor calls (SmolLM2's kind): tools are refused, not ignored;
        # a history of calls renders, each call written into its turn as a `<tool_call>` block
        model.tokenizer.chat_template = (
            "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
        )
        with pytest.raises(openai.BadRequestError, match="does not render tools") as refused:
            client.chat.completions.create(**request)
        assert refused.value.body["param"] == "tools"
        answered = client.chat.completions.create(**{**request, "messages": history, "tools": None})
        block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        text = f"<user>weather in paris<assistant>{block}<tool>sunny<assistant>"
        assert answered.usage.prompt_tokens == len(model.tokenizer.encode(text))


@pytest.mark.backend_independent  # the grammar is host-side; the bias it gives rows is every backend's
def test_response_format_and_forced_tool_calls_hold_whatever_the_weights():
    """A tiny model of random weights, sampling at temperature 1.5: every reply to `json_object` parses
    as an object, every reply to `json_schema` follows the schema (streamed too); a bad format is a 400;
    `tool_choice` "required" or a named function gives a call whose arguments follow its schema. A seeded
    reply is `chat(..., json_schema=...)`'s with that seed."""
    from tests.generation.test_constrained import SCHEMA as schema
    from tests.generation.test_constrained import json_model

    # a Hermes-style template: it names the <tool_call> block its calls are written in
    template = "{% for t in tools or [] %}{{ t.function.name }} {% endfor %}{% for m in messages %}<{{ m['content'] }}>{% endfor %}<tool_call>"  # fmt: skip
    model = json_model(template, max_length=160)
    with Server(model) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        request = dict(model="tiny", messages=MESSAGES, max_tokens=60, temperature=1.5, n=3, seed=1)
        loose = client.chat.completions.create(
            **{**request, "max_tokens": 110}, response_format={"type": "json_object"}
        )
        for choice in loose.choices:  # an object of any keys: a reply cut at max_tokens is one begun
            text = choice.message.content
            assert isinstance(json.loads(text), dict) if choice.finish_reason == "stop" else text.startswith("{")
        assert "stop" in [choice.finish_reason for choice in loose.choices]
        typed = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}}
        replies = [c.message.content for c in client.chat.completions.create(**request, response_format=typed).choices]
        # a stop string does not cut a constrained reply, nor holds a minimum it: its grammar ends it
        for settings in ({"stop": [",", '"'], "stream": True}, {"stop": ","}, {"stop": "}", "temperature": 0},
                         {"extra_body": {"min_new_tokens": 50}}):  # fmt: skip
            answer = client.chat.completions.create(**{**request, "n": 1, **settings}, response_format=typed)
            if settings.get("stream"):
                chunks = [chunk.choices[0] for chunk in answer if chunk.choices]
                text, finish = "".join(c.delta.content or "" for c in chunks), chunks[-1].finish_reason
            else:
                text, finish = answer.choices[0].message.content, answer.choices[0].finish_reason
            assert finish == "stop" and set(json.loads(text)) == {"city", "sunny"}, (settings, text)
        streamed = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(**{**request, "n": 1}, response_format=typed, stream=True)
            if c.choices
        )
        for reply in [*replies, streamed]:
            value = json.loads(reply)
            assert set(value) == {"city", "sunny"} and isinstance(value["sunny"], bool), reply
            assert isinstance(value["city"], str) and len(value["city"]) <= 6, reply
        assert len(set(replies)) > 1  # sampled: the grammar chose nothing for them
        assert streamed == model.chat(MESSAGES, max_new_tokens=60, temperature=1.5, seed=1, json_schema=schema)
        with pytest.raises(openai.BadRequestError, match="response_format"):
            client.chat.completions.create(**request, response_format={"type": "json_schema"})
        # a forced tool call, written as the template's family writes one, its arguments the function's
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": schema}}
        # arguments of a bounded length: an object of any keys may run past max_tokens at this temperature
        zone = {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 6}},
            "additionalProperties": False,
        }
        other = {"type": "function", "function": {"name": "get_time", "parameters": zone}}
        named = {"type": "function", "function": {"name": "get_weather"}}
        for choice, names in (("required", {"get_weather", "get_time"}), (named, {"get_weather"})):
            forcing = dict(request, tools=[weather, other], tool_choice=choice, max_tokens=110, stop=["}", ","])
            called = client.chat.completions.create(**forcing).choices
            for reply in called:
                assert reply.finish_reason == "tool_calls", reply.message.content
                (call,) = reply.message.tool_calls
                assert call.function.name in names
                if call.function.name == "get_weather":
                    arguments = json.loads(call.function.arguments)
                    assert set(arguments) == {"city", "sunny"} and len(arguments["city"]) <= 6
