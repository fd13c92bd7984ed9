"""Sentence embeddings: an encoder's token vectors pooled into one vector per text, as sentence-transformers
gives them (all-MiniLM, bge, e5, ...).

texts -> tokenizer (special tokens, cut to max_sequence_length) -> encoder -> TokenPooling -> [projections]
-> [unit length]
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.token_pooling import TokenPooling
from keras_tfm.models.base import ZooModel


@keras.saving.register_keras_serializable(package="keras_tfm")
class SentenceEmbedder(ZooModel):
    """One vector per text: `embed(texts)`, or the model called on token ids as `fit` and `predict` call it.

    Args:
        encoder: the token encoder (a `Bert` or `ModernBert`): `encoder(token_ids, padding_mask=...)`
            gives `(batch, length, hidden_dim)`.
        pooling: the `TokenPooling` modes: "mean" (default), "cls", "max", "mean_sqrt_len_tokens",
            "weightedmean", "lasttoken", or several (their vectors concatenated).
        normalize: scale each vector to unit length (sentence-transformers' `Normalize` module), so that
            a dot product is the cosine similarity.
        max_sequence_length: `embed` cuts texts to this many tokens, special tokens included (the
            checkpoint's `max_seq_length`); default: as many as the encoder's positions take.
        lowercase: lowercase texts before tokenizing (sentence-transformers' `do_lower_case`).
        prompts: named texts `embed` puts before each text (`prompt_name="query"`), as e5's
            `{"query": "query: ", "passage": "passage: "}`; `default_prompt_name`: the one used unless told.
        projections: dense layers applied in order to the pooled vector, before it is scaled to unit
            length (sentence-transformers' `Dense` modules), each `{"units": int, "activation": a Keras
            activation's name, "use_bias": bool}`: LaBSE's `[{"units": 768, "activation": "tanh"}]`.

    Call arguments: `token_ids`, `segment_ids` (optional), `padding_mask` (True at real tokens; default all
    real), `(batch, length)` or `(batch, k, length)` for k texts per row (pairs for a contrastive loss):
    returns `(batch, dim)` or `(batch, k, dim)`. `tokenize(texts)` makes these inputs.

    Example:
    >>> embedder = SentenceEmbedder(keras_tfm.bert_tiny(head=None, vocabulary_size=100), pooling="mean")
    >>> tuple(embedder(np.array([[2, 7, 9, 3]])).shape)  # from_huggingface(directory).embed(["a text"]) with a tokenizer
    (1, 128)
    """

    default_learning_rate = 2e-5
    id_ranks = (2, 3)  # (batch, length), or (batch, k, length): k texts per row

    def __init__(
        self,
        encoder: keras.Model,
        pooling: str | tuple | list = "mean",
        normalize: bool = True,
        max_sequence_length: int | None = None,
        lowercase: bool = False,
        prompts: dict | None = None,
        default_prompt_name: str | None = None,
        projections: list | None = None,
        **kwargs,
    ):
        kwargs.setdefault("name", "sentence_embedder")
        super().__init__(**kwargs)
        if not isinstance(encoder, keras.Model) or not hasattr(encoder, "hidden_dim"):
            raise InputError(
                f"expected a token encoder model (e.g. keras_tfm.Bert); received {type(encoder).__name__}.",
                "encoder",
                caller="SentenceEmbedder",
            )
        self.encoder = encoder
        self.token_pooling = TokenPooling(pooling, dtype=self.dtype_policy, name="token_pooling")
        self.pooling = self.token_pooling.modes
        self.normalize = bool(normalize)
        self.max_sequence_length = max_sequence_length or encoder.longest_input
        self.lowercase = bool(lowercase)
        self.prompts = dict(prompts or {})
        if default_prompt_name is not None and default_prompt_name not in self.prompts:
            raise InputError(
                f"expected one of the prompts' names {sorted(self.prompts)}; received {default_prompt_name!r}.",
                "default_prompt_name",
                caller="SentenceEmbedder",
            )
        self.default_prompt_name = default_prompt_name
        self.projections = [_checked_projection(p) for p in projections or ()]
        self.projection_layers = [
            keras.layers.Dense(
                p["units"], p["activation"], p["use_bias"], dtype=self.dtype_policy, name=f"projection_{i}"
            )
            for i, p in enumerate(self.projections)
        ]
        self._compile_defaults()

    @property
    def vocabulary_size(self) -> int:
        return self.encoder.vocabulary_size

    @property
    def embedding_dim(self) -> int:
        return self.projections[-1]["units"] if self.projections else self.pooled_dim

    @property
    def pooled_dim(self) -> int:
        """The pooled vector's size, before any projection."""
        return self.encoder.hidden_dim * len(self.pooling)

    def default_loss(self) -> keras.losses.Loss:
        from keras_tfm.losses import MultipleNegativesRankingLoss

        return MultipleNegativesRankingLoss()

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs) -> None:
        # no accuracy by default: the outputs are vectors, not class scores
        super().compile(optimizer, loss, None if isinstance(metrics, str) and metrics == "auto" else metrics, **kwargs)

    def build(self, token_ids_shape=None):
        self.encoder.build()
        size = self.pooled_dim
        for layer, projection in zip(self.projection_layers, self.projections):
            layer.build((None, size))
            size = projection["units"]
        self.built = True

    def call(self, token_ids, segment_ids=None, padding_mask=None, training=None):
        if isinstance(token_ids, dict):
            return self.call(**token_ids, training=training)
        shape = ops.shape(token_ids)
        if len(token_ids.shape) == 3:  # k texts per row: one batch of rows x k
            flat = [None if x is None else ops.reshape(x, (-1, shape[-1])) for x in (segment_ids, padding_mask)]
            vectors = self.call(ops.reshape(token_ids, (-1, shape[-1])), *flat, training=training)
            return ops.reshape(vectors, (shape[0], shape[1], -1))
        segments = {} if segment_ids is None else {"segment_ids": segment_ids}  # ModernBERT has none
        x = self.encoder(token_ids, padding_mask=padding_mask, training=training, **segments)
        x = self.token_pooling(x, padding_mask=padding_mask)
        for layer in self.projection_layers:
            x = layer(x)
        if self.normalize:
            x = x / ops.maximum(ops.norm(x, axis=-1, keepdims=True), 1e-12)
        return x

    def tokenize(self, texts, prompt: str | None = None, length: int | None = None) -> dict:
        """`{"token_ids", "padding_mask"}` of `texts` (a list of strings, or of tuples of k strings: anchor,
        positive, negatives), padded to the longest (or to `length`) with 0 and cut to `max_sequence_length`."""
        rows = [(text,) if isinstance(text, str) else tuple(text) for text in _text_list(texts, "tokenize", rows=True)]
        width = len(rows[0])
        if any(len(row) != width for row in rows):
            raise InputError(f"expected rows of {width} texts each; received rows of {sorted({len(r) for r in rows})}.",
                             "texts", caller="SentenceEmbedder.tokenize")  # fmt: skip
        ids = self.encode([text for row in rows for text in row], prompt)
        length = length or max(len(row) for row in ids)
        shape = (len(rows), length) if isinstance(texts[0], str) else (len(rows), width, length)
        return {name: array.reshape(shape) for name, array in _padded(ids, len(ids), length).items()}

    def embed(self, texts, batch_size: int = 32, prompt_name: str | None = None, prompt: str | None = None):
        """The vectors of `texts` (a list: `(len(texts), embedding_dim)` float32; one string: `(embedding_dim,)`),
        as sentence-transformers' `encode` gives them: texts batched by length, each batch padded to its
        longest. `prompt_name` (one of `prompts`) or `prompt` (a text) goes before each text."""
        single = isinstance(texts, str)
        ids = self.encode([texts] if single else _text_list(texts, "embed"), self._prompt(prompt_name, prompt))
        vectors = self.embed_token_ids(ids, batch_size)
        return vectors[0] if single else vectors

    def embed_token_ids(self, ids: list, batch_size: int = 32) -> np.ndarray:
        """The vectors of texts given as their token ids (each a sequence, special tokens included, as
        `encode` gives them): `(len(ids), embedding_dim)` float32."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise InputError(f"expected an integer >= 1; received {batch_size!r}.", "batch_size", caller="embed")
        ids = [np.asarray(row, "int32").reshape(-1) for row in ids]
        _check_token_ids(ids, self.encoder.longest_input, self.vocabulary_size)
        order = np.argsort([-len(row) for row in ids], kind="stable")
        vectors = np.zeros((len(ids), self.embedding_dim), "float32")
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            vectors[chosen] = self._embed_batch([ids[i] for i in chosen], batch_size)
        return vectors

    def _embed_batch(self, ids: list, batch_size: int) -> np.ndarray:
        """One batch, its rows and length rounded up (to a power of two, a multiple of 8), so that a
        compiling backend meets few shapes; padding changes no vector."""
        rows = min(batch_size, 1 << (len(ids) - 1).bit_length())
        length = min(-(-max(len(row) for row in ids) // 8) * 8, self.encoder.longest_input)
        vectors = self.predict_on_batch(_padded(ids, rows, length))
        return np.asarray(ops.convert_to_numpy(vectors), "float32")[: len(ids)]

    def _prompt(self, prompt_name: str | None, prompt: str | None) -> str | None:
        if prompt is not None and prompt_name is not None:
            raise InputError("give `prompt_name` or `prompt`, not both.", "prompt", caller="embed")
        name = prompt_name if prompt is None else None
        name = self.default_prompt_name if name is None and prompt is None else name
        if name is not None and name not in self.prompts:
            raise InputError(
                f"expected one of {sorted(self.prompts)}; received {name!r}.", "prompt_name", caller="embed"
            )
        return self.prompts[name] if name is not None else prompt

    def encode(self, texts: list[str], prompt: str | None = None) -> list:
        """Each text's token ids as `embed` reads them: `prompt` before it, lowercased where the checkpoint
        says, the tokenizer's special tokens around it, cut to `max_sequence_length`."""
        if self.tokenizer is None or not hasattr(self.tokenizer, "encode_batch"):
            raise InputError(
                "this embedder has no tokenizer that reads sentences (a checkpoint's tokenizer.json or vocab.txt): "
                "set `embedder.tokenizer`, or call the model on token ids.",
                "tokenizer",
                caller="SentenceEmbedder",
            )
        texts = [(prompt or "") + text for text in texts]
        texts = [text.lower() for text in texts] if self.lowercase else texts
        return self.tokenizer.encode_batch(texts, max_length=self.max_sequence_length)

    def _id_inputs(self) -> dict:
        return {name: rule for name, rule in self.encoder._id_inputs().items() if name != "output_positions"}

    def _config_value(self, name: str):
        return list(self.pooling) if name == "pooling" else getattr(self, name)


def _checked_projection(projection) -> dict:
    """A projection's `{"units", "activation", "use_bias"}` (activation "linear" and a bias by default),
    refused by name where it is not one."""
    given = projection if isinstance(projection, dict) else {}
    checked = {"units": given.get("units"), "activation": given.get("activation", "linear"),
               "use_bias": given.get("use_bias", True)}  # fmt: skip
    units, activation = checked["units"], checked["activation"]
    known = isinstance(activation, str) and _is_activation(activation)
    if (
        set(given) - set(checked) or not given or isinstance(units, bool) or not isinstance(units, int) or units < 1
        or not known or not isinstance(checked["use_bias"], bool)
    ):  # fmt: skip
        raise InputError(
            'expected each a dict {"units": an integer >= 1, "activation": a Keras activation\'s name, '
            f'"use_bias": True or False}}; received {projection!r}.',
            "projections",
            caller="SentenceEmbedder",
        )
    return checked


def _is_activation(name: str) -> bool:
    try:
        return callable(keras.activations.get(name))
    except ValueError:
        return False


def _padded(ids: list, rows: int, length: int) -> dict:
    """`rows` x `length` token ids (0 after each text, and in rows past the texts) and their padding mask."""
    token_ids, padding_mask = np.zeros((rows, length), "int32"), np.zeros((rows, length), bool)
    for i, row in enumerate(ids):
        token_ids[i, : len(row[:length])], padding_mask[i, : len(row[:length])] = row[:length], True
    return {"token_ids": token_ids, "padding_mask": padding_mask}


def _check_token_ids(ids: list, max_length: int, vocabulary_size: int) -> None:
    if not ids:
        raise InputError("expected at least one text's ids; received none.", "ids", caller="embed_token_ids")
    for row in ids:
        if not 1 <= len(row) <= max_length or row.min() < 0 or row.max() >= vocabulary_size:
            raise InputError(
                f"expected each text's ids to be 1 to {max_length} ids in [0, vocabulary_size={vocabulary_size}); "
                f"received {len(row)} ids in [{row.min(initial=0)}, {row.max(initial=0)}].",
                "ids",
                caller="embed_token_ids",
            )


def _text_list(texts, caller: str, rows: bool = False) -> list:
    """`texts` checked: a non-empty list of strings (or, with `rows`, of tuples of strings)."""
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
        raise InputError(
            f"expected a non-empty list of texts; received {type(texts).__name__}.", "texts", caller=caller
        )
    grouped = [(item,) if isinstance(item, str) else item if rows else None for item in texts]
    if not all(isinstance(row, (tuple, list)) and all(isinstance(text, str) for text in row) for row in grouped):
        raise InputError("expected every text to be a string.", "texts", caller=caller)
    return list(texts)
