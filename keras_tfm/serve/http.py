"""The HTTP plumbing every server route shares: the Starlette app (refusals in OpenAI's error schema,
metrics, CORS, the worker closed with the server), and each request's checks (its `Host`, its key, its
JSON body within the size limit)."""

from __future__ import annotations

import contextlib
import hmac
import json

from keras_tfm.errors import InputError
from keras_tfm.serve.operations import Observed
from keras_tfm.serve.requests import RequestError

# the names a browser on this machine uses for a server bound to loopback; any other `Host` is refused
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def starlette_app(server, posts: dict, worker, cors_origins: tuple[str, ...]):
    """The app of `server`'s handlers (`health`, `models`, `one_model`, `exposition`, and `posts`: path ->
    handler): refusals in OpenAI's error schema, every request counted in `server.metrics` and logged,
    CORS for `cors_origins`, and `worker` (the engine's or batcher's thread) closed with the server."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware
    from starlette.routing import Route

    routes = [
        Route("/health", server.health),
        Route("/v1/models", server.models),
        Route("/v1/models/{model_id:path}", server.one_model),
        Route("/metrics", server.exposition),
        *[Route(path, handler, methods=["POST"]) for path, handler in posts.items()],
    ]
    metrics = server.metrics

    cors = Middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                      allow_headers=["Authorization", "Content-Type"])  # fmt: skip
    app = Starlette(
        routes=routes,
        exception_handlers={RequestError: _refused, HTTPException: _http_error, Exception: _server_error},
        lifespan=_closing(worker),
        middleware=[Middleware(Observed, metrics=metrics), *[cors] * bool(cors_origins)],
    )
    app.state.metrics, app.state.worker = metrics, worker
    return app


async def _refused(request, error: RequestError):
    from starlette.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status)


async def _http_error(request, error):
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return await _refused(request, RequestError(str(error.detail), None, error.status_code, kind))


async def _server_error(request, error: Exception):  # a fault of the server's, still in OpenAI's schema
    message = f"the server failed: {type(error).__name__}: {error}"[:500]
    return await _refused(request, RequestError(message, None, 500, "server_error"))


def _closing(worker):
    """The app's lifespan: the worker's thread (the engine's, the embedding batcher's) ends with the server."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        worker.close()

    return lifespan


def check_key(api_key: str | None) -> None:
    if api_key is not None and not api_key.strip():
        raise InputError("an empty key would let every request in; give a key, or None for no key.", "api_key",
                         "create_app")  # fmt: skip


def check_host(request, hosts: set[str] | None) -> None:
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


def authorize(request, api_key: str | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
        raise RequestError("a valid API key is needed: `Authorization: Bearer <key>`.", None, 401)


async def read_json(request, api_key: str | None, max_body_bytes: int, hosts: set[str] | None) -> dict:
    check_host(request, hosts)
    authorize(request, api_key)
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
