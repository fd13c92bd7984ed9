"""A Hugging Face checkpoint's own tokenizer: its `tokenizer.json` (run by Hugging Face `tokenizers`, with
the chat template and special tokens of its `tokenizer_config.json`), or Marian's SentencePiece models;
`checkpoint_tokenizer` picks the one a checkpoint directory holds."""

from __future__ import annotations

import base64
import json
import os

import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.data.tokenizers.base import Tokenizer, checkpoint_files, pair_windows, single_windows
from keras_tfm.data.tokenizers.learned import BytePairTokenizer, WordPieceTokenizer
from keras_tfm.data.tokenizers.siglip import SiglipTokenizer, is_siglip_checkpoint


class HuggingFaceTokenizer(Tokenizer):
    """A checkpoint's `tokenizer.json` (the byte-level BPE of Llama 3, Qwen, Mistral and SmolLM, or any
    other), read and run by Hugging Face `tokenizers`, the library transformers' fast tokenizers run on:
    the same ids as `transformers.AutoTokenizer` of that checkpoint.

    Args:
        tokenizer_json: the content of a `tokenizer.json` file.
        chat_template: the checkpoint's Jinja chat template (`tokenizer_config.json`'s
            `chat_template`, or `chat_template.jinja`), or None.
        special_tokens: the special tokens a chat template reads, e.g. `{"bos_token": "<s>"}`.

    `encode(text)` encodes a whole text without special tokens (a corpus to train on; give
    `add_special_tokens=True` for transformers' default, e.g. Llama 3's `<|begin_of_text|>`).

    Example:
    >>> import tokenizers
    >>> words = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "to": 1, "be": 2}, unk_token="[UNK]"))
    >>> words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    >>> tokenizer = HuggingFaceTokenizer(words.to_str())  # or HuggingFaceTokenizer.from_huggingface(checkpoint)
    >>> tokenizer.encode("to be or").tolist()
    [1, 2, 0]
    """

    kind = "huggingface"

    def __init__(self, tokenizer_json: str, chat_template: str | None = None, special_tokens: dict | None = None):
        from tokenizers import Tokenizer

        self.tokenizer_json = tokenizer_json
        self._tokenizer = Tokenizer.from_str(tokenizer_json)
        self._literal = None  # made on first use: a copy that reads special tokens' text as text
        self._truncating = None  # (max_length, a copy that cuts there), made on first use
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_huggingface(cls, directory: str) -> HuggingFaceTokenizer:
        """The `tokenizer.json` of a checkpoint directory (or Hub model id, as in
        `keras_tfm.convert.checkpoint_directory`)."""
        directory = checkpoint_files(directory)
        path = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(path):
            raise DataError(f"no tokenizer.json in {directory!r}.", argument="from_huggingface")
        with open(path, encoding="utf-8") as file:
            content = file.read()
        try:
            tokenizer = cls(content)
        except Exception as error:  # tokenizers raises its own Exception for a malformed file
            raise DataError(
                f"the checkpoint's tokenizer file {path!r} is damaged ({str(error)[:200]}); download the checkpoint "
                "again, or replace tokenizer.json with the original.",
                argument="from_huggingface",
            ) from None
        tokenizer.chat_template, tokenizer.special_tokens = _chat_settings(directory)
        return tokenizer

    @property
    def vocabulary_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> np.ndarray:
        return np.asarray(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids, "int32")

    def encode_batch(self, texts: list[str], max_length: int | None = None) -> list[np.ndarray]:
        """Each text's ids with the checkpoint's special tokens (BERT's [CLS] ... [SEP]), cut to `max_length`
        ids as transformers' `truncation=True` cuts them: the text's last tokens go, the special tokens stay."""
        encodings = self._cut(max_length).encode_batch(texts, add_special_tokens=True)
        return [np.asarray(encoding.ids, "int32") for encoding in encodings]

    def encode_with_offsets(self, text: str, max_length: int | None = None):
        """`tokenizers`' encoding of `text` as `encode_batch` cuts it, with each token's characters
        (`offsets`) and word (`word_ids`)."""
        return self._cut(max_length).encode(text, add_special_tokens=True)

    def encode_windows(self, text: str, max_length: int, stride: int) -> list:
        """`tokenizers`' encodings of `text` in windows of `max_length` tokens that share `stride` tokens,
        with each token's characters (`offsets`) and word (`word_ids`, counted over the whole text)."""
        return single_windows(_fresh(self.tokenizer_json), text, max_length, stride)

    def encode_pair_windows(self, first: str, second: str, max_length: int, stride: int) -> list:
        """`tokenizers`' encodings of the pair (a question, a context) in windows of `max_length` tokens, the
        second text cut into overlapping pieces (`stride` tokens shared), as transformers' question-answering
        pipeline reads a long context."""
        return pair_windows(_fresh(self.tokenizer_json), first, second, max_length, stride)

    def _cut(self, max_length: int | None):
        """The tokenizer, or a copy that cuts at `max_length` (made once per length)."""
        if max_length is None:
            return self._tokenizer
        if self._truncating is None or self._truncating[0] != max_length:
            from tokenizers import Tokenizer

            truncating = Tokenizer.from_str(self.tokenizer_json)
            truncating.no_padding()
            truncating.enable_truncation(max_length)
            self._truncating = (max_length, truncating)
        return self._truncating[1]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def special_token_texts(self) -> list[str]:
        """The text of each special token (`<|im_end|>`), which `encode` turns into its id wherever it
        stands in a text."""
        return [token.content for token in self._tokenizer.get_added_tokens_decoder().values() if token.special]

    def encode_literal(self, text: str) -> np.ndarray:
        """`text` as plain text: a special token's text in it gives the ids of its characters, not the
        token (a user's message cannot forge a turn of the conversation)."""
        if self._literal is None:
            from tokenizers import Tokenizer

            self._literal = Tokenizer.from_str(self.tokenizer_json)
            self._literal.encode_special_tokens = True
        return np.asarray(self._literal.encode(text, add_special_tokens=False).ids, "int32")

    def encode_prompt(self, text: str) -> np.ndarray:
        """A prompt's ids as transformers' tokenizer gives them by default: with the special tokens the
        checkpoint puts in front (Llama 3's `<|begin_of_text|>`)."""
        return self.encode(text, add_special_tokens=True)

    def decode_text(self, ids) -> str:
        """Generated ids as text, without special tokens."""
        return self.decode(ids, skip_special_tokens=True)

    def save(self, path: str) -> None:
        state = {"kind": self.kind, "tokenizer_json": self.tokenizer_json}
        if self.chat_template:
            state.update(chat_template=self.chat_template, special_tokens=self.special_tokens)
        with open(path, "w", encoding="utf-8") as file:
            json.dump(state, file)

    def save_huggingface(self, directory: str) -> None:
        """Writes `tokenizer.json`, which `transformers.AutoTokenizer` reads as a fast tokenizer, and its
        chat template and special tokens in `tokenizer_config.json`."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "tokenizer.json"), "w", encoding="utf-8") as file:
            file.write(self.tokenizer_json)
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **self.special_tokens}
        if self.chat_template:
            config["chat_template"] = self.chat_template
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as file:
            json.dump(config, file, indent=2)


class MarianTokenizer(Tokenizer):
    """A Marian (opus-mt) checkpoint's tokenizer, run as transformers' `MarianTokenizer`: each side's
    SentencePiece model (`source.spm`, `target.spm`) cuts the text into pieces, and the checkpoint's
    vocabulary (`vocab.json`; `target_vocab.json` beside it for separate vocabularies) gives their ids,
    `<unk>` for a piece it lacks. A source ends with `</s>`; a leading language code (`>>de<<`) is kept
    whole. The same ids and text as transformers (tested).

    Args:
        source_model, target_model: the SentencePiece models (bytes, or base64 text).
        vocabulary: piece -> id of the source side (and of the target side when it is shared).
        target_vocabulary: piece -> id of the target side, for separate vocabularies; or None.
        unk_token, eos_token, pad_token: the checkpoint's special tokens.

    Example: `MarianTokenizer.from_huggingface("Helsinki-NLP/opus-mt-de-en")` (a directory or Hub id);
    `from_huggingface` attaches it to the translator, whose `translate` then takes and returns text.
    """

    kind = "marian"

    def __init__(
        self,
        source_model: bytes | str,
        target_model: bytes | str,
        vocabulary: dict,
        target_vocabulary: dict | None = None,
        unk_token: str = "<unk>",
        eos_token: str = "</s>",
        pad_token: str = "<pad>",
    ):
        import sentencepiece

        self.source_model, self.target_model = (
            base64.b64decode(model) if isinstance(model, str) else bytes(model)
            for model in (source_model, target_model)
        )
        self.vocabulary, self.target_vocabulary = dict(vocabulary), target_vocabulary and dict(target_vocabulary)
        self.unk_token, self.eos_token, self.pad_token = unk_token, eos_token, pad_token
        if unk_token not in self.vocabulary:
            raise DataError(f"the vocabulary has no {unk_token!r} (unk_token).", argument="vocabulary")
        self._source = sentencepiece.SentencePieceProcessor(model_proto=self.source_model)
        self._target = sentencepiece.SentencePieceProcessor(model_proto=self.target_model)
        target = self.target_vocabulary or self.vocabulary
        self._pieces = {index: piece for piece, index in target.items()}
        self._special_ids = {target[token] for token in (unk_token, eos_token, pad_token) if token in target}

    @classmethod
    def from_huggingface(cls, directory: str) -> MarianTokenizer:
        """The tokenizer files of a Marian checkpoint directory (or Hub model id)."""
        directory = checkpoint_files(directory)

        def read(name: str, binary: bool = False):
            path = os.path.join(directory, name)
            try:
                with open(path, "rb") as file:
                    content = file.read()
                return content if binary else json.loads(content)
            except (OSError, ValueError) as error:
                raise DataError(f"cannot read {path!r} ({error}).", argument="from_huggingface") from None

        config = (
            read("tokenizer_config.json") if os.path.isfile(os.path.join(directory, "tokenizer_config.json")) else {}
        )
        separate = config.get("separate_vocabs", False)
        return cls(
            read("source.spm", binary=True),
            read("target.spm", binary=True),
            read("vocab.json"),
            read("target_vocab.json") if separate else None,
            **{key: config[key] for key in ("unk_token", "eos_token", "pad_token") if isinstance(config.get(key), str)},
        )

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    def encode_source(self, text: str) -> np.ndarray:
        """A source sentence's ids, ending with `</s>`, as transformers' tokenizer gives them."""
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        pieces = code + self._source.encode(text, out_type=str)
        unknown = self.vocabulary[self.unk_token]
        return np.asarray(
            [self.vocabulary.get(piece, unknown) for piece in pieces] + [self.vocabulary[self.eos_token]], "int32"
        )

    def encode(self, text: str) -> np.ndarray:
        return self.encode_source(text)

    def decode(self, ids) -> str:
        return self.decode_target(ids)

    def decode_target(self, ids) -> str:
        """A translation's text, without special tokens (transformers' `decode(ids, skip_special_tokens=True)`)."""
        # transformers decodes with the source model where the vocabulary is shared
        model = self._target if self.target_vocabulary else self._source
        pieces = []
        for index in (int(i) for i in np.asarray(ids).reshape(-1)):
            if index in self._special_ids:
                continue
            pieces.append(self._pieces.get(index) or model.IdToPiece(index) or self.unk_token)
        return model.decode_pieces(pieces).replace("\u2581", " ").strip()

    def save(self, path: str) -> None:
        state = {
            "kind": self.kind,
            "source_model": base64.b64encode(self.source_model).decode("ascii"),
            "target_model": base64.b64encode(self.target_model).decode("ascii"),
            "vocabulary": self.vocabulary,
            "target_vocabulary": self.target_vocabulary,
            "unk_token": self.unk_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
        }
        with open(path, "w", encoding="utf-8") as file:
            json.dump(state, file)


def _chat_settings(directory: str) -> tuple[str | None, dict]:
    """A checkpoint's chat template (`chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`,
    a string or a list of named templates: "default") and its special tokens as strings."""
    config = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the second's tokens win, as in transformers
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as file:
                    config.update(json.load(file))
            except (OSError, ValueError) as error:
                raise DataError(f"cannot read {path!r} ({error}).", argument="from_huggingface") from None
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}]
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    jinja = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as file:
            template = file.read()
    special = {}
    for key, value in config.items():
        if key.endswith("_token") and isinstance(value, dict):  # {"content": "<s>", ...}
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            special[key] = value
    return (template if isinstance(template, str) else None), special


def checkpoint_tokenizer(directory: str):
    """The tokenizer of a Hugging Face checkpoint directory, or None where it has none: its
    `tokenizer.json` (any fast tokenizer), else Marian's `source.spm`, `target.spm` and `vocab.json`,
    else SigLIP's `spiece.model`, else GPT-2's `vocab.json` and `merges.txt`, else BERT's `vocab.txt`."""
    if os.path.isfile(os.path.join(directory, "tokenizer.json")):
        return HuggingFaceTokenizer.from_huggingface(directory)
    if is_siglip_checkpoint(directory):
        return SiglipTokenizer.from_huggingface(directory)
    if all(os.path.isfile(os.path.join(directory, name)) for name in ("source.spm", "target.spm", "vocab.json")):
        return MarianTokenizer.from_huggingface(directory)
    if all(os.path.isfile(os.path.join(directory, name)) for name in ("vocab.json", "merges.txt")):
        return BytePairTokenizer.from_huggingface(directory)
    if os.path.isfile(os.path.join(directory, "vocab.txt")):
        return WordPieceTokenizer.from_huggingface(directory)
    return None


def _fresh(tokenizer_json: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)
