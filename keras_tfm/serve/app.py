"""The HTTP side of the server: an OpenAI-compatible API on Starlette (the ASGI toolkit FastAPI is built
on: routing, streaming responses and a test client, without a validation layer whose 422 errors would not
be OpenAI's schema). Every refusal is a JSON error in OpenAI's schema; the server keeps serving."""

from __future__ import annotations

import asyncio
import re
import time

from keras_tfm.errors import InputError
from keras_tfm.generation.grammar import Constraint, schema_grammar
from keras_tfm.serve import requests
from keras_tfm.serve.answers import Echo, completion, stream_response, token_texts
from keras_tfm.serve.engine import Engine
from keras_tfm.serve.grammar import response_schema, tool_call_grammar
from keras_tfm.serve.http import LOOPBACK_HOSTS, authorize, check_host, check_key, read_json, starlette_app
from keras_tfm.serve.operations import Metrics
from keras_tfm.serve.requests import RequestError
from keras_tfm.serve.settings import DEFAULTS
from keras_tfm.serve.tickets import Ticket, prompt_logprobs
from keras_tfm.serve.tools import template_messages, template_renders


def create_app(
    model,
    model_name: str,
    api_key: str | None = None,
    max_batch_size: int = DEFAULTS.max_batch_size,
    max_queue: int = DEFAULTS.max_queue,
    max_tokens: int | None = None,
    max_body_bytes: int = 1_000_000,
    default_max_tokens: int = DEFAULTS.default_max_tokens,
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS,
    escape_special_tokens: bool = DEFAULTS.escape_special_tokens,
    cors_origins: tuple[str, ...] = (),
    warm_up_length: int = 0,
    progress=None,
):
    """A Starlette app serving `model` (a `CausalLM` with a tokenizer) as `model_name`; a `SentenceEmbedder`
    gets `/v1/embeddings` instead of the generating routes (`max_batch_size` inputs embedded at once).

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
        warm_up_length: a language model: compile every shape requests of up to this many positions
            (prompt and reply) use, for greedy requests and requests that name no settings: those of one row
            before `/health` says ready, those of more rows beside, after; 0: none (each shape compiles when
            first used, beside the rows decoding where there are). An embedder has none.
        progress: called with a line of text after each shape the warm-up compiles.
    """
    if _embeds(model):
        from keras_tfm.serve.embeddings import create_embedding_app

        check_key(api_key)
        return create_embedding_app(model, model_name, api_key, max_batch_size, max_queue, max_body_bytes,
                                    allowed_hosts, cors_origins)  # fmt: skip
    defaults = _checked_defaults(model, api_key, default_max_tokens)
    engine = Engine(model, max_batch_size, max_queue, warm_up_length=warm_up_length,
                    warm_up_configs=(defaults.config,), progress=progress)  # fmt: skip
    server = _Routes(model, model_name, engine, defaults, api_key, max_tokens, max_body_bytes, allowed_hosts,
                     escape_special_tokens)  # fmt: skip
    posts = {"/v1/completions": server.completions, "/v1/chat/completions": server.chat_completions,
             "/v1/embeddings": server.embeddings}  # fmt: skip
    app = starlette_app(server, posts, engine, cors_origins)
    app.state.engine = engine
    return app


class _Routes:
    """The routes' handlers over one model, its engine and its metrics (`create_app`'s arguments)."""

    def __init__(self, model, model_name, engine, defaults, api_key, max_tokens, max_body_bytes, allowed_hosts,
                 escape_special_tokens):  # fmt: skip
        self.model, self.model_name, self.engine, self.defaults = model, model_name, engine, defaults
        self.api_key, self.max_body_bytes, self.escape = api_key, max_body_bytes, escape_special_tokens
        self.metrics = Metrics(engine)
        self.settings = dict(
            context=model.max_length,
            max_tokens_limit=max_tokens or model.max_length,
            defaults=defaults,
            vocabulary_size=model.decoding_vocabulary_size,
        )
        self.hosts = None if allowed_hosts is None else {host.lower() for host in allowed_hosts}

    async def completions(self, request):
        return await self._handle(request, chat=False)

    async def chat_completions(self, request):
        return await self._handle(request, chat=True)

    async def _handle(self, request, chat: bool):
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse, Response

        model, name = self.model, self.model_name
        body = await read_json(request, self.api_key, self.max_body_bytes, self.hosts)
        if body.get("model") not in (None, name):
            raise RequestError(f"the model {body.get('model')!r:.100} does not exist; this server has {name!r}.",
                               "model", 404, "not_found_error")  # fmt: skip
        # off the event loop: a long prompt's tokenization must not hold up every other client
        prompt_ids = await run_in_threadpool(_prompt_ids, model.tokenizer, body, chat, self.escape)
        job = requests.parse_job(body, prompt_ids, chat=chat, **self.settings)
        if chat and (grammar := _reply_grammar(model, body, job)) is not None:
            try:  # a grammar llguidance refuses is a 400, here
                await run_in_threadpool(lambda: Constraint(model, grammar, "response_format").check_writable())
            except InputError as error:
                raise RequestError(error.message, error.argument) from None
            job.grammar = grammar
        ticket = self.engine.submit(job)
        token_text = token_texts(model)
        self.metrics.prompt_tokens.inc(len(job.prompt))
        echo = Echo()
        if job.echo:  # the prompt's text starts the answer's, with its log-probabilities where asked
            echo = Echo(requests.completion_prompt(body))
            if job.logprobs is not None:  # a forward pass beside the engine's rows
                echo = echo._replace(logprobs=await run_in_threadpool(prompt_logprobs, model, job.prompt, job.logprobs))
        if job.stream:
            return stream_response(ticket, name, chat, body, token_text, self.metrics, echo)
        choices = await _answer(ticket, request)
        if choices is None:  # the client left: no one reads an answer
            return Response(status_code=499)
        answer = completion(choices, job, name, chat, token_text, echo)
        self.metrics.generated_tokens.inc(answer["usage"]["completion_tokens"])
        return JSONResponse(answer)

    async def embeddings(self, request):
        await read_json(request, self.api_key, self.max_body_bytes, self.hosts)
        raise RequestError(f"the model {self.model_name!r} generates text and does not embed it; serve an "
                           "embedding model (a sentence-transformers checkpoint) for /v1/embeddings.", "model")  # fmt: skip

    async def models(self, request):
        from starlette.responses import JSONResponse

        check_host(request, self.hosts)
        authorize(request, self.api_key)
        return JSONResponse({"object": "list", "data": [_model_entry(self.model, self.model_name, self.defaults)]})

    async def one_model(self, request):
        from starlette.responses import JSONResponse

        check_host(request, self.hosts)
        authorize(request, self.api_key)
        if request.path_params["model_id"] != self.model_name:
            raise RequestError(f"the model {request.path_params['model_id']!r:.100} does not exist; this server "
                               f"has {self.model_name!r}.", "model", 404, "not_found_error")  # fmt: skip
        return JSONResponse(_model_entry(self.model, self.model_name, self.defaults))

    async def exposition(self, request):  # Prometheus scrapes without the API key, as vLLM's and llama.cpp's
        from starlette.responses import Response

        check_host(request, self.hosts)
        content, kind = self.metrics.exposition()
        return Response(content, media_type=kind)

    async def health(self, request):  # 503 while warming up, as llama.cpp's server answers while it loads
        from starlette.responses import JSONResponse

        ready = self.engine.ready.is_set()
        status = {"status": "ok" if ready else "loading", "waiting": self.engine.waiting()}
        return JSONResponse(status, 200 if ready else 503)


def _model_entry(model, model_name: str, defaults: requests.Defaults) -> dict:
    return {
        "id": model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "keras_tfm",
        "max_model_len": model.max_length,  # vLLM's name: the context, prompt and new tokens together
        "defaults": defaults.as_dict(),  # what a request that leaves these out gets
    }


async def _answer(ticket: Ticket, request, poll_seconds: float = 0.5) -> list | None:
    """The choices of a ticket decoded whole; its decoding error raised. A client that leaves (its
    connection closed, or the request cancelled) gives its rows back at the engine's next chunk: None."""
    answered = asyncio.ensure_future(ticket.events.get())
    try:
        while not (await asyncio.wait({answered}, timeout=poll_seconds))[0]:
            if await request.is_disconnected():
                ticket.cancelled = True
                return None
    finally:
        if not answered.done():
            ticket.cancelled = True
            answered.cancel()
    kind, value = answered.result()
    if kind == "error":
        raise value
    return value


def _embeds(model) -> bool:
    """Whether `model` is served as an embedder: it embeds texts (`embed`) and generates none."""
    return callable(getattr(model, "embed", None)) and not callable(getattr(model, "generate", None))


def _checked_defaults(model, api_key: str | None, default_max_tokens: int) -> requests.Defaults:
    """What requests that leave fields out get; before any request, a model the server cannot serve, an
    empty key and a bad `model.generation_config` are refused."""
    _check_model(model, api_key)
    try:
        return requests.Defaults.of(model.generation_config, default_max_tokens)
    except RequestError as error:
        raise InputError(f"its generation_config: {error.message}", "model", "create_app") from None


def _check_model(model, api_key: str | None) -> None:
    """Refuses, before any request, a model the server cannot serve and an empty key."""
    if not callable(getattr(model, "generate", None)) or not hasattr(model, "empty_cache"):
        raise InputError(
            f"the server needs a language model (GPT, DecoderLM) or an embedder (SentenceEmbedder); received a "
            f"{type(model).__name__}.",
            "model",
            "create_app",
        )
    if model.tokenizer is None:
        raise InputError("the server needs a model with a tokenizer (`model.tokenizer`).", "model", "create_app")
    check_key(api_key)


def _prompt_ids(tokenizer, body: dict, chat: bool, escape: bool) -> list[int]:
    if not chat:
        return [int(i) for i in tokenizer.encode_prompt(requests.completion_prompt(body))]
    if not tokenizer.chat_template:
        raise RequestError("this model has no chat template; use /v1/completions.", "messages")
    messages, functions = requests.chat_messages(body), requests.chat_tools(body)
    renders_tools, renders_calls = template_renders(tokenizer.chat_template)
    if functions and not renders_tools:  # the model would answer without knowing them
        raise RequestError(
            "this model's chat template does not render tools, so the model cannot know them; send no `tools` "
            '(or `tool_choice`: "none"), or serve a model whose template renders them (Qwen2.5, Llama 3.1, '
            "Mistral, Hermes).",
            "tools",
        )
    messages = template_messages(messages, renders_calls)
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


def _reply_grammar(model, body: dict, job) -> str | None:
    """What a chat reply must follow: a forced tool call (`tool_choice` "required" or a named function)
    as the template's family writes one, or `response_format`'s JSON; None: free text."""
    if job.tools and (body.get("tool_choice") == "required" or isinstance(body.get("tool_choice"), dict)):
        return tool_call_grammar(model.tokenizer.chat_template or "", job.tools, body["tool_choice"])
    schema = response_schema(body)
    return None if schema is None else schema_grammar(schema)
