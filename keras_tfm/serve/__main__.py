"""`python -m keras_tfm.serve CHECKPOINT`: serves a language model over an OpenAI-compatible API."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from keras_tfm.convert.huggingface import DTYPES
from keras_tfm.serve.settings import ServerSettings


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m keras_tfm.serve", description="Serves a language model over an OpenAI-compatible HTTP API."
    )
    parser.add_argument("checkpoint", help="a Hugging Face directory or Hub id, a .keras file or a .gguf file")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("KERAS_TFM_API_KEY"),
                        help="requests must carry `Authorization: Bearer KEY` (default: $KERAS_TFM_API_KEY, "
                             "which, unlike this flag, other users cannot read in the process list)")  # fmt: skip
    parser.add_argument("--model-name", help="the model's id in the API (default: the checkpoint's name)")
    parser.add_argument("--dtype", choices=DTYPES,
                        help="the model's dtype for a Hugging Face or GGUF checkpoint (default: the global policy, "
                             "float32 unless set; auto: the checkpoint's own)")  # fmt: skip
    for name, field in ServerSettings.fields().items():  # create_app's own defaults and help
        if isinstance(field.default, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction,
                                default=field.default, help=f"{field.metadata['help']} (default: %(default)s)")  # fmt: skip
        else:
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(field.default), default=field.default,
                                help=f"{field.metadata['help']} (default: %(default)s)")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, help="the most tokens a request may ask for (default: the context)")
    parser.add_argument("--allowed-hosts", nargs="+",
                        help="the Host names requests may carry, or '*' for any (default: localhost, 127.0.0.1 "
                             "and [::1] when --host is a loopback address, else any)")  # fmt: skip
    parser.add_argument("--cors-origin", nargs="+", default=(),
                        help="web origins whose pages may call the API from a browser (https://app.example, or "
                             "'*' for any); default: none")  # fmt: skip
    parser.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                        help="one line per request on standard error: client, method, path, status, seconds "
                             "(default: on)")  # fmt: skip
    # create_app compiles nothing before serving unless asked; a served process warms up by default
    parser.add_argument("--warm-up-length", type=int, default=128,
                        help="a language model: before /health says ready, compile the shapes one row uses for "
                             "requests of up to this many positions, prompt and reply, and those of more rows "
                             "after, beside (0: none; longer ones compile when first needed, while the rows already "
                             "decoding go on; default: %(default)s)")  # fmt: skip
    parser.add_argument("--compile-cache", default=default_compile_cache(), metavar="DIR",
                        help="JAX: keep each compiled program in DIR, so that the next start reads it back rather "
                             "than compile it again ('none': keep none; $JAX_COMPILATION_CACHE_DIR wins; "
                             "default: %(default)s)")  # fmt: skip
    parser.add_argument("--shutdown-timeout", type=float, default=10.0,
                        help="on SIGTERM or Ctrl-C, seconds the requests being answered have to finish before "
                             "they are cancelled (default: %(default)s)")  # fmt: skip
    return parser


def default_compile_cache() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "keras_tfm", "compiled")


def _checked(args: argparse.Namespace) -> argparse.Namespace:
    """Refuses, by flag, settings that would give a server no one can use."""
    for name in ("max_batch_size", "max_queue", "default_max_tokens", "max_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser().error(f"--{name.replace('_', '-')} must be at least 1; received {getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        parser().error(f"--port must be in [0, 65535]; received {args.port}")
    if args.api_key is not None and not args.api_key.strip():
        parser().error("--api-key is empty: give a key (or leave it and $KERAS_TFM_API_KEY out for no key)")
    if args.warm_up_length < 0:
        parser().error(f"--warm-up-length must be at least 0; received {args.warm_up_length}")
    if args.shutdown_timeout < 0:
        parser().error(f"--shutdown-timeout must be at least 0; received {args.shutdown_timeout}")
    return args


def allowed_hosts(args: argparse.Namespace) -> tuple[str, ...] | None:
    from keras_tfm.serve.http import LOOPBACK_HOSTS

    if args.allowed_hosts:
        return tuple(args.allowed_hosts)
    return LOOPBACK_HOSTS if args.host in ("127.0.0.1", "localhost", "::1") else None


def _log_requests() -> None:
    """The access log (`serve.operations`): the `keras_tfm.serve` logger's lines on standard error."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger = logging.getLogger("keras_tfm.serve")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _exit_quietly(signum, frame) -> None:
    """After uvicorn's graceful shutdown it raises the signal it caught again: the server ended as asked."""
    sys.exit(0)


def _draining_server():
    import uvicorn

    class Draining(uvicorn.Server):
        """uvicorn's server whose shutdown first tells the app's worker (the engine, the embedding batcher)
        to answer the requests waiting with 503 at once; those being answered get the graceful timeout."""

        def handle_exit(self, sig, frame) -> None:
            self.config.app.state.worker.drain()
            super().handle_exit(sig, frame)

    return Draining


def main(argv: list[str] | None = None) -> None:
    args = _checked(parser().parse_args(argv))
    try:
        import uvicorn
    except ImportError:
        sys.exit("error: the server needs its extra: pip install 'keras_tfm[serve]'")
    from keras_tfm import compat
    from keras_tfm.errors import InputError
    from keras_tfm.generation import compiled
    from keras_tfm.saving import load
    from keras_tfm.serve import create_app

    compat.torch_server_process()
    compiled.keep_compiled_programs(None if args.compile_cache.lower() == "none" else args.compile_cache)
    try:
        model = load(args.checkpoint, args.dtype)
        name = args.model_name or os.path.basename(os.path.normpath(args.checkpoint))
        app = create_app(
            model,
            name,
            args.api_key,
            args.max_batch_size,
            args.max_queue,
            args.max_tokens,
            default_max_tokens=args.default_max_tokens,
            allowed_hosts=allowed_hosts(args),
            escape_special_tokens=args.escape_special_tokens,
            cors_origins=tuple(args.cors_origin),
            warm_up_length=args.warm_up_length,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (InputError, ValueError) as error:
        sys.exit(f"error: {args.checkpoint}: {error}")
    if args.access_log:
        _log_requests()
    print(f"Serving {name} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    for caught in (signal.SIGTERM, signal.SIGINT):
        signal.signal(caught, _exit_quietly)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=args.shutdown_timeout
    )
    _draining_server()(config).run()


if __name__ == "__main__":
    main()
