"""Tokenizers learned here, on a run's training text: characters (nanoGPT's), WordPiece (BERT's) and
byte-pair (GPT-2's byte-level BPE) on Hugging Face `tokenizers`, and SentencePiece on `sentencepiece`;
the first three also read and write a Hugging Face checkpoint's files. `TranslationTokenizer` pairs two
of them for a translator. None needs TensorFlow."""

from __future__ import annotations

import base64
import json
import os

import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.data.tokenizers.base import (
    Tokenizer,
    checkpoint_files,
    pair_windows,
    single_windows,
    tokenizer_from_state,
    tokenizer_state,
)

WORDPIECE_RESERVED = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[START]", "[END]"]


class _LineTokenizer(Tokenizer):
    """Encoding line by line through the Hugging Face `tokenizers.Tokenizer` a subclass keeps in
    `_tokenizer` (ids only: no special tokens added around them)."""

    def encode_lines(self, lines: list[str]) -> list[np.ndarray]:
        encoded = self._tokenizer.encode_batch(list(lines), add_special_tokens=False) if lines else []
        return [np.asarray(row.ids, "int32") for row in encoded]

    def encode(self, text: str) -> np.ndarray:
        rows = self.encode_lines([line for line in text.splitlines() if line.strip()])
        return np.concatenate(rows) if rows else np.zeros((0,), "int32")

    def decode(self, ids) -> str:
        return self._tokenizer.decode([int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=False)


class CharacterTokenizer(Tokenizer):
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
        """The characters of `ids`; an id outside the vocabulary (a model's padded vocabulary is larger)
        has no text, as in Hugging Face `tokenizers`."""
        size = len(self.vocabulary)
        return "".join(self.vocabulary[i] for i in np.asarray(ids).reshape(-1).tolist() if 0 <= i < size)

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


def _bert_pipeline(tokenizer, lowercase: bool, strip_accents: bool):
    """BERT's text handling around a WordPiece model: `BertTokenizer`'s cleaning, lowercasing and
    accent stripping, its split on white space and punctuation, and `##` pieces joined when decoding."""
    from tokenizers import decoders, normalizers, pre_tokenizers

    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words and punctuation spaced apart
    return tokenizer


class WordPieceTokenizer(_LineTokenizer):
    """BERT's WordPiece (Hugging Face `tokenizers`: the ids of transformers' `BertTokenizer`), over a
    vocabulary of a checkpoint's or learned by `fit`."""

    kind = "wordpiece"

    def __init__(self, vocabulary: list[str], lowercase: bool = True, strip_accents: bool = False):
        from tokenizers import Tokenizer, models

        self.vocabulary = list(vocabulary)
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        model = models.WordPiece(
            {token: i for i, token in reversed(list(enumerate(self.vocabulary)))},  # a repeated token: its first id
            unk_token="[UNK]",
            max_input_chars_per_word=100,
        )
        self._tokenizer = _bert_pipeline(Tokenizer(model), lowercase, strip_accents)
        self._sentence_copy = None  # (max_length, a copy that adds [CLS] and [SEP] and cuts there)

    @classmethod
    def from_huggingface(cls, directory: str) -> WordPieceTokenizer:
        """The tokenizer of a Hugging Face BERT checkpoint directory (or Hub model id, as in
        `keras_tfm.convert.checkpoint_directory`): its `vocab.txt`, lowercased and with accents stripped
        as its `tokenizer_config.json` says (`do_lower_case`, `strip_accents`; BERT's defaults: both
        when lowercasing)."""
        directory = checkpoint_files(directory)
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
        """A vocabulary of at most `vocabulary_size` pieces (default 8192) learned by `tokenizers`'
        WordPiece trainer, the reserved tokens first."""
        from tokenizers import Tokenizer, models, trainers

        learner = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase, lowercase)
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocabulary_size or 8192, special_tokens=WORDPIECE_RESERVED, show_progress=False
        )
        learner.train_from_iterator((line for line in text.splitlines() if line.strip()), trainer)
        vocabulary = sorted(learner.get_vocab(), key=learner.get_vocab().get)
        return cls(vocabulary, lowercase, lowercase)

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    def token_id(self, token: str) -> int:
        return self.vocabulary.index(token)

    def encode_batch(self, texts: list[str], max_length: int | None = None) -> list[np.ndarray]:
        """Each text's ids as BERT reads a sentence, [CLS] ... [SEP], its last tokens cut to fit `max_length`."""
        return [np.asarray(encoding.ids, "int32") for encoding in self._sentences(max_length).encode_batch(texts)]

    def encode_with_offsets(self, text: str, max_length: int | None = None):
        """`tokenizers`' encoding of `text` as `encode_batch` makes it, with each token's characters
        (`offsets`) and word (`word_ids`)."""
        return self._sentences(max_length).encode(text)

    def encode_windows(self, text: str, max_length: int, stride: int) -> list:
        """`tokenizers`' encodings of [CLS] text [SEP] in windows of `max_length` tokens that share `stride`
        tokens, with each token's characters (`offsets`) and word (`word_ids`, over the whole text)."""
        from tokenizers import Tokenizer

        return single_windows(Tokenizer.from_str(self._sentences(None).to_str()), text, max_length, stride)

    def encode_pair_windows(self, first: str, second: str, max_length: int, stride: int) -> list:
        """`tokenizers`' encodings of [CLS] first [SEP] second [SEP] in windows of `max_length` tokens, the
        second text cut into overlapping pieces (`stride` tokens shared)."""
        from tokenizers import Tokenizer

        return pair_windows(Tokenizer.from_str(self._sentences(None).to_str()), first, second, max_length, stride)

    def _sentences(self, max_length: int | None):
        """A copy of the tokenizer that puts [CLS] and [SEP] around a text (and a pair's second), cut at
        `max_length` (made once per length)."""
        if self._sentence_copy is None or self._sentence_copy[0] != max_length:
            from tokenizers import Tokenizer, processors

            copy = Tokenizer.from_str(self._tokenizer.to_str())
            first, last = self.token_id("[CLS]"), self.token_id("[SEP]")
            copy.post_processor = processors.TemplateProcessing(
                single="[CLS] $A [SEP]",
                pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                special_tokens=[("[CLS]", first), ("[SEP]", last)],
            )
            if max_length is not None:
                copy.enable_truncation(max_length)
            self._sentence_copy = (max_length, copy)
        return self._sentence_copy[1]

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


class BytePairTokenizer(_LineTokenizer):
    """GPT-2's byte-level BPE (any text encodes, no unknown tokens) on Hugging Face `tokenizers`: the ids
    of transformers' `GPT2Tokenizer`. `fit` learns merges with `ByteLevelBPETokenizer`."""

    kind = "bpe"

    def __init__(self, vocabulary: dict[str, int], merges: list[str]):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        self.vocabulary, self.merges = dict(vocabulary), list(merges)
        pairs = [tuple(merge.split(" ", 1)) for merge in self.merges]
        self._tokenizer = Tokenizer(models.BPE(self.vocabulary, pairs, fuse_unk=False))
        self._tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        self._tokenizer.decoder = decoders.ByteLevel()

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
        directory = checkpoint_files(directory)
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


class SentencePieceTokenizer(Tokenizer):
    """A unigram model learned by the `sentencepiece` trainer, encoding and decoding with its processor.

    The ids keras-hub's `compute_sentence_piece_proto` reserves: 0 padding, 1 unknown, 2 start
    ([START], SentencePiece's `<s>`), 3 end ([END], `</s>`). The trainer is called directly so that
    `vocabulary_size` is a maximum, as for WordPiece, rather than a size small texts cannot reach,
    that every character of the training text keeps a piece (`character_coverage=1.0`, as
    SentencePiece advises for alphabets; its default drops the rarest, such as German „), and that
    its log stays out of the recipe's output. Characters never seen become [UNK]."""

    kind = "sentencepiece"
    SPECIAL_IDS = {"[PAD]": 0, "[UNK]": 1, "[START]": 2, "[END]": 3}

    def __init__(self, proto: bytes | str):
        import sentencepiece

        self.proto = base64.b64decode(proto) if isinstance(proto, str) else bytes(proto)
        self._processor = sentencepiece.SentencePieceProcessor(model_proto=self.proto)

    def encode_lines(self, lines: list[str]) -> list[np.ndarray]:
        return [np.asarray(row, "int32") for row in self._processor.encode(list(lines))] if lines else []

    def encode(self, text: str) -> np.ndarray:
        rows = self.encode_lines([line for line in text.splitlines() if line.strip()])
        return np.concatenate(rows) if rows else np.zeros((0,), "int32")

    def decode(self, ids) -> str:
        return self._processor.decode([int(i) for i in np.asarray(ids).reshape(-1)])

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
        return int(self._processor.get_piece_size())

    def token_id(self, token: str) -> int:
        return self.SPECIAL_IDS[token]

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"kind": self.kind, "proto": base64.b64encode(self.proto).decode("ascii")}, file)


class TranslationTokenizer(Tokenizer):
    """A translator's two tokenizers as one, so that `Translator.translate` takes and returns text: the
    source side's encodes sources, the target side's decodes translations (the translator recipe's
    WordPiece or SentencePiece per language; it attaches this to the model it trains).

    Args:
        source, target: tokenizers of `keras_tfm.data` (or their saved states, as `load_tokenizer` gives).
        pad_token_id: the padding id, left out of the decoded text.
    """

    kind = "translation"

    def __init__(self, source, target, pad_token_id: int = 0):

        self.source, self.target = (
            tokenizer_from_state(side) if isinstance(side, dict) else side for side in (source, target)
        )
        self.pad_token_id = pad_token_id

    @property
    def vocabulary_size(self) -> int:
        return self.source.vocabulary_size

    def encode(self, text: str) -> np.ndarray:
        return self.encode_source(text)

    def decode(self, ids) -> str:
        return self.decode_target(ids)

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
                    "source": tokenizer_state(self.source),
                    "target": tokenizer_state(self.target),
                    "pad_token_id": self.pad_token_id,
                },
                file,
            )
