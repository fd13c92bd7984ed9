"""`python -m keras_tfm.serve CHECKPOINT`: serves a language model over an OpenAI-compatible API."""

from __future__ import annotations

import argparse
import os
import sys


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m keras_tfm.serve", description="Serves a language model over an OpenAI-compatible HTTP API."
    )
    parser.add_argument("checkpoint", help="a Hugging Face directory or Hub id, a .keras file or a .gguf file")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("KERAS_TFM_API_KEY"),
                        help="requests must carry `Authorization: Bearer KEY` (default: $KERAS_TFM_API_KEY)")  # fmt: skip
    parser.add_argument("--model-name", help="the model's id in the API (default: the checkpoint's name)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--max-batch-size", type=int, default=16, help="rows decoded together at most")
    parser.add_argument("--max-queue", type=int, default=64, help="requests waiting at most; more get 429")
    parser.add_argument("--max-tokens", type=int, help="the most tokens a request may ask for (default: the context)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    for name in ("max_batch_size", "max_queue", "port"):
        if getattr(args, name) < 1:
            parser().error(f"--{name.replace('_', '-')} must be at least 1; received {getattr(args, name)}")
    try:
        import uvicorn
    except ImportError:
        sys.exit("error: the server needs its extra: pip install 'keras_tfm[serve]'")
    from keras_tfm.cli.generate import load
    from keras_tfm.errors import InputError
    from keras_tfm.serve import create_app

    try:
        model = load(args.checkpoint, args.dtype)
    except InputError as error:
        sys.exit(f"error: {error}")
    name = args.model_name or os.path.basename(os.path.normpath(args.checkpoint))
    app = create_app(model, name, args.api_key, args.max_batch_size, args.max_queue, args.max_tokens)
    print(f"Serving {name} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
