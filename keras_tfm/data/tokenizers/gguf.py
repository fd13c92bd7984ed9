"""The tokenizer a GGUF file describes in its metadata (`tokenizer.ggml.*`), rebuilt with Hugging Face
`tokenizers` as transformers' GGUF loader rebuilds it: byte-level BPE ("gpt2": Llama 3, Qwen, SmolLM2)
or SentencePiece BPE with byte fallback ("llama": Llama 2, Mistral, TinyLlama)."""

from __future__ import annotations

from keras_tfm.data.tokenizers.checkpoint import HuggingFaceTokenizer
from keras_tfm.errors import CheckpointError

# How each `tokenizer.ggml.pre` splits text before its merges (the regexes of the models' own
# tokenizer.json files); others split as GPT-2 does.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types


def gguf_tokenizer(metadata: dict) -> HuggingFaceTokenizer | None:
    """The file's tokenizer with its chat template and special tokens; None where it has no vocabulary."""
    kind, tokens = metadata.get("tokenizer.ggml.model"), metadata.get("tokenizer.ggml.tokens")
    if kind is None or not tokens:
        return None
    from tokenizers import AddedToken

    if kind == "gpt2":
        tokenizer = _byte_level(metadata)
        add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
    elif kind == "llama":
        tokenizer = _sentencepiece(metadata)
        add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", True))  # llama.cpp's default for these
    else:
        raise CheckpointError(
            f"the file's tokenizer is {kind!r}; from_gguf reads 'gpt2' (byte-level BPE) and 'llama' "
            "(SentencePiece BPE) tokenizers.",
            caller="from_gguf",
        )
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocabulary = tokenizer.get_vocab()
    tokenizer.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, k in zip(tokens, types)
            if k == CONTROL and t in vocabulary
        ]
    )
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocabulary]
    )
    special = {}
    for name, key in (
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("unk", "unknown_token_id"),
        ("pad", "padding_token_id"),
    ):
        index = metadata.get(f"tokenizer.ggml.{key}")
        if index is not None and 0 <= int(index) < len(tokens):
            special[f"{name}_token"] = tokens[int(index)]
    _add_special_tokens_around(tokenizer, metadata, special, add_bos)
    return HuggingFaceTokenizer(tokenizer.to_str(), metadata.get("tokenizer.chat_template"), special)


def _byte_level(metadata: dict):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    alphabet = _bytes_to_unicode()
    letters = set(alphabet.values())
    vocabulary = {}
    for index, token in enumerate(metadata["tokenizer.ggml.tokens"]):
        spelled = token if set(token) <= letters else "".join(alphabet[b] for b in token.encode("utf-8"))
        vocabulary.setdefault(spelled, index)
    merges = [tuple(merge.split(" ", 1)) for merge in metadata.get("tokenizer.ggml.merges") or ()]
    if not merges:  # llama.cpp refuses it too: without merges every byte would be a token of its own
        raise CheckpointError(
            "the file's byte-level BPE tokenizer ('gpt2') has no merges (tokenizer.ggml.merges): it is damaged.",
            "path",
            caller="from_gguf",
        )
    tokenizer = Tokenizer(models.BPE(vocabulary, merges, fuse_unk=False))
    split = SPLITS.get(metadata.get("tokenizer.ggml.pre"))
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece(metadata: dict):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens = metadata["tokenizer.ggml.tokens"]
    vocabulary = {token: index for index, token in enumerate(tokens)}
    if metadata.get("tokenizer.ggml.merges"):
        merges = [tuple(merge.split(" ", 1)) for merge in metadata["tokenizer.ggml.merges"]]
    else:
        merges = _merges_from_scores(vocabulary, dict(zip(tokens, metadata.get("tokenizer.ggml.scores") or [])))
    unknown = metadata.get("tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(
        models.BPE(
            vocabulary,
            merges,
            unk_token=tokens[int(unknown)] if unknown is not None else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tokenizer


def _merges_from_scores(vocabulary: dict, scores: dict) -> list[tuple[str, str]]:
    """SentencePiece files list pieces with scores, not merges: each piece that two others make is a merge,
    ranked by the piece's score (transformers' `generate_merges`)."""
    merges = []
    for piece, score in scores.items():
        pairs = [
            (piece[:i], piece[i:], score) for i in range(1, len(piece)) if {piece[:i], piece[i:]} <= vocabulary.keys()
        ]
        merges += sorted(pairs, key=lambda pair: (vocabulary[pair[0]], vocabulary[pair[1]]))
    merges.sort(key=lambda merge: (merge[2], len(merge[0]), len(merge[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _add_special_tokens_around(tokenizer, metadata: dict, special: dict, add_bos: bool) -> None:
    """What `add_special_tokens=True` adds: the begin token where the file asks for it (and the end token)."""
    from tokenizers import processors

    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    ends = [(special.get("bos_token"), add_bos), (special.get("eos_token"), add_eos)]
    bos, eos = (token if wanted and token else None for token, wanted in ends)
    if bos is None and eos is None:
        return
    single = " ".join(filter(None, [bos and f"{bos}:0", "$A:0", eos and f"{eos}:0"]))
    pair = " ".join(filter(None, [single, bos and f"{bos}:1", "$B:1", eos and f"{eos}:1"]))
    ids = [(token, tokenizer.token_to_id(token)) for token in (bos, eos) if token]
    tokenizer.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=ids)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte, which byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    letters, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            letters.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, letters)))
