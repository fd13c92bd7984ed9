"""The HTTP side of the server: an OpenAI-compatible API on Starlette (the ASGI toolkit FastAPI is built
on: routing, streaming responses and a test client, without a validation layer whose 422 errors would not
be OpenAI's schema). Every refusal is a JSON error in OpenAI's schema; the server keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import re
import time
import uuid

from keras_tfm.errors import InputError
from keras_tfm.serve import requests
from keras_tfm.serve.engine import Engine, Ticket
from keras_tfm.serve.grammar import Constraint, response_schema, schema_grammar, tool_call_grammar
from keras_tfm.serve.operations import Metrics, Observed
from keras_tfm.serve.requests import RequestError
from keras_tfm.serve.tools import parse_tool_calls, template_messages

# the names a browser on this machine uses for a server bound to loopback; any other `Host` is refused
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def create_app(
    model,
    model_name: str,
    api_key: str | None = None,
    max_batch_size: int = 16,
    max_queue: int = 64,
    max_tokens: int | None = None,
    max_body_bytes: int = 1_000_000,
    default_max_tokens: int = requests.Defaults.max_tokens,
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS,
    escape_special_tokens: bool = True,
    cors_origins: tuple[str, ...] = (),
):
    """A Starlette app serving `model` (a `CausalLM` with a tokenizer) as `model_name`.

    Args:
        model: the model; its tokenizer's chat template serves `/v1/chat/completions`.
        model_name: the id `/v1/models` lists and requests name in `model`.
        api_key: when given, every `/v1` request must carry `Authorization: Bearer <api_key>` (else 401).
        max_batch_size: rows decoded together at most; a request for more choices (`n`) is refused.
        max_queue: requests waiting at most; more are answered 429.
        max_tokens: the most tokens a request may ask for (default: the model's context).
        max_body_bytes: larger request bodies are answered 413.
        default_max_tokens: the length of a request that names none (the checkpoint's
            `max_new_tokens`, where its generation config has one, comes first).
        allowed_hosts: the `Host` names (any port) requests may carry; others get 400, so that a web
            page whose name resolves to this machine (DNS rebinding) cannot read its answers. None: any.
        escape_special_tokens: a chat message's text that spells a special token (`<|im_end|>`) is
            encoded as plain text, so that a message cannot forge turns; False: as the token.
        cors_origins: the web origins (`https://app.example`, or `*`) whose pages may call the API from a
            browser (CORS); none by default.
    """
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    defaults = _checked_defaults(model, api_key, default_max_tokens)
    engine = Engine(model, max_batch_size, max_queue)
    metrics = Metrics(engine)
    settings = dict(
        context=model.max_length,
        max_tokens_limit=max_tokens or model.max_length,
        defaults=defaults,
        vocabulary_size=model.decoding_vocabulary_size,
    )
    hosts = None if allowed_hosts is None else {host.lower() for host in allowed_hosts}

    async def handle(request, chat: bool):
        body = await _read_json(request, api_key, max_body_bytes, hosts)
        if body.get("model") not in (None, model_name):
            raise RequestError(f"the model {body.get('model')!r:.100} does not exist; this server has {model_name!r}.",
                               "model", 404, "not_found_error")  # fmt: skip
        # off the event loop: a long prompt's tokenization must not hold up every other client
        prompt_ids = await run_in_threadpool(_prompt_ids, model.tokenizer, body, chat, escape_special_tokens)
        job = requests.parse_job(body, prompt_ids, chat=chat, **settings)
        if chat and (grammar := _reply_grammar(model, body, job)) is not None:
            await run_in_threadpool(Constraint, model, grammar)  # a grammar llguidance refuses is a 400, here
            job.grammar = grammar
        ticket = engine.submit(job)
        token_text = _token_texts(model)
        metrics.prompt_tokens.inc(len(job.prompt))
        echo = requests.completion_prompt(body) if job.echo else ""  # the prompt's text starts the answer's
        if job.stream:
            return _stream_response(ticket, model_name, chat, body, token_text, metrics, echo)
        answer = _completion(await _answer(ticket), job, model_name, chat, token_text, echo)
        metrics.generated_tokens.inc(answer["usage"]["completion_tokens"])
        return JSONResponse(answer)

    async def completions(request):
        return await handle(request, chat=False)

    async def chat_completions(request):
        return await handle(request, chat=True)

    async def models(request):
        _check_host(request, hosts)
        _authorize(request, api_key)
        return JSONResponse({"object": "list", "data": [_model_entry(model, model_name, defaults)]})

    async def one_model(request):
        _check_host(request, hosts)
        _authorize(request, api_key)
        if request.path_params["model_id"] != model_name:
            raise RequestError(f"the model {request.path_params['model_id']!r:.100} does not exist; this server "
                               f"has {model_name!r}.", "model", 404, "not_found_error")  # fmt: skip
        return JSONResponse(_model_entry(model, model_name, defaults))

    async def exposition(request):  # Prometheus scrapes without the API key, as vLLM's and llama.cpp's
        _check_host(request, hosts)
        content, kind = metrics.exposition()
        return Response(content, media_type=kind)

    async def health(request):
        return JSONResponse({"status": "ok", "waiting": engine.waiting()})

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/models/{model_id:path}", one_model),
            Route("/metrics", exposition),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ],
        exception_handlers={RequestError: _refused, HTTPException: _http_error, Exception: _server_error},
        lifespan=_closing(engine),
        middleware=[
            Middleware(Observed, metrics=metrics),
            *[
                Middleware(
                    CORSMiddleware,
                    allow_origins=list(cors_origins),
                    allow_methods=["GET", "POST"],
                    allow_headers=["Authorization", "Content-Type"],
                )
            ]
            * bool(cors_origins),
        ],  # fmt: skip
    )
    app.state.engine, app.state.metrics = engine, metrics
    return app


def _model_entry(model, model_name: str, defaults: requests.Defaults) -> dict:
    return {
        "id": model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "keras_tfm",
        "max_model_len": model.max_length,  # vLLM's name: the context, prompt and new tokens together
        "defaults": defaults.as_dict(),  # what a request that leaves these out gets
    }


async def _refused(request, error: RequestError):
    from starlette.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status)


async def _http_error(request, error):
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return await _refused(request, RequestError(str(error.detail), None, error.status_code, kind))


async def _server_error(request, error: Exception):  # a fault of the server's, still in OpenAI's schema
    message = f"the server failed: {type(error).__name__}: {error}"[:500]
    return await _refused(request, RequestError(message, None, 500, "server_error"))


async def _answer(ticket: Ticket) -> list:
    """The choices of a ticket decoded whole; its decoding error raised; a client that left (the request
    cancelled) gives its rows back at the engine's next chunk."""
    try:
        kind, value = await ticket.events.get()
    except asyncio.CancelledError:
        ticket.cancelled = True
        raise
    if kind == "error":
        raise value
    return value


def _closing(engine: Engine):
    """The app's lifespan: the engine's thread ends with the server."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        engine.close()

    return lifespan


def _checked_defaults(model, api_key: str | None, default_max_tokens: int) -> requests.Defaults:
    """What requests that leave fields out get; before any request, a model the server cannot serve, an
    empty key and a bad `model.generation_config` are refused."""
    _check_model(model, api_key)
    try:
        return requests.Defaults.of(model.generation_config, default_max_tokens)
    except RequestError as error:
        raise ValueError(f"model.generation_config: {error.message}") from None


def _check_model(model, api_key: str | None) -> None:
    """Refuses, before any request, a model the server cannot serve and an empty key."""
    if not callable(getattr(model, "generate", None)) or not hasattr(model, "empty_cache"):
        raise ValueError(
            f"model: the server needs a language model (GPT, DecoderLM); received a {type(model).__name__}."
        )
    if model.tokenizer is None:
        raise ValueError("model: the server needs a model with a tokenizer (`model.tokenizer`).")
    if api_key is not None and not api_key.strip():
        raise ValueError("api_key: an empty key would let every request in; give a key, or None for no key.")


def _check_host(request, hosts: set[str] | None) -> None:
    """Refuses a `Host` header outside `hosts` (its port aside)."""
    if hosts is None:
        return
    host = request.headers.get("host", "").lower()
    name = host[: host.find("]") + 1] if host.startswith("[") else host.rsplit(":", 1)[0]  # [::1]:8000, a:8000
    if name not in hosts and "*" not in hosts:
        raise RequestError(
            f"the Host header {host!r:.100} is not one this server answers ({', '.join(sorted(hosts))}); "
            "the server's `allowed_hosts` must name it.",
            None,
            400,
        )


def _authorize(request, api_key: str | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
        raise RequestError("a valid API key is needed: `Authorization: Bearer <key>`.", None, 401)


async def _read_json(request, api_key: str | None, max_body_bytes: int, hosts: set[str] | None) -> dict:
    _check_host(request, hosts)
    _authorize(request, api_key)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":  # a web page may send text/plain across origins without asking first
        raise RequestError(
            f"the request body must be sent as `Content-Type: application/json`; received {kind or 'none'!r:.100}.",
            None,
            415,
        )
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_body_bytes:
            raise RequestError(f"the request body is larger than {max_body_bytes:,} bytes.", None, 413)
    try:
        parsed = json.loads(body)
        json.dumps(parsed, ensure_ascii=False).encode()  # a lone surrogate (\ud800) has no UTF-8
    except RecursionError:
        raise RequestError("the request body is nested too deeply.") from None
    except ValueError as error:  # UnicodeError, and an integer of too many digits, are ValueErrors
        raise RequestError(f"the request body is not valid JSON ({str(error)[:200]}).") from None
    if not isinstance(parsed, dict):
        raise RequestError("the request body must be a JSON object.")
    return parsed


def _prompt_ids(tokenizer, body: dict, chat: bool, escape: bool) -> list[int]:
    if not chat:
        return [int(i) for i in tokenizer.encode_prompt(requests.completion_prompt(body))]
    if not tokenizer.chat_template:
        raise RequestError("this model has no chat template; use /v1/completions.", "messages")
    messages, functions = template_messages(requests.chat_messages(body)), requests.chat_tools(body)
    specials = tokenizer.special_token_texts() if escape and hasattr(tokenizer, "special_token_texts") else []
    if any(special in (message["content"] or "") for message in messages for special in specials):
        return _escaped_chat_ids(tokenizer, messages, functions)
    # the template holds the special tokens
    return [int(i) for i in tokenizer.encode(_rendered(tokenizer, messages, functions))]


def _rendered(tokenizer, messages: list[dict], functions: list | None) -> str:
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=functions)
    except InputError as error:  # the template's own checks (roles out of order, ...)
        raise RequestError(error.message, "messages") from None


def _escaped_chat_ids(tokenizer, messages: list[dict], functions: list | None) -> list[int]:
    """The conversation's ids with each message's text encoded as plain text: the template rendered
    around placeholders, its own text encoded with its special tokens, the messages' without."""
    marked = [
        {**message, "content": f"\x00{index}\x00"} if message["content"] is not None else message
        for index, message in enumerate(messages)
    ]
    parts = re.split("\x00([0-9]+)\x00", _rendered(tokenizer, marked, functions))
    shown = parts[1::2]
    if len(set(shown)) != len(shown):
        raise RequestError(
            "a message holds a special token's text, which this chat template repeats and cannot be escaped; "
            "remove it, or serve with `escape_special_tokens` off.",
            "messages",
        )
    ids = []
    for position, part in enumerate(parts):
        if position % 2:
            ids += tokenizer.encode_literal(messages[int(part)]["content"]).tolist()
        elif part:
            ids += tokenizer.encode(part).tolist()
    return [int(i) for i in ids]


def _usage(job, choices) -> dict:
    completion = sum(choice.tokens for choice in choices)
    return {
        "prompt_tokens": len(job.prompt),
        "completion_tokens": completion,
        "total_tokens": len(job.prompt) + completion,
    }


def _token_texts(model):
    """A token id's text, as the log-probabilities name it (each token decoded alone)."""
    import functools

    return functools.lru_cache(maxsize=65536)(lambda token: model.decode_text([token]))


def _logprobs(entries, chat: bool, token_text, offset: int = 0) -> dict | None:
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
        "top_logprobs": [{token_text(t): v for t, v in e.top} for e in entries],
        "text_offset": offsets,
    }


def _completion(choices, job, model_name: str, chat: bool, token_text, echo: str = "") -> dict:
    answer = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "usage": _usage(job, choices),
    }
    answer["choices"] = []
    for i, c in enumerate(choices):
        reply, finish = ({"message": _reply(c.text, job)} if chat else {"text": echo + c.text}), c.finish_reason
        if reply.get("message", {}).get("tool_calls"):
            finish = "tool_calls"
        answer["choices"].append(
            {"index": i, **reply, "finish_reason": finish, "logprobs": _logprobs(c.logprobs, chat, token_text)}
        )
    return answer


def _reply_grammar(model, body: dict, job) -> str | None:
    """What a chat reply must follow: a forced tool call (`tool_choice` "required" or a named function)
    as the template's family writes one, or `response_format`'s JSON; None: free text."""
    if job.tools and (body.get("tool_choice") == "required" or isinstance(body.get("tool_choice"), dict)):
        return tool_call_grammar(model.tokenizer.chat_template or "", job.tools, body["tool_choice"])
    schema = response_schema(body)
    return None if schema is None else schema_grammar(schema)


def _reply(text: str, job) -> dict:
    """A chat choice's message: the reply's text, or where the request gave tools, the calls it holds
    and the text around them."""
    if not job.tools:
        return {"role": "assistant", "content": text}
    content, calls = parse_tool_calls(text, {tool["function"]["name"] for tool in job.tools})
    return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}


def _stream_response(ticket: Ticket, model_name: str, chat: bool, body: dict, token_text, metrics, echo: str = ""):
    """Server-sent events: the text of each choice as it comes (a greedy job's one row stands for all its
    `n` choices), each choice's end, then the usage where `stream_options` asks."""
    from starlette.responses import StreamingResponse

    identity = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    options = body.get("stream_options")
    include_usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
    job = ticket.job
    shared = job.n if job.config.temperature == 0 else 1  # choices one row decodes
    written = [0] * job.n  # characters streamed per choice: the completions' `text_offset`

    def chunk(index: int, piece: str | None, finish: str | None = None, logprobs=None) -> dict:
        if chat:
            delta = {} if piece is None else {"content": piece}
            choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": index, "text": piece or "", "finish_reason": finish, "logprobs": None}
        if logprobs:
            choice["logprobs"] = _logprobs(logprobs, chat, token_text, written[index])
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
            if echo:
                yield event([chunk(i, echo) for i in range(job.n)])
            while True:
                kind, value = await ticket.events.get()
                if kind == "text" and job.tools:  # the calls are known at the end: sent whole there
                    continue
                if kind == "text":
                    row, piece, logprobs = value
                    if not any(written) and piece:
                        metrics.first_token.observe(time.perf_counter() - start)
                    logprobs = logprobs if job.logprobs is not None else None
                    for index in range(row * shared, (row + 1) * shared):
                        yield event([chunk(index, piece, logprobs=logprobs)])
                        written[index] += len(piece)
                elif kind == "error":
                    yield f"data: {json.dumps(value.body())}\n\n"
                    return
                else:
                    metrics.generated_tokens.inc(sum(choice.tokens for choice in value))
                    ends = [choice.finish_reason for choice in value]
                    if job.tools:
                        for i, choice in enumerate(value):
                            message = _reply(choice.text, job)
                            delta = chunk(i, message["content"])
                            if message.get("tool_calls"):
                                calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
                                delta["delta"] = {"content": message["content"], "tool_calls": calls}
                                ends[i] = "tool_calls"
                            yield event([delta])
                    yield event([chunk(i, None, end) for i, end in enumerate(ends)])
                    if include_usage:
                        yield event([], usage=_usage(job, value))
                    yield "data: [DONE]\n\n"
                    return
        finally:
            ticket.cancelled = True  # a client that left mid-stream frees its place at the next chunk

    return StreamingResponse(events(), media_type="text/event-stream")
