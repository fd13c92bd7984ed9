"""BLEU for translations, two ways (sacreBLEU computes both):

- sacreBLEU's standard score: detokenized, cased output against the raw references (signature printed).
- the score most Multi30k papers report: lowercased, Moses-tokenized output against references made by
  the same pipeline (Multi30k's `task1/tok/*.lc.norm.tok.*`: `lowercase.perl | normalize-punctuation.perl
  | tokenizer.perl`), with no further tokenization inside BLEU. sacremoses reimplements those scripts.
"""

from __future__ import annotations

import re

from keras_tfm.errors import InputError

# WordPiece splits at every punctuation mark: "man's" comes back as "man ' s"; Moses writes "man 's".
_SPLIT_CLITIC = re.compile(r"(?<=\w) ' (s|re|ve|ll|d|m|t)\b", re.IGNORECASE)


def detokenize(lines: list[str], language: str) -> list[str]:
    """Space-separated tokens (as WordPiece decoding leaves them) -> text ("a dog ." -> "a dog.")."""
    from sacremoses import MosesDetokenizer

    detokenizer = MosesDetokenizer(lang=language)
    return [detokenizer.detokenize(_SPLIT_CLITIC.sub(r" '\1", line).split()) for line in lines]


def moses_lowercase_tokenize(lines: list[str], language: str) -> list[str]:
    """Text -> lowercased, punctuation-normalized, Moses-tokenized text, as Multi30k's `tok` files."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=language), MosesTokenizer(lang=language)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True, escape=True) for line in lines]


def bleu_scores(
    hypotheses: list[str], references: list[str], language: str, tokenized_references: list[str] | None = None
) -> dict:
    """`hypotheses`: detokenized text. Returns sacreBLEU cased and lowercased scores and signatures, and
    with `tokenized_references` the tokenized-lowercase score."""
    import sacrebleu

    if tokenized_references is not None and len(tokenized_references) != len(hypotheses):
        raise InputError(
            f"expected {len(hypotheses)} lines (one per hypothesis), received {len(tokenized_references)}.",
            caller="tokenized_references",
        )

    def score(name: str, lines: list[str], reference_lines: list[str], **options) -> dict:
        metric = sacrebleu.metrics.BLEU(**options)
        result = metric.corpus_score(lines, [reference_lines])
        return {f"test_bleu{name}": result.score, f"bleu{name}_signature": f"{result} | {metric.get_signature()}"}

    scores = {**score("", hypotheses, references), **score("_lowercase", hypotheses, references, lowercase=True)}
    if tokenized_references is not None:
        scores.update(
            score(
                "_tokenized_lowercase",
                moses_lowercase_tokenize(hypotheses, language),
                tokenized_references,
                tokenize="none",
            )
        )
    return scores
