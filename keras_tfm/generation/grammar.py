"""Constrained decoding: llguidance (the grammar engine of vLLM's and llama.cpp's structured output:
JSON schemas compiled to a grammar, each step's allowed tokens in microseconds) gives each constrained
row the tokens its grammar allows next; the row loop (`continuous`) takes them as a bias
(`LARGE_NEGATIVE` elsewhere) at every step, so the text parses and validates whatever the weights.
llguidance is an optional package (`pip install llguidance`, or the `serve` extra)."""

from __future__ import annotations

import functools

import numpy as np

from keras_tfm.errors import InputError
from keras_tfm.layers.attention import LARGE_NEGATIVE


def schema_grammar(schema: dict) -> str:
    """llguidance's grammar of JSON that follows `schema`, without free whitespace."""
    return _llguidance("json_schema").LLMatcher.grammar_from_json_schema(
        schema, defaults={"whitespace_flexible": False}
    )


class Constraint:
    """One row's grammar (llguidance's, `schema_grammar` or `tool_call_grammar`): the tokens it allows
    next (`bias`) and the tokens it took (`take`)."""

    def __init__(self, model, grammar: str, argument: str = "json_schema"):
        llguidance = _llguidance(argument)
        self.matcher = llguidance.LLMatcher(_tokenizer(model), grammar)
        if self.matcher.is_error():  # an `InputError` naming `argument`
            raise InputError(f"the grammar: {self.matcher.get_error()}", argument)
        self.vocabulary_size, self.argument = model.decoding_vocabulary_size, argument

    def check_writable(self) -> None:
        """Refuses, naming the argument, a grammar that no token of the model's vocabulary can begin (a
        character-level vocabulary without `{` and JSON): decoding would choose a token it forbids."""
        allowed = np.flatnonzero(self.bias() == 0)  # llguidance's mask of a grammar stuck at once may allow an end
        if not any(self.matcher.validate_tokens([int(token)]) for token in allowed):
            raise InputError("no token of the model's vocabulary begins a reply this grammar allows.", self.argument)

    def bias(self) -> np.ndarray:
        """`(vocabulary,)` float32: 0 for the tokens the grammar allows next, `LARGE_NEGATIVE` elsewhere."""
        words = np.frombuffer(self.matcher.compute_bitmask(), np.uint32)
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocabulary_size].astype(bool)
        allowed = np.pad(allowed, (0, self.vocabulary_size - len(allowed)))
        return np.where(allowed, 0.0, LARGE_NEGATIVE).astype("float32")

    def take(self, token: int) -> bool:
        """Moves past `token`; whether the reply is complete (nothing more may follow)."""
        if not self.matcher.consume_token(int(token)):
            raise RuntimeError(f"the grammar refused token {token}: {self.matcher.get_error()}")
        return self.matcher.is_stopped()


@functools.lru_cache(maxsize=4)
def _tokenizer(model):
    """llguidance's view of the model's tokenizer (made once per model: about a second for 50k tokens):
    each id's bytes, the end ids."""
    import llguidance

    stops = [int(i) for i in np.asarray(model.stop_ids()).reshape(-1)]
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(_Tokens(model, stops)), n_vocab=model.decoding_vocabulary_size
    )


class _Tokens:
    """The tokenizer as llguidance's `TokenizerWrapper` reads one: each id's bytes (the id decoded alone;
    byte-level tokens through their byte table), the end id, and `__call__` to encode."""

    def __init__(self, model, stops: list[int]):
        tokenizer = model.tokenizer
        self.tokens = [_token_bytes(tokenizer, model, i) for i in range(model.decoding_vocabulary_size)]
        self.eos_token_id = stops[0] if stops else None
        self.bos_token_id = None
        inner = getattr(tokenizer, "_tokenizer", None)  # its special tokens never stand for text
        added = inner.get_added_tokens_decoder() if inner is not None else {}
        self.special_token_ids = sorted({*stops, *(i for i, token in added.items() if token.special)})
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return [int(i) for i in self._tokenizer.encode(text)]


def _token_bytes(tokenizer, model, token: int) -> bytes:
    """A token's bytes: from its byte-level or SentencePiece piece where the tokenizer has pieces (a
    piece decoded alone would lose a leading space or a part of a character), else decoded alone."""
    inner = getattr(tokenizer, "_tokenizer", None)  # Hugging Face `tokenizers`
    piece = inner.id_to_token(token) if inner is not None else None
    decoder = repr(inner.decoder) if inner is not None else ""
    if piece is not None and "ByteLevel" in decoder and all(c in _BYTE_LEVEL for c in piece):
        return bytes(_BYTE_LEVEL[c] for c in piece)
    if piece is not None and "ByteFallback" in decoder and len(piece) == 6 and piece.startswith("<0x"):
        return bytes([int(piece[3:5], 16)])
    if piece is not None and ("\u2581" in decoder or "Metaspace" in decoder):
        return piece.replace("\u2581", " ").encode()
    return model.decode_text([token]).encode()


def _byte_level_table() -> dict[str, int]:
    """GPT-2's printable stand-ins for bytes, reversed (what byte-level BPE tokens are written in)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


_BYTE_LEVEL = _byte_level_table()


def _llguidance(argument: str):
    try:
        import llguidance
    except ImportError:
        raise InputError(
            "constrained decoding needs llguidance: pip install llguidance (or 'keras_tfm[serve]').", argument
        ) from None
    return llguidance
