"""`/v1/embeddings`: OpenAI's embeddings API for a `SentenceEmbedder`, the inputs of the requests that wait
embedded together by one thread, with the other routes' checks, limits and errors."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import threading
import time

import numpy as np

from keras_tfm import compat
from keras_tfm.errors import InputError
from keras_tfm.serve.http import authorize, check_host, read_json, starlette_app
from keras_tfm.serve.requests import RequestError
from keras_tfm.serve.workers import close_at_exit

FIELDS = ("input", "model", "encoding_format", "dimensions", "user")
MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request


def inputs_of(body: dict, model) -> list[np.ndarray]:
    """The token ids of each input of `body["input"]`: a string, a list of strings, a list of token ids,
    or a list of such lists (ids taken as they are: special tokens included, at most the model's length)."""
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown field `{unknown[0]}`; /v1/embeddings takes {', '.join(FIELDS)}.", unknown[0])
    given = body.get("input")
    if isinstance(given, str):
        given = [given]
    if not isinstance(given, list) or not given or len(given) > MAX_INPUTS:
        raise RequestError(
            f"`input` must be a string or a list of 1 to {MAX_INPUTS} strings or token-id lists; "
            f"received {type(given).__name__}{f' of {len(given)}' if isinstance(given, list) else ''}.",
            "input",
        )
    if all(isinstance(item, str) for item in given):
        try:
            ids = model.encode(given)  # an image-text model's: texts, and images as data URLs
        except InputError as error:
            raise RequestError(error.message, "input") from None
        if any(len(row) == 0 for row in ids):  # a tokenizer that adds no special tokens, and an empty text
            raise RequestError("an `input` text encodes to no tokens; send text.", "input")
        return ids
    if all(_is_id(item) for item in given):
        given = [given]
    if not all(isinstance(item, list) and item and all(_is_id(i) for i in item) for item in given):
        raise RequestError("`input` must hold strings, or lists of token ids (integers), not both.", "input")
    limit, size = model.max_sequence_length, model.vocabulary_size
    for item in given:
        if len(item) > limit or min(item) < 0 or max(item) >= size:
            raise RequestError(
                f"`input` token-id lists must hold at most {limit} ids in [0, {size}); received {len(item)} ids in "
                f"[{min(item)}, {max(item)}].",
                "input",
            )
    return [np.asarray(item, "int32") for item in given]


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def answer(body: dict, vectors: np.ndarray, ids: list, model, model_name: str) -> dict:
    """OpenAI's embeddings response: each vector (cut to `dimensions`, made unit length again where the
    model normalizes) as floats or base64 of little-endian float32, with the tokens counted."""
    form = body.get("encoding_format", "float")
    if form not in ("float", "base64"):
        raise RequestError(f"`encoding_format` must be 'float' or 'base64'; received {form!r:.80}.", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None:
        if not _is_id(dimensions) or not 1 <= dimensions <= model.embedding_dim:
            raise RequestError(
                f"`dimensions` must be an integer in [1, {model.embedding_dim}]; received {dimensions!r:.80}.",
                "dimensions",
            )
        vectors = vectors[:, :dimensions]
        if model.normalize:  # as sentence-transformers' truncate_dim with a normalized model
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    vectors = np.asarray(vectors, "<f4")
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(vector.tobytes()).decode() if form == "base64" else vector.tolist(),
        }
        for i, vector in enumerate(vectors)
    ]
    tokens = sum(input_tokens(model, row) for row in ids)
    return {
        "object": "list",
        "data": data,
        "model": model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def input_tokens(model, row) -> int:
    """What an input counts in `usage`: its tokens, or an image-text model's count of an image."""
    return model.input_tokens(row) if hasattr(model, "input_tokens") else len(row)


def model_entry(model, model_name: str) -> dict:
    return {
        "id": model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "keras_tfm",
        "max_model_len": model.max_sequence_length,
        "dimensions": model.embedding_dim,
    }


def _shut_down() -> RequestError:
    return RequestError("the server shut down before answering.", None, 503, "server_error")


class _Pending:
    """A request's inputs waiting to be embedded, the vectors of those embedded so far, and its future."""

    def __init__(self, ids: list, future: concurrent.futures.Future):
        self.ids, self.future, self.vectors = ids, future, []

    @property
    def left(self) -> int:
        return len(self.ids) - sum(len(part) for part in self.vectors)


class EmbeddingBatcher:
    """One thread embeds the inputs of the requests waiting, `max_batch_size` inputs at a time: requests
    that come together share the model's batches, and a large request is embedded a batch at a time, so
    that a small one is not starved behind it: each batch serves the oldest request first (up to half the
    batch), then the smallest. More than `max_queue` requests waiting are refused (429); `drain` (the
    server's shutdown) answers those waiting with a 503 and finishes the batch being embedded."""

    def __init__(self, model, max_batch_size: int, max_queue: int):
        self.model, self.max_batch_size, self.max_queue = model, max_batch_size, max_queue
        self._pending: list[_Pending] = []
        self._condition = threading.Condition()
        self._closed = False
        self._running: set[_Pending] = set()  # the requests of the batch being embedded
        self.thread = threading.Thread(target=self._run, name="keras_tfm-embeddings", daemon=True)
        self.thread.start()
        close_at_exit(self)

    def waiting(self) -> int:
        return len(self._pending)

    async def embed(self, ids: list) -> np.ndarray:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._condition:
            if self._closed:
                raise RequestError("the server is shutting down.", None, 503, "server_error")
            if len(self._pending) >= self.max_queue:
                raise RequestError("the server is busy: too many requests are waiting; retry later.", None, 429,
                                   "rate_limit_error")  # fmt: skip
            self._pending.append(_Pending(ids, future))
            self._condition.notify()
        return await asyncio.wrap_future(future)  # a client that leaves cancels it: its inputs are dropped

    def _run(self) -> None:
        compat.torch_parallel_here()
        while (batch := self._next_batch()) is not None:
            if batch:
                self._embed(batch)
        self._answer(list(self._pending), _shut_down())  # a request the last batch left unfinished

    def _next_batch(self) -> list[tuple[_Pending, list]] | None:
        """`(request, its inputs)` pairs of at most `max_batch_size` inputs: the oldest request's first (up
        to half the batch), then the smallest requests'; None once closed."""
        with self._condition:
            while not self._closed and not self._pending:
                self._condition.wait()
            self._running = set()
            if self._closed:
                return None
            self._pending = [item for item in self._pending if not item.future.cancelled()]
            if not self._pending:  # every client waiting left
                return []
            oldest, *others = self._pending
            turns = [(oldest, max(self.max_batch_size // 2, 1))] + [
                (o, o.left) for o in sorted(others, key=lambda o: o.left)
            ]
            taken: dict[_Pending, int] = {}  # inputs of each request in this batch
            for item, share in turns + [(oldest, self.max_batch_size)]:  # the oldest takes what room is left
                start = len(item.ids) - item.left + taken.get(item, 0)
                count = min(share, self.max_batch_size - sum(taken.values()), len(item.ids) - start)
                taken[item] = taken.get(item, 0) + max(count, 0)
            batch = [(item, item.ids[len(item.ids) - item.left :][:count]) for item, count in taken.items() if count]
            self._running = {item for item, _ in batch}
            return batch

    def _embed(self, batch: list[tuple[_Pending, list]]) -> None:
        try:
            vectors = self.model.embed_token_ids([row for _, ids in batch for row in ids], self.max_batch_size)
        except Exception as error:  # a fault of the model's: each request it touched answered with it
            self._answer([item for item, _ in batch], error=error)
            return
        start, finished = 0, []
        for item, ids in batch:
            item.vectors.append(vectors[start : start + len(ids)])
            start += len(ids)
            if not item.left:
                finished.append(item)
        self._answer(finished)

    def _answer(self, items: list[_Pending], error: Exception | None = None) -> None:
        """Takes `items` off the queue and answers each, once (a cancelled one: its client left)."""
        with self._condition:
            self._pending = [item for item in self._pending if item not in items]
            for item in items:
                if not item.future.done() and item.future.set_running_or_notify_cancel():
                    if error is None:
                        item.future.set_result(np.concatenate(item.vectors))
                    else:
                        item.future.set_exception(error)

    def drain(self) -> None:
        """Answers every request waiting with a 503 (the server is shutting down); the batch being embedded
        finishes (a request it leaves unfinished gets the 503 too), and the thread ends."""
        with self._condition:
            self._closed = True
            waiting = [item for item in self._pending if item not in self._running]
            self._condition.notify()
        self._answer(waiting, _shut_down())

    def close(self) -> None:
        self.drain()
        self.thread.join(timeout=30)


def create_embedding_app(model, model_name, api_key, max_batch_size, max_queue, max_body_bytes, allowed_hosts,
                         cors_origins):  # fmt: skip
    """`create_app` for a `SentenceEmbedder`: `/v1/embeddings`, `/v1/models`, `/health` and `/metrics`; the
    generating routes answer that this model embeds."""

    batcher = EmbeddingBatcher(model, max_batch_size, max_queue)
    routes = _EmbeddingRoutes(model, model_name, batcher, api_key, max_body_bytes, allowed_hosts)
    posts = {"/v1/embeddings": routes.embeddings, "/v1/completions": routes.generating,
             "/v1/chat/completions": routes.generating}  # fmt: skip
    return starlette_app(routes, posts, batcher, cors_origins)


class _EmbeddingRoutes:
    def __init__(self, model, model_name, batcher, api_key, max_body_bytes, allowed_hosts):
        from keras_tfm.serve.operations import Metrics

        self.model, self.model_name, self.batcher, self.api_key = model, model_name, batcher, api_key
        self.max_body_bytes = max_body_bytes
        self.hosts = None if allowed_hosts is None else {host.lower() for host in allowed_hosts}
        self.metrics = Metrics(batcher)

    async def embeddings(self, request):
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        body = await read_json(request, self.api_key, self.max_body_bytes, self.hosts)
        if body.get("model") not in (None, self.model_name):
            raise RequestError(f"the model {body.get('model')!r:.100} does not exist; this server has "
                               f"{self.model_name!r}.", "model", 404, "not_found_error")  # fmt: skip
        ids = await run_in_threadpool(inputs_of, body, self.model)  # tokenizing off the event loop
        vectors = await self.batcher.embed(ids)
        self.metrics.prompt_tokens.inc(sum(input_tokens(self.model, row) for row in ids))
        return JSONResponse(answer(body, vectors, ids, self.model, self.model_name))

    async def generating(self, request):

        await read_json(request, self.api_key, self.max_body_bytes, self.hosts)
        raise RequestError(f"the model {self.model_name!r} embeds text and does not generate it; use "
                           "/v1/embeddings.", "model")  # fmt: skip

    async def models(self, request):
        from starlette.responses import JSONResponse

        self._checked(request)
        return JSONResponse({"object": "list", "data": [model_entry(self.model, self.model_name)]})

    async def one_model(self, request):
        from starlette.responses import JSONResponse

        self._checked(request)
        if request.path_params["model_id"] != self.model_name:
            raise RequestError(f"the model {request.path_params['model_id']!r:.100} does not exist; this server "
                               f"has {self.model_name!r}.", "model", 404, "not_found_error")  # fmt: skip
        return JSONResponse(model_entry(self.model, self.model_name))

    async def exposition(self, request):
        from starlette.responses import Response

        check_host(request, self.hosts)
        content, kind = self.metrics.exposition()
        return Response(content, media_type=kind)

    async def health(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok", "waiting": self.batcher.waiting()})

    def _checked(self, request) -> None:

        check_host(request, self.hosts)
        authorize(request, self.api_key)
