"""Token shards on disk: a corpus tokenized once into files of ids (as nanoGPT's `train.bin`), read as
each batch needs them, so that training on more text than memory holds costs the memory of its batches only.

    directory/
        train-00000.bin, train-00001.bin, ...     token ids, uint16 (or uint32 for vocabularies > 65,536)
        validation-00000.bin, ...
        meta.json                                 the tokenizer, the dtype, each shard's length; written
                                                  last, so a directory without it was never finished

The split is the in-memory one (`load_text`): the first 90% of the text's characters train, the rest
validates, and the ids are the tokenizer's on each piece of at most `chunk_characters` characters, cut
at line ends (for characters, the ids of the whole text).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterator

import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.data.tokenizers import tokenizer_from_state, tokenizer_state

SPLITS = ("train", "validation")


def _open_text(path: str, argument: str) -> io.TextIOBase:
    if not os.path.isfile(path):
        raise DataError(f"expected a UTF-8 text file (.txt or .txt.gz); nothing is at {path!r}.", argument)
    raw = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")  # noqa: SIM115
    return io.TextIOWrapper(raw, encoding="utf-8", newline="")


def _pieces(path: str, argument: str, chunk_characters: int) -> Iterator[str]:
    """The text of `path` in pieces of about `chunk_characters`, each ending at a line end."""
    try:
        with _open_text(path, argument) as file:
            lines, size = [], 0
            for line in file:
                lines.append(line)
                size += len(line)
                if size >= chunk_characters:
                    yield "".join(lines)
                    lines, size = [], 0
            if lines:
                yield "".join(lines)
    except UnicodeDecodeError as error:
        raise DataError(f"{path!r} is not UTF-8 text ({error.reason}); is it the right file?", argument) from None
    except (OSError, EOFError) as error:
        raise DataError(f"{path!r} is corrupt or unreadable ({error}).", argument) from None


def text_sample(path: str, characters: int = 1 << 26, argument: str = "data") -> str:
    """The first `characters` of the training part of `path`: what a tokenizer is fitted on."""
    total = sum(len(piece) for piece in _pieces(path, argument, 1 << 24))
    cut = int(total * 0.9)
    sample, size = [], 0
    for piece in _pieces(path, argument, 1 << 24):
        sample.append(piece[: min(cut, characters) - size])
        size += len(sample[-1])
        if size >= min(cut, characters):
            break
    return "".join(sample)


def tokenizer_digest(tokenizer) -> str:
    state = {key: value for key, value in tokenizer_state(tokenizer).items() if key != "fitted_on"}
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]


def prepare_token_shards(
    path: str,
    tokenizer,
    directory: str,
    validation_fraction: float = 0.1,
    chunk_characters: int = 1 << 24,
    shard_tokens: int = 1 << 28,
    log: Callable[[str], None] = print,
) -> str:
    """Tokenizes the text file `path` into token shards in `directory` (see the module); returns it.

    Args:
        path: a UTF-8 text file, `.txt` or `.txt.gz`, of any size (read twice, a piece at a time).
        tokenizer: a keras_tfm tokenizer (`encode(text) -> ids`), recorded in `meta.json`.
        directory: where the shards go; one already prepared with this tokenizer is kept as it is.
        validation_fraction: the last part of the characters that validates.
        chunk_characters: characters tokenized at once (memory: a few bytes for each).
        shard_tokens: tokens per shard file.

    Example:
    >>> import os, tempfile
    >>> from keras_tfm.data import CharacterTokenizer, TokenShards, prepare_token_shards
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "text.txt"), "w") as file:
    ...     _ = file.write("to be or not to be\\n" * 10)
    >>> tokenizer = CharacterTokenizer.fit("to be or not\\n")
    >>> shards = prepare_token_shards(os.path.join(folder, "text.txt"), tokenizer, os.path.join(folder, "shards"), log=None)
    >>> train = TokenShards(shards, "train")
    >>> len(train), tokenizer.decode(train[0:5])
    (171, 'to be')
    """
    log = log or (lambda message: None)
    digest = tokenizer_digest(tokenizer)
    source = source_record(path, "data")
    if os.path.exists(os.path.join(directory, "meta.json")):
        check_source(read_meta(directory, digest), directory, source)  # refuses another tokenizer's or text's
        return directory
    total = sum(len(piece) for piece in _pieces(path, "data", chunk_characters))
    if not total:
        raise DataError(f"{path!r} is empty; expected text to train on.", "data")
    os.makedirs(directory, exist_ok=True)
    dtype = np.dtype("uint16" if tokenizer.vocabulary_size <= 1 << 16 else "uint32")
    cut = int(total * (1 - validation_fraction))
    position = 0
    with _ShardWriter(directory, dtype, shard_tokens) as writer:
        for piece in _pieces(path, "data", chunk_characters):
            head = piece[: max(0, cut - position)]
            for split, text in (("train", head), ("validation", piece[len(head) :])):
                if text:
                    writer.write(split, np.asarray(tokenizer.encode(text)).reshape(-1))
            position += len(piece)
            log(f"Token shards: {position:,} of {total:,} characters tokenized.")
    writer.refuse_empty(path)
    meta = {
        "format": 1,
        "source": os.path.abspath(path),
        "source_record": source,
        "validation_fraction": validation_fraction,
        "dtype": dtype.name,
        "vocabulary_size": tokenizer.vocabulary_size,
        "tokenizer_digest": digest,
        "tokenizer": json.loads(json.dumps(tokenizer_state(tokenizer))),
        "splits": writer.shards,
    }
    temporary = os.path.join(directory, "meta.json.tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(meta, file)
    os.replace(temporary, os.path.join(directory, "meta.json"))
    log(
        f"Token shards: {writer.count('train'):,} training and {writer.count('validation'):,} validation tokens "
        f"in {directory}."
    )
    return directory


class _ShardWriter:
    """Ids appended to each split's shard files, a new file every `shard_tokens` tokens."""

    def __init__(self, directory: str, dtype: np.dtype, shard_tokens: int):
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.shards = {split: [] for split in SPLITS}  # what meta.json records of each file
        self.files = {}

    def write(self, split: str, ids: np.ndarray) -> None:
        shards = self.shards[split]
        while len(ids):
            if split not in self.files or shards[-1]["tokens"] >= self.shard_tokens:
                if split in self.files:
                    self.files[split].close()
                name = f"{split}-{len(shards):05d}.bin"
                self.files[split] = open(os.path.join(self.directory, name), "wb")  # noqa: SIM115
                shards.append({"file": name, "tokens": 0})
            room = self.shard_tokens - shards[-1]["tokens"]
            ids[:room].astype(self.dtype).tofile(self.files[split])
            shards[-1]["tokens"] += len(ids[:room])
            ids = ids[room:]

    def count(self, split: str) -> int:
        return sum(shard["tokens"] for shard in self.shards[split])

    def refuse_empty(self, path: str) -> None:
        """Refuses a text that left a split without tokens, removing what was written of it."""
        if all(self.count(split) for split in SPLITS):
            return
        for split in SPLITS:  # nothing of a refused text stays behind to be taken for prepared shards
            for shard in self.shards[split]:
                os.remove(os.path.join(self.directory, shard["file"]))
        counts = ", ".join(f"{self.count(split):,} {split}" for split in SPLITS)
        raise DataError(
            f"{path!r} gives no tokens to {'train' if not self.count('train') else 'validate'} on ({counts} tokens); "
            "expected more text.",
            "data",
        )

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        for file in self.files.values():
            file.close()


def source_record(path: str, argument: str = "data") -> dict:
    """What identifies a text file: its size, modification time and a digest of its first and last
    mebibyte (cheap for a corpus of any size)."""
    if not os.path.isfile(path):
        raise DataError(f"expected a UTF-8 text file (.txt or .txt.gz); nothing is at {path!r}.", argument)
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        digest.update(file.read(1 << 20))
        file.seek(max(0, size - (1 << 20)))
        digest.update(file.read(1 << 20))
    return {
        "path": os.path.abspath(path),
        "size": size,
        "modified": os.path.getmtime(path),
        "sample_sha256": digest.hexdigest(),
    }


def check_source(meta: dict, directory: str, source: dict) -> None:
    """Refuses shards made from another text than `source` (`source_record` of the text now given)."""
    made_from = meta.get("source_record")
    if made_from is None:
        return  # shards of an earlier format record the path only
    differences = [key for key in ("path", "size", "sample_sha256") if made_from.get(key) != source[key]]
    if made_from.get("modified") != source["modified"] and not differences:
        differences.append("modified")
    if differences:
        raise DataError(
            f"the shards in {directory!r} were made from {made_from['path']!r} ({made_from['size']:,} bytes), not "
            f"from {source['path']!r} ({source['size']:,} bytes){' as it is now' if source['path'] == made_from['path'] else ''}"
            f" (they differ in {', '.join(differences)}). Delete {directory!r} to prepare it again from this text, "
            "or give another directory.",
            "token_shards",
        )


def read_meta(directory: str, tokenizer_digest_expected: str | None = None) -> dict:
    """`directory/meta.json`; with `tokenizer_digest_expected`, shards of another tokenizer are refused."""
    path = os.path.join(directory, "meta.json")
    try:
        with open(path, encoding="utf-8") as file:
            meta = json.load(file)
        meta["splits"]["train"], meta["tokenizer_digest"]  # noqa: B018
    except FileNotFoundError:
        raise DataError(
            f"{directory!r} holds no prepared token shards (no meta.json); prepare them from `data` first.",
            "token_shards",
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(
            f"{path!r} is damaged ({error}); delete {directory!r} and prepare again.", "token_shards"
        ) from None
    if tokenizer_digest_expected is not None and meta["tokenizer_digest"] != tokenizer_digest_expected:
        raise DataError(
            f"the shards in {directory!r} were made by another tokenizer ({meta['tokenizer'].get('kind')}, "
            f"{meta['vocabulary_size']} tokens) than this run's; their ids would mean other tokens. Give the "
            "directory prepared with this tokenizer, or a new one to prepare.",
            "token_shards",
        )
    return meta


def shards_tokenizer(meta: dict):
    """The tokenizer the shards were made with, from their `meta.json`."""
    return tokenizer_from_state(meta["tokenizer"])


class TokenShards:
    """One split of prepared token shards as one long sequence of ids: `len(shards)` ids, `shards[a:b]` the
    ids from `a` to `b` (int32), read from disk across shard boundaries as each batch asks for them.

    Reads, not a memory map: pages of a mapped file count towards the process's memory, and random windows
    touch so many of them (the kernel maps whole read-ahead blocks, even huge pages) that a run's memory
    grew with the corpus."""

    def __init__(self, directory: str, split: str = "train"):
        meta = read_meta(directory)
        if split not in SPLITS:
            raise DataError(f"expected one of {', '.join(SPLITS)}; got {split!r}.", "split")
        self.directory, self.split = directory, split
        self.dtype = np.dtype(meta["dtype"])
        self.paths, lengths = [], []
        for shard in meta["splits"][split]:
            path = os.path.join(directory, shard["file"])
            expected = shard["tokens"] * self.dtype.itemsize
            if not os.path.isfile(path) or os.path.getsize(path) != expected:
                raise DataError(
                    f"{path!r} is missing or not {expected:,} bytes long; delete {directory!r} and prepare again.",
                    "token_shards",
                )
            if shard["tokens"]:
                self.paths.append(path)
                lengths.append(shard["tokens"])
        self.starts = np.cumsum([0, *lengths])
        self.vocabulary_size = int(meta["vocabulary_size"])
        self._files = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _read(self, number: int, start: int, stop: int) -> np.ndarray:
        if number not in self._files:
            self._files[number] = os.open(self.paths[number], os.O_RDONLY)
        size = self.dtype.itemsize
        data = os.pread(self._files[number], (stop - start) * size, start * size)
        ids = np.frombuffer(data, dtype=self.dtype)
        if ids.size and ids.max() >= self.vocabulary_size:  # a damaged shard: its ids would index past the table
            at = start + int(np.argmax(ids >= self.vocabulary_size))
            raise DataError(
                f"{self.paths[number]!r} holds id {int(ids.max())} at token {at:,}, outside the vocabulary of "
                f"{self.vocabulary_size} its meta.json records: the shard is damaged. Delete "
                f"{self.directory!r} and prepare it again.",
                "token_shards",
            )
        return ids

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError(f"TokenShards takes a slice with step 1; got {index!r}.")
        start, stop, _ = index.indices(len(self))
        pieces = []
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        for number in range(max(first, 0), len(self.paths)):
            offset = int(self.starts[number])
            if offset >= stop:
                break
            end = int(self.starts[number + 1])
            pieces.append(self._read(number, max(start, offset) - offset, min(stop, end) - offset))
        return np.concatenate(pieces).astype("int32") if pieces else np.zeros((0,), "int32")

    def __del__(self):
        for descriptor in getattr(self, "_files", {}).values():
            os.close(descriptor)

    def __getstate__(self):  # open descriptors stay with their process
        return {**self.__dict__, "_files": {}}
