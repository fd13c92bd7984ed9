"""Tokenizers for the recipes: characters (nanoGPT's), or subwords through keras-hub's WordPiece,
byte-pair (GPT-2's byte-level BPE) or SentencePiece tokenizers, or a checkpoint's own `tokenizer.json`.

All expose `encode(text) -> int32 array`, `decode(ids) -> str`, `vocabulary_size` and `save(path)`;
`load_or_fit_tokenizer` saves the fitted vocabulary in the output directory and reuses it on resume,
so a resumed run sees the same token ids; the file records what it was fitted on (a digest of the
text, the kind and the options), and a reuse on other text or options is refused.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os

import numpy as np

from keras_tfm.data.errors import DataError


def _checkpoint_directory(name_or_path: str) -> str:
    from keras_tfm.convert.files import checkpoint_directory

    try:
        return checkpoint_directory(name_or_path)
    except OSError as error:
        raise DataError(str(error).removeprefix("from_huggingface: "), "from_huggingface") from None


WORDPIECE_RESERVED = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[START]", "[END]"]


def _rows(rows) -> list[np.ndarray]:
    """keras-hub tokenizer output (a tf.RaggedTensor on TensorFlow, lists elsewhere) -> int32 arrays."""
    rows = rows.to_list() if hasattr(rows, "to_list") else rows
    return [np.asarray(row, "int32") for row in rows]


def _text(value) -> str:
    """keras-hub detokenizer output (a tensor, bytes or str) -> str."""
    value = value.numpy() if hasattr(value, "numpy") else value
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


class _KerasHubTokenizer:
    """Encoding and decoding through the keras-hub tokenizer a subclass keeps in `_tokenizer`."""

    def encode_lines(self, lines: list[str]) -> list[np.ndarray]:
        return _rows(self._tokenizer(lines)) if lines else []

    def encode(self, text: str) -> np.ndarray:
        rows = self.encode_lines([line for line in text.splitlines() if line.strip()])
        return np.concatenate(rows) if rows else np.zeros((0,), "int32")

    def decode(self, ids) -> str:
        return _text(self._tokenizer.detokenize(np.asarray(ids, "int32").reshape(-1)))


class CharacterTokenizer:
    """One id per distinct character of the training text, in sorted order (as nanoGPT)."""

    kind = "char"

    def __init__(self, vocabulary: list[str]):
        self.vocabulary = list(vocabulary)
        self._index = {character: i for i, character in enumerate(self.vocabulary)}

    @classmethod
    def fit(cls, text: str, vocabulary_size: int | None = None) -> CharacterTokenizer:
        return cls(sorted(set(text)))

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    def encode(self, text: str) -> np.ndarray:
        unknown = set(text) - self._index.keys()
        if unknown:  # characters only in validation text: drop them rather than invent ids
            text = "".join(c for c in text if c in self._index)
        return np.fromiter((self._index[c] for c in text), dtype="int32", count=len(text))

    def decode(self, ids) -> str:
        return "".join(self.vocabulary[int(i)] for i in np.asarray(ids).reshape(-1))

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"kind": self.kind, "vocabulary": self.vocabulary}, file)

    def save_huggingface(self, directory: str) -> None:
        """Writes the tokenizer as transformers' `PreTrainedTokenizerFast` reads it (`tokenizer.json`,
        built with Hugging Face `tokenizers`), giving the same ids and text: characters outside the
        vocabulary are dropped, every other one is a token, and decoding joins them unchanged. Beside
        `keras_tfm.save_huggingface(model, directory)`, `transformers.pipeline("text-generation",
        directory)` works on a character-level GPT."""
        from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

        known = "".join(f"\\x{{{ord(character):x}}}" for character in self.vocabulary)  # Oniguruma's code points
        # WordLevel needs an unknown token's name; none is reached, since the normalizer drops such characters
        tokenizer = Tokenizer(models.WordLevel({c: i for i, c in enumerate(self.vocabulary)}, unk_token="\x00unknown"))
        tokenizer.normalizer = normalizers.Replace(Regex(f"[^{known}]"), "")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(f"[{known}]"), behavior="isolated")
        tokenizer.decoder = decoders.Fuse()
        os.makedirs(directory, exist_ok=True)
        tokenizer.save(os.path.join(directory, "tokenizer.json"))
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as file:
            json.dump(
                {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}, file, indent=2
            )


class WordPieceTokenizer(_KerasHubTokenizer):
    """keras-hub's `WordPieceTokenizer` over a vocabulary from `compute_word_piece_vocabulary`."""

    kind = "wordpiece"

    def __init__(self, vocabulary: list[str], lowercase: bool = True, strip_accents: bool = False):
        import keras_hub

        self.vocabulary = list(vocabulary)
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self._tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=self.vocabulary,
            lowercase=lowercase,
            strip_accents=strip_accents,
            oov_token="[UNK]",
            dtype="int32",
        )

    @classmethod
    def from_huggingface(cls, directory: str) -> WordPieceTokenizer:
        """The tokenizer of a Hugging Face BERT checkpoint directory (or Hub model id, as in
        `keras_tfm.convert.checkpoint_directory`): its `vocab.txt`, lowercased and with accents stripped
        as its `tokenizer_config.json` says (`do_lower_case`, `strip_accents`; BERT's defaults: both
        when lowercasing)."""
        directory = _checkpoint_directory(directory)
        vocabulary_path = os.path.join(directory, "vocab.txt")
        if not os.path.isfile(vocabulary_path):
            raise DataError(f"no vocab.txt (the WordPiece vocabulary) in {directory!r}.", argument="from_huggingface")
        with open(vocabulary_path, encoding="utf-8") as file:
            vocabulary = [line.rstrip("\n") for line in file]
        config = {}
        config_path = os.path.join(directory, "tokenizer_config.json")
        if os.path.isfile(config_path):
            try:
                with open(config_path, encoding="utf-8") as file:
                    config = json.load(file)
            except ValueError as error:
                raise DataError(f"{config_path!r} is not valid JSON ({error}).", argument="from_huggingface") from None
        lowercase = config.get("do_lower_case", True)
        strip_accents = config.get("strip_accents")
        missing = [token for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]") if token not in vocabulary]
        if missing:
            raise DataError(f"{vocabulary_path!r} lacks the special tokens {missing}.", argument="from_huggingface")
        return cls(vocabulary, lowercase, lowercase if strip_accents is None else strip_accents)

    @classmethod
    def fit(cls, text: str, vocabulary_size: int | None = None, lowercase: bool = True) -> WordPieceTokenizer:
        import keras_hub
        import tensorflow as tf  # keras-hub's tokenizers run on tf.text

        lines = [line for line in text.splitlines() if line.strip()]
        vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
            tf.data.Dataset.from_tensor_slices(lines).batch(1024),
            vocabulary_size or 8192,
            lowercase=lowercase,
            reserved_tokens=WORDPIECE_RESERVED,
        )
        return cls(vocabulary, lowercase)

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    def token_id(self, token: str) -> int:
        return self.vocabulary.index(token)

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(
                {
                    "kind": self.kind,
                    "vocabulary": self.vocabulary,
                    "lowercase": self.lowercase,
                    "strip_accents": self.strip_accents,
                },
                file,
            )

    def save_huggingface(self, directory: str) -> None:
        """Writes the tokenizer as Hugging Face's `BertTokenizer` reads it (`vocab.txt`,
        `tokenizer_config.json`), giving the same ids: beside `keras_tfm.save_huggingface(model,
        directory)`, `transformers.pipeline("fill-mask", directory)` works."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as file:
            file.write("".join(token + "\n" for token in self.vocabulary))
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as file:
            json.dump(
                {
                    "tokenizer_class": "BertTokenizer",
                    "do_lower_case": self.lowercase,
                    "strip_accents": self.strip_accents,
                },
                file,
                indent=2,
            )


class BytePairTokenizer(_KerasHubTokenizer):
    """keras-hub's `BytePairTokenizer` (GPT-2's byte-level BPE: any text encodes, no unknown tokens).

    keras-hub encodes but does not learn merges; `fit` learns them with Hugging Face `tokenizers`
    (`ByteLevelBPETokenizer`, the same byte-level alphabet and pre-tokenization as GPT-2)."""

    kind = "bpe"

    def __init__(self, vocabulary: dict[str, int], merges: list[str]):
        import keras_hub
        from tokenizers import pre_tokenizers

        from keras_tfm import compat

        self.vocabulary, self.merges = dict(vocabulary), list(merges)
        self._tokenizer = keras_hub.tokenizers.BytePairTokenizer(self.vocabulary, self.merges, dtype="int32")
        # keras-hub encodes through Hugging Face `tokenizers` but splits words with Llama 3's pattern
        # ("speak'st" -> "'", "st"), not GPT-2's ("'s", "t"). GPT-2's own pre-tokenizer gives the ids of
        # Hugging Face's GPT2Tokenizer (tested). keras-hub's TensorFlow path splits as GPT-2 does too, but
        # many times slower.
        compat.set_pre_tokenizer(self._tokenizer, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))

    @classmethod
    def fit(cls, text: str, vocabulary_size: int | None = None) -> BytePairTokenizer:
        from tokenizers import ByteLevelBPETokenizer

        learner = ByteLevelBPETokenizer()
        learner.train_from_iterator(
            text.splitlines(keepends=True), vocab_size=vocabulary_size or 8192, show_progress=False
        )
        state = json.loads(learner.to_str())["model"]
        merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
        return cls(state["vocab"], merges)

    @classmethod
    def from_huggingface(cls, directory: str) -> BytePairTokenizer:
        """The tokenizer of a Hugging Face GPT-2 checkpoint directory (or Hub model id, as in
        `keras_tfm.convert.checkpoint_directory`): its `vocab.json` and `merges.txt`."""
        directory = _checkpoint_directory(directory)
        paths = [os.path.join(directory, name) for name in ("vocab.json", "merges.txt")]
        missing = [os.path.basename(path) for path in paths if not os.path.isfile(path)]
        if missing:
            raise DataError(
                f"no {' or '.join(missing)} (GPT-2's byte-pair tokenizer) in {directory!r}.",
                argument="from_huggingface",
            )
        try:
            with open(paths[0], encoding="utf-8") as file:
                vocabulary = json.load(file)
            with open(paths[1], encoding="utf-8") as file:
                merges = [line.rstrip("\n") for line in file if line.strip() and not line.startswith("#version")]
        except ValueError as error:
            raise DataError(
                f"cannot read the tokenizer in {directory!r} ({error}).", argument="from_huggingface"
            ) from None
        if not isinstance(vocabulary, dict):
            raise DataError(f"{paths[0]!r} must map tokens to ids.", argument="from_huggingface")
        return cls(vocabulary, merges)

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    def encode(self, text: str) -> np.ndarray:
        rows = self.encode_lines(text.splitlines(keepends=True))  # newlines are tokens too; lines keep inputs short
        return np.concatenate(rows) if rows else np.zeros((0,), "int32")

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"kind": self.kind, "vocabulary": self.vocabulary, "merges": self.merges}, file)

    def save_huggingface(self, directory: str) -> None:
        """Writes the tokenizer as Hugging Face's `GPT2Tokenizer` reads it (`vocab.json`,
        `merges.txt`), giving the same ids line by line: beside `keras_tfm.save_huggingface(model,
        directory)`, `transformers.pipeline("text-generation", directory)` works."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as file:
            json.dump(self.vocabulary, file, ensure_ascii=False)
        with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as file:
            file.write("#version: 0.2\n" + "".join(merge + "\n" for merge in self.merges))
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as file:
            json.dump({"tokenizer_class": "GPT2Tokenizer"}, file, indent=2)


class SentencePieceTokenizer(_KerasHubTokenizer):
    """keras-hub's `SentencePieceTokenizer` over a unigram model learned by the `sentencepiece` trainer.

    The ids keras-hub's `compute_sentence_piece_proto` reserves: 0 padding, 1 unknown, 2 start
    ([START], SentencePiece's `<s>`), 3 end ([END], `</s>`). The trainer is called directly so that
    `vocabulary_size` is a maximum, as for WordPiece, rather than a size small texts cannot reach,
    that every character of the training text keeps a piece (`character_coverage=1.0`, as
    SentencePiece advises for alphabets; its default drops the rarest, such as German „), and that
    its log stays out of the recipe's output. Characters never seen become [UNK]."""

    kind = "sentencepiece"
    SPECIAL_IDS = {"[PAD]": 0, "[UNK]": 1, "[START]": 2, "[END]": 3}

    def __init__(self, proto: bytes | str):
        import keras_hub

        self.proto = base64.b64decode(proto) if isinstance(proto, str) else bytes(proto)
        self._tokenizer = keras_hub.tokenizers.SentencePieceTokenizer(proto=self.proto, dtype="int32")

    @classmethod
    def fit(cls, text: str, vocabulary_size: int | None = None, lowercase: bool = False) -> SentencePieceTokenizer:
        import io

        import sentencepiece

        lines = [line for line in text.splitlines() if line.strip()]
        model = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(lines),
                model_writer=model,
                vocab_size=vocabulary_size or 8000,
                model_type="unigram",
                normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
                hard_vocab_limit=False,
                character_coverage=1.0,
                minloglevel=2,
                pad_id=0,
                unk_id=1,
                bos_id=2,
                eos_id=3,
            )
        except RuntimeError as error:  # e.g. fewer pieces allowed than the text has characters
            raise DataError(
                f"SentencePiece cannot train on this text with {vocabulary_size} pieces "
                f"({str(error).strip().splitlines()[-1]}).",
                argument="vocabulary_size",
            ) from None
        return cls(model.getvalue())

    @property
    def vocabulary_size(self) -> int:
        return int(self._tokenizer.vocabulary_size())

    def token_id(self, token: str) -> int:
        return self.SPECIAL_IDS[token]

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"kind": self.kind, "proto": base64.b64encode(self.proto).decode("ascii")}, file)


class HuggingFaceTokenizer:
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
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_huggingface(cls, directory: str) -> HuggingFaceTokenizer:
        """The `tokenizer.json` of a checkpoint directory (or Hub model id, as in
        `keras_tfm.convert.checkpoint_directory`)."""
        directory = _checkpoint_directory(directory)
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

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text of a conversation, as transformers' `apply_chat_template(messages,
        tokenize=False)` renders it; `encode` of it gives transformers' ids (`tokenize=True`).

        Args:
            messages: `[{"role": "user", "content": "..."}, ...]`.
            add_generation_prompt: end with what opens the assistant's reply.
        """
        from keras_tfm.data.chat import render_chat_template

        if not self.chat_template:
            raise DataError(
                "this tokenizer has no chat template (its checkpoint's tokenizer_config.json has no chat_template).",
                argument="messages",
            )
        return render_chat_template(self.chat_template, messages, add_generation_prompt, **self.special_tokens)

    @property
    def vocabulary_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> np.ndarray:
        return np.asarray(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids, "int32")

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

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


class MarianTokenizer:
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
        directory = _checkpoint_directory(directory)

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


class TranslationTokenizer:
    """A translator's two tokenizers as one, so that `Translator.translate` takes and returns text: the
    source side's encodes sources, the target side's decodes translations (the translator recipe's
    WordPiece or SentencePiece per language; it attaches this to the model it trains).

    Args:
        source, target: tokenizers of `keras_tfm.data` (or their saved states, as `load_tokenizer` gives).
        pad_token_id: the padding id, left out of the decoded text.
    """

    kind = "translation"

    def __init__(self, source, target, pad_token_id: int = 0):
        self.source, self.target = (_from_state(side) if isinstance(side, dict) else side for side in (source, target))
        self.pad_token_id = pad_token_id

    @property
    def vocabulary_size(self) -> int:
        return self.source.vocabulary_size

    def encode_source(self, text: str) -> np.ndarray:
        return np.asarray(self.source.encode(text), "int32")

    def decode_target(self, ids) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1) if int(i) != self.pad_token_id]
        return self.target.decode(ids) if ids else ""

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(
                {
                    "kind": self.kind,
                    "source": _state(self.source),
                    "target": _state(self.target),
                    "pad_token_id": self.pad_token_id,
                },
                file,
            )


def _state(tokenizer) -> dict:
    """What `tokenizer.save` writes, as a dict."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tokenizer.json")
        tokenizer.save(path)
        with open(path, encoding="utf-8") as file:
            return json.load(file)


def _from_state(state: dict):
    state = dict(state)
    return TOKENIZERS[state.pop("kind")](**{key: value for key, value in state.items() if key != "fitted_on"})


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


TOKENIZERS = {
    "char": CharacterTokenizer,
    "wordpiece": WordPieceTokenizer,
    "bpe": BytePairTokenizer,
    "sentencepiece": SentencePieceTokenizer,
    "huggingface": HuggingFaceTokenizer,
    "marian": MarianTokenizer,
    "translation": TranslationTokenizer,
}


def checkpoint_tokenizer(directory: str):
    """The tokenizer of a Hugging Face checkpoint directory, or None where it has none: its
    `tokenizer.json` (any fast tokenizer), else Marian's `source.spm`, `target.spm` and `vocab.json`,
    else GPT-2's `vocab.json` and `merges.txt`, else BERT's `vocab.txt`."""
    if os.path.isfile(os.path.join(directory, "tokenizer.json")):
        return HuggingFaceTokenizer.from_huggingface(directory)
    if all(os.path.isfile(os.path.join(directory, name)) for name in ("source.spm", "target.spm", "vocab.json")):
        return MarianTokenizer.from_huggingface(directory)
    if all(os.path.isfile(os.path.join(directory, name)) for name in ("vocab.json", "merges.txt")):
        return BytePairTokenizer.from_huggingface(directory)
    if os.path.isfile(os.path.join(directory, "vocab.txt")):
        return WordPieceTokenizer.from_huggingface(directory)
    return None


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
        json.dump({**state, "fitted_on": getattr(tokenizer, "fitted_on", None)}, file)
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
