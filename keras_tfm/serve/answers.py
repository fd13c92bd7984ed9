"""OpenAI's answers: a completion or chat completion with its choices, tool calls, log-probabilities
and usage, whole or as server-sent events."""

from __future__ import annotations

import json
import time
import uuid
from typing import NamedTuple

from keras_tfm.serve.tickets import Logprob, Ticket
from keras_tfm.serve.tools import StreamedCalls, finished_calls, parse_tool_calls


class Echo(NamedTuple):
    """The prompt a completion's answer starts with (`echo`): its text, and its tokens' `Logprob`s where
    the request asks for log-probabilities (the first token's None)."""

    text: str = ""
    logprobs: list[Logprob] | None = None


def usage_of(job, choices) -> dict:
    completion = sum(choice.tokens for choice in choices)
    return {
        "prompt_tokens": len(job.prompt),
        "completion_tokens": completion,
        "total_tokens": len(job.prompt) + completion,
    }


def token_texts(model):
    """A token id's text, as the log-probabilities name it (each token decoded alone)."""
    import functools

    return functools.lru_cache(maxsize=65536)(lambda token: model.decode_text([token]))


def openai_logprobs(entries, chat: bool, token_text, offset: int = 0) -> dict | None:
    """OpenAI's `logprobs` of a choice (or a streamed piece) from the engine's `Logprob`s: chat's list of
    tokens with their bytes and alternatives, or the completions' parallel lists (`text_offset` from
    `offset`, the characters before these tokens)."""
    if entries is None:
        return None
    if chat:

        def one(token, logprob):
            text = token_text(token)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        content = [{**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]} for e in entries]
        return {"content": content, "refusal": None}
    texts = [token_text(e.token) for e in entries]
    offsets = [offset + sum(map(len, texts[:i])) for i in range(len(texts))]
    return {
        "tokens": texts,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [None if e.top is None else {token_text(t): v for t, v in e.top} for e in entries],
        "text_offset": offsets,
    }


def completion(choices, job, model_name: str, chat: bool, token_text, echo: Echo) -> dict:
    answer = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "usage": usage_of(job, choices),
    }
    answer["choices"] = []
    for i, c in enumerate(choices):
        reply, finish = (
            ({"message": chat_message(c.text, job)} if chat else {"text": echo.text + c.text}),
            c.finish_reason,
        )
        if finished_calls(reply.get("message", {}).get("tool_calls", [])):
            finish = "tool_calls"
        answer["choices"].append(
            {
                "index": i,
                **reply,
                "finish_reason": finish,
                "logprobs": openai_logprobs(
                    None if c.logprobs is None else (echo.logprobs or []) + c.logprobs, chat, token_text
                ),
            }
        )
    return answer


def chat_message(text: str, job) -> dict:
    """A chat choice's message: the reply's text, or where the request gave tools, the calls it holds
    and the text around them."""
    if not job.tools:
        return {"role": "assistant", "content": text}
    content, calls = parse_tool_calls(text, {tool["function"]["name"] for tool in job.tools})
    return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}


def stream_response(ticket: Ticket, model_name: str, chat: bool, body: dict, token_text, metrics, echo: Echo):
    """Server-sent events: the text of each choice as it comes (a greedy job's one row stands for all its
    `n` choices; with `tools`, read into content and tool-call deltas as it comes), each choice's end,
    then the usage where `stream_options` asks."""
    from starlette.responses import StreamingResponse

    identity = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    options = body.get("stream_options")
    include_usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
    job = ticket.job
    shared = job.n if job.config.temperature == 0 else 1  # choices one row decodes
    written = [0] * job.n  # characters streamed per choice: the completions' `text_offset`
    calls = [StreamedCalls({t["function"]["name"] for t in job.tools}) for _ in range(job.n)] if job.tools else None

    def chunk(index: int, piece: str | None, finish: str | None = None, logprobs=None) -> dict:
        if chat:
            delta = {} if piece is None else {"content": piece}
            choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": index, "text": piece or "", "finish_reason": finish, "logprobs": None}
        if logprobs:
            choice["logprobs"] = openai_logprobs(logprobs, chat, token_text, written[index])
        return choice

    def event(choices: list[dict], usage=None) -> str:
        body = {
            "id": identity,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
        }
        if usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    async def events():
        start = time.perf_counter()
        try:
            if chat:
                opening = [chunk(i, None) for i in range(job.n)]
                for choice in opening:
                    choice["delta"] = {"role": "assistant", "content": ""}
                yield event(opening)
            if echo.text:
                yield event([chunk(i, echo.text, logprobs=echo.logprobs) for i in range(job.n)])
                written[:] = [len(echo.text)] * job.n
            while True:
                kind, value = await ticket.events.get()
                if kind == "text":
                    row, piece, logprobs = value
                    if sum(written) == len(echo.text) * job.n and piece:  # the first generated text
                        metrics.first_token.observe(time.perf_counter() - start)
                    logprobs = logprobs if job.logprobs is not None else None
                    for index in range(row * shared, (row + 1) * shared):
                        if calls:
                            for delta in calls[index].feed(piece):
                                yield event([{**chunk(index, None), "delta": delta}])
                        else:
                            yield event([chunk(index, piece, logprobs=logprobs)])
                        written[index] += len(piece)
                elif kind == "error":
                    yield f"data: {json.dumps(value.body())}\n\n"
                    return
                else:
                    metrics.generated_tokens.inc(sum(choice.tokens for choice in value))
                    ends = [choice.finish_reason for choice in value]
                    for i, reader in enumerate(calls or ()):
                        for delta in reader.feed("", final=True):
                            yield event([{**chunk(i, None), "delta": delta}])
                        ends[i] = "tool_calls" if reader.calls and not reader.cut else ends[i]
                    yield event([chunk(i, None, end) for i, end in enumerate(ends)])
                    if include_usage:
                        yield event([], usage=usage_of(job, value))
                    yield "data: [DONE]\n\n"
                    return
        finally:
            ticket.cancelled = True  # a client that left mid-stream frees its place at the next chunk

    return StreamingResponse(events(), media_type="text/event-stream")
