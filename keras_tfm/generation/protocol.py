"""What generation, the server and export may use of a model: `DecodingModel`. `CausalLM` and
`Translator` implement it; nothing outside `keras_tfm.models` reads a model's private attributes."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from keras_tfm.generation.compiled import CompiledFunctions


class DecodingModel(Protocol):
    """A model the decoding loops can run.

    - `call_with_cache(token_ids, cache, cache_update_index, *context, output_logits=True, logits_at=None)` ->
      `(logits, cache)`: the model on `token_ids` at positions `cache_update_index ...` (a scalar, or `(rows,)`:
      each row's), reading and writing the key/value `cache` (`logits_at` `(rows,)`: the logits at each row's
      index alone).
    - `decoding_cache(rows, length, *inputs, copies=1)` -> `(cache, context)`: an empty cache, and what
      every step reads (a translator's encoder keys/values, for `copies` beams of each row).
    - `empty_cache(rows, length)`: the empty cache alone (a decoder-only model's).
    - `decoding_vocabulary_size`: the logits' width.
    - `compiled_decoding()`: the model, built, and its cache of compiled decoding functions.
    - `stop_ids(stop_token_ids=None)`: ids that end a row (None: the checkpoint's end ids).
    - `decode_text(ids)`: the text of ids, without special tokens.
    - `max_length`: the longest sequence its positions allow.
    """

    decoding_vocabulary_size: int
    max_length: int

    def call_with_cache(
        self, token_ids, cache, cache_update_index, *context, output_logits: bool = True, logits_at=None
    ): ...

    def decoding_cache(self, rows: int, length: int, *inputs, copies: int = 1) -> tuple: ...

    def empty_cache(self, rows: int, length: int) -> tuple: ...

    def compiled_decoding(self) -> CompiledFunctions: ...

    def stop_ids(self, stop_token_ids=None) -> np.ndarray: ...

    def decode_text(self, ids) -> str: ...
