"""An OpenAI-compatible HTTP server for the zoo's language models:

    python -m keras_tfm.serve CHECKPOINT [--port 8000] [--api-key KEY]

`/v1/models`, `/v1/completions` and `/v1/chat/completions` (the checkpoint's chat template), streamed as
server-sent events or not, and `/health`. `create_app(model, name)` gives the ASGI app for a model in
memory (`keras_tfm.serve.app`); requests that arrive together decode together (`keras_tfm.serve.engine`).
Needs `pip install 'keras_tfm[serve]'`.
"""

from keras_tfm.serve.app import create_app

__all__ = ["create_app"]
