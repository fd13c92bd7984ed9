"""Tokenizers on disk: one JSON file each (`save_tokenizer`, `load_tokenizer`), and the recipes'
`load_or_fit_tokenizer`, which saves the fitted vocabulary in the output directory and reuses it on resume,
so a resumed run sees the same token ids; the file records what it was fitted on (a digest of the text,
the kind and the options), and a reuse on other text or options is refused."""

from __future__ import annotations

import hashlib
import json
import os

from keras_tfm.data.errors import DataError
from keras_tfm.data.tokenizers.base import TOKENIZERS


def load_tokenizer(path: str):
    """A tokenizer saved by `save` or `save_tokenizer`; `tokenizer.fitted_on` says what it was fitted on
    (`None` if unknown)."""
    try:
        with open(path, encoding="utf-8") as file:
            state = json.load(file)
        kind, fitted_on = state.pop("kind"), state.pop("fitted_on", None)
        tokenizer = TOKENIZERS[kind](**state)
    except (OSError, ValueError, KeyError, TypeError) as error:
        reason = f"{type(error).__name__}: {error}"[:200]
        raise DataError(
            f"the tokenizer file {path!r} is damaged or not a saved keras_tfm tokenizer ({reason}). Restore it from "
            "where the model was trained (its ids must be the model's), or delete it to fit a new one (a run then "
            "starts over: its checkpoints were trained on the old ids)."
        ) from None
    tokenizer.fitted_on = fitted_on
    return tokenizer


def save_tokenizer(tokenizer, output_dir: str, name: str = "tokenizer") -> str:
    """Writes `tokenizer` as `output_dir/{name}.json`, with what it was fitted on (`tokenizer.fitted_on`,
    set by `load_or_fit_tokenizer`); returns the path."""
    path = os.path.join(output_dir, f"{name}.json")
    temporary = path + ".tmp"
    tokenizer.save(temporary)
    with open(temporary, encoding="utf-8") as file:
        state = json.load(file)
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump({**state, "fitted_on": tokenizer.fitted_on}, file)
    os.replace(temporary, path)  # never a half-written tokenizer that a later run would reuse
    return path


def load_or_fit_tokenizer(
    kind: str,
    text: str,
    output_dir: str,
    vocabulary_size: int | None = None,
    log=print,
    name: str = "tokenizer",
    save: bool = True,
    **fit_options,
):
    """Loads `output_dir/{name}.json` if an earlier run saved one, else fits `kind` on `text` (passing
    `fit_options`, e.g. `lowercase=False` for WordPiece) and, with `save`, saves it (`save=False`: the
    caller saves it with `save_tokenizer` once everything else is checked, so that a refused run leaves
    no tokenizer behind). A saved tokenizer fitted on other text, or with another `kind`,
    `vocabulary_size` or options, is refused: its ids would silently change meaning."""
    path = os.path.join(output_dir, f"{name}.json")
    fitted_on = json.loads(
        json.dumps(
            {
                "kind": kind,
                "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                "vocabulary_size": vocabulary_size,
                **fit_options,
            }
        )
    )
    if os.path.exists(path):
        tokenizer = load_tokenizer(path)
        if tokenizer.kind != kind:
            raise DataError(
                f"{path!r} holds the {tokenizer.kind} tokenizer of an earlier run in this "
                f"`output_dir`, not {kind}; give `kind` {tokenizer.kind}, or another `output_dir`.",
                argument="kind",
            )
        if tokenizer.fitted_on is not None and tokenizer.fitted_on != fitted_on:
            changed = sorted(
                key
                for key in {**fitted_on, **tokenizer.fitted_on}
                if tokenizer.fitted_on.get(key) != fitted_on.get(key)
            )
            raise DataError(
                f"{path!r} holds a tokenizer an earlier run in this `output_dir` fitted on other "
                f"{', '.join('text' if key == 'text_sha256' else f'`{key}`' for key in changed)}; give the "
                f"earlier run's data and settings, or another `output_dir` (or delete {path!r} to fit anew)."
            )
        log(f"Tokenizer: reusing {path} ({tokenizer.kind}, {tokenizer.vocabulary_size} tokens).")
        return tokenizer
    if kind not in TOKENIZERS:
        raise DataError(f"expected one of {sorted(TOKENIZERS)}, got {kind!r}.", argument="kind")
    tokenizer = TOKENIZERS[kind].fit(text, vocabulary_size, **fit_options)
    tokenizer.fitted_on = fitted_on
    if save:
        save_tokenizer(tokenizer, output_dir, name)
    log(
        f"Tokenizer: fitted {kind} on the training text ({tokenizer.vocabulary_size} tokens)"
        + (f", saved to {path}." if save else ".")
    )
    return tokenizer
