"""Parallel text (sentence pairs) for translation recipes: local files, a TFDS dataset, or the offline default.

Local files (`data`) may be
  - a tab-separated file of pairs, one per line (`source<TAB>target[<TAB>...]`, e.g. the Anki English-Spanish spa.txt;
    `swap` reads target first); split 90/5/5 into train/validation/test after a seeded shuffle;
  - a directory of line-aligned files `{split}.{language}[.gz]` (the Multi30k layout:
    `train.de.gz`, `val.de.gz`, `test_2016_flickr.de.gz`, ...), with `source_language`/`target_language`.
The offline default is generated, not downloaded: English number words to digits
("three hundred and twelve" -> "3 1 2"), announced as such.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
from collections.abc import Callable

import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.data.tfds import load_tfds

OFFLINE_PARALLEL_SOURCE = "the offline default: generated English number words -> digits (no download)"
Pairs = list[tuple[str, str]]


@dataclasses.dataclass
class ParallelSplits:
    train: Pairs
    validation: Pairs
    test: Pairs
    source: str


def _read_lines(path: str) -> list[str]:
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as file:
            return [line.rstrip("\n") for line in file]
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise DataError(f"{path!r} is corrupt or not UTF-8 text ({error}).", argument="data") from None


def _split_file(directory: str, split_names: tuple[str, ...], language: str) -> str | None:
    """`{split}.{language}[.gz]`, or `{split}.<anything>.{language}[.gz]` (Multi30k's `train.lc.norm.tok.de`)."""
    names = sorted(os.listdir(directory))
    for split in split_names:
        for suffix in ("", ".gz"):
            if f"{split}.{language}{suffix}" in names:
                return os.path.join(directory, f"{split}.{language}{suffix}")
            for name in names:
                if name.startswith(split + ".") and name.endswith(f".{language}{suffix}"):
                    return os.path.join(directory, name)
    return None


def _load_directory(path: str, source_language: str, target_language: str) -> tuple[Pairs, Pairs, Pairs]:
    splits = []
    for names in (("train",), ("val", "valid", "validation", "dev"), ("test_2016_flickr", "test")):
        files = [_split_file(path, names, language) for language in (source_language, target_language)]
        if None in files:
            missing = f"{names[0]}.{source_language if files[0] is None else target_language}[.gz]"
            raise DataError(
                f"the directory {path!r} has no {missing}; expected line-aligned files "
                f"{{train,val,test}}.{{{source_language},{target_language}}}[.gz].",
                argument="data",
            )
        source, target = (_read_lines(f) for f in files)
        if len(source) != len(target):
            raise DataError(
                f"{files[0]!r} has {len(source)} lines but {files[1]!r} has {len(target)}; "
                "parallel files must be line-aligned.",
                argument="data",
            )
        splits.append([(s, t) for s, t in zip(source, target) if s.strip() and t.strip()])
    return splits[0], splits[1], splits[2]


def _split_pairs(pairs: Pairs, seed: int = 0) -> tuple[Pairs, Pairs, Pairs]:
    order = np.random.default_rng(seed).permutation(len(pairs))
    shuffled = [pairs[i] for i in order]
    a, b = int(0.9 * len(pairs)), int(0.95 * len(pairs))
    return shuffled[:a], shuffled[a:b], shuffled[b:]


_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split()
)
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    """English words for 0 <= n < 1,000,000 ("one thousand two hundred and five")."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " and " + number_words(n % 100))
    return number_words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + number_words(n % 1000))


def offline_pairs(count: int = 20000, seed: int = 0) -> Pairs:
    numbers = np.random.default_rng(seed).choice(1_000_000, size=count, replace=False)
    return [(number_words(int(n)), " ".join(str(n))) for n in numbers]


def load_parallel(
    data: str | None = None,
    dataset: str | None = None,
    data_dir: str | None = None,
    source_language: str = "de",
    target_language: str = "en",
    swap: bool = False,
    log: Callable[[str], None] = print,
) -> ParallelSplits:
    if data and dataset:
        raise DataError("pass either `data` (a path) or `dataset` (a name), not both.")
    if data:
        if os.path.isdir(data):
            train, validation, test = _load_directory(data, source_language, target_language)
        elif os.path.isfile(data):
            pairs = []
            for number, line in enumerate(_read_lines(data), 1):
                if not line.strip():
                    continue
                fields = line.split("\t")
                if len(fields) < 2:
                    raise DataError(
                        f"line {number} of {data!r} has no tab; expected source<TAB>target.", argument="data"
                    )
                pairs.append((fields[1], fields[0]) if swap else (fields[0], fields[1]))
            train, validation, test = _split_pairs(pairs)
        else:
            raise DataError(
                f"expected a tab-separated file or a directory of parallel files; nothing is at {data!r}.",
                argument="data",
            )
        source = f"local parallel text {data!r}"
    elif dataset:
        instead = "`data` (a tab-separated file or a directory of line-aligned files)"
        splits = []
        for split in ("train", "validation", "test"):
            rows = load_tfds(dataset, split, data_dir, instead=instead)
            splits.append(
                [(row[source_language].decode("utf-8"), row[target_language].decode("utf-8")) for row in rows]
            )
        train, validation, test = splits
        source = f"tensorflow-datasets {dataset!r}"
    else:
        train, validation, test = _split_pairs(offline_pairs())
        source = OFFLINE_PARALLEL_SOURCE
    log(f"Data: {source}: {len(train):,} training, {len(validation):,} validation and {len(test):,} test pairs.")
    return ParallelSplits(train, validation, test, source)
