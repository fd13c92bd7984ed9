"""The `Tokenizer` protocol: what every tokenizer of keras_tfm gives its callers, so that none probes.

A tokenizer turns text into int32 ids and back (`encode`, `decode`), knows its `vocabulary_size`,
saves itself as one JSON file (`save`; `keras_tfm.data.load_tokenizer` reads any of them back) and says
what `kind` it is. Models read more: `encode_prompt` (a prompt as the model continues it: a
checkpoint's tokenizer puts its begin-of-text token in front), `decode_text` (generated ids as text,
without special tokens), and for a translator `encode_source` and `decode_target` (a pair's tokenizer
encodes the source language and decodes the target; one tokenizer serves both sides by default).
A checkpoint's tokenizer may hold a `chat_template` (`apply_chat_template`), and those that can write
themselves for transformers override `save_huggingface` (`writes_huggingface()` says which).
"""

from __future__ import annotations

import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.errors import InputError

TOKENIZERS: dict[str, type[Tokenizer]] = {}  # kind -> class, filled as each kind is defined


class Tokenizer:
    """The base of every tokenizer: the protocol, with the defaults most tokenizers keep."""

    kind: str = ""
    chat_template: str | None = None
    fitted_on: dict | None = None  # what `load_or_fit_tokenizer` fitted it on (the text's digest, the options)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("kind"):  # a kind of its own: a saved file of this kind loads as this class
            TOKENIZERS[cls.kind] = cls

    @property
    def vocabulary_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str) -> np.ndarray:
        """The int32 ids of `text`."""
        raise NotImplementedError

    def decode(self, ids) -> str:
        """The text of `ids`."""
        raise NotImplementedError

    def encode_prompt(self, text: str) -> np.ndarray:
        """A prompt's ids as a model continues it (by default `encode`'s)."""
        return self.encode(text)

    def decode_text(self, ids) -> str:
        """Generated ids as text, without special tokens (by default `decode`'s)."""
        return self.decode(ids)

    def encode_source(self, text: str) -> np.ndarray:
        """A sentence to translate as ids (a translator's tokenizer encodes its source side; by default `encode`'s)."""
        return self.encode(text)

    def decode_target(self, ids) -> str:
        """A translation's ids as text (its target side; by default `decode_text`'s)."""
        return self.decode_text(ids)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, tools=None) -> str:
        """The prompt text of a conversation under `chat_template`, with the functions `tools` (OpenAI's
        `[{"type": "function", "function": {...}}]`, as the template reads them) where given; refused
        without a template."""
        from keras_tfm.data.chat import render_chat_template

        if not self.chat_template:
            raise DataError(
                f"this {self.kind} tokenizer has no chat template (a checkpoint's comes from its "
                "tokenizer_config.json or chat_template.jinja).",
                argument="messages",
            )
        variables = dict(getattr(self, "special_tokens", {}), **({"tools": tools} if tools is not None else {}))
        return render_chat_template(self.chat_template, messages, add_generation_prompt, **variables)

    def save(self, path: str) -> None:
        """Writes the tokenizer as one JSON file (`load_tokenizer` reads it back)."""
        raise NotImplementedError

    def save_huggingface(self, directory: str) -> None:
        """Writes the tokenizer's files as transformers reads them; refused where it cannot."""
        raise InputError(f"a {self.kind} tokenizer cannot write itself for transformers.", caller="save_huggingface")

    def writes_huggingface(self) -> bool:
        """Whether `save_huggingface` writes this tokenizer for transformers."""
        return type(self).save_huggingface is not Tokenizer.save_huggingface


def checkpoint_files(name_or_path: str) -> str:
    """The local directory of a checkpoint (or Hub model id) whose tokenizer files to read."""
    from keras_tfm.hub import checkpoint_directory

    try:
        return checkpoint_directory(name_or_path)
    except InputError as error:
        raise DataError(error.message, "from_huggingface") from None


def pair_windows(tokenizer, first: str, second: str, max_length: int, stride: int) -> list:
    """The windows of a pair from a `tokenizers.Tokenizer` (changed: it is a copy): the first text whole in
    each, the second cut with `stride` tokens of overlap."""
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length, stride=stride, strategy="only_second")
    encoding = tokenizer.encode(first, second, add_special_tokens=True)
    return [encoding, *encoding.overflowing]


def single_windows(tokenizer, text: str, max_length: int, stride: int) -> list:
    """The windows of one text from a `tokenizers.Tokenizer` (changed: it is a copy): `max_length` tokens
    each with its special tokens, `stride` tokens shared by two neighbours; one window for a short text."""
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length, stride=stride)
    encoding = tokenizer.encode(text, add_special_tokens=True)
    return [encoding, *encoding.overflowing]


def tokenizer_state(tokenizer: Tokenizer) -> dict:
    """What `tokenizer.save` writes, as a dict."""
    import json
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tokenizer.json")
        tokenizer.save(path)
        with open(path, encoding="utf-8") as file:
            return json.load(file)


def tokenizer_from_state(state: dict) -> Tokenizer:
    """The tokenizer `tokenizer_state` describes (its `kind` registered)."""
    state = dict(state)
    return TOKENIZERS[state.pop("kind")](**{key: value for key, value in state.items() if key != "fitted_on"})
