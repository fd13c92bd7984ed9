"""SigLIP's own tokenizer: a SentencePiece model (`spiece.model`) over text canonicalized as big_vision does
(lower case, punctuation removed, spaces collapsed), each text ended with `</s>`. SigLIP 2's checkpoints carry
Gemma's `tokenizer.json` instead, which `HuggingFaceTokenizer` reads."""

from __future__ import annotations

import base64
import json
import os
import re
import string

import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.data.tokenizers.base import Tokenizer, checkpoint_files

_PUNCTUATION = str.maketrans("", "", string.punctuation)


class SiglipTokenizer(Tokenizer):
    """The ids transformers' `SiglipTokenizer` gives (tested), without transformers.

    Args:
        model: the SentencePiece model (bytes, or base64 text).
        lowercase: lower-case texts first (`do_lower_case`, the checkpoints' default).
        eos_token, unk_token: the checkpoint's end and unknown pieces.

    Example: `SiglipTokenizer.from_huggingface("google/siglip-base-patch16-224")` (a directory or Hub id);
    `from_huggingface` attaches it to the model, whose `embed_texts` and `zero_shot_classify` then take text.
    """

    kind = "siglip"

    def __init__(self, model: bytes | str, lowercase: bool = True, eos_token: str = "</s>", unk_token: str = "<unk>"):
        import sentencepiece

        self.model = base64.b64decode(model) if isinstance(model, str) else bytes(model)
        self.lowercase, self.eos_token, self.unk_token = lowercase, eos_token, unk_token
        self._processor = sentencepiece.SentencePieceProcessor(model_proto=self.model)
        self.eos_id = self._processor.piece_to_id(eos_token)

    @classmethod
    def from_huggingface(cls, directory: str) -> SiglipTokenizer:
        """The `spiece.model` and `tokenizer_config.json` of a SigLIP checkpoint directory (or Hub model id)."""
        directory = checkpoint_files(directory)
        config_path = os.path.join(directory, "tokenizer_config.json")
        try:
            with open(os.path.join(directory, "spiece.model"), "rb") as file:
                model = file.read()
            config = json.load(open(config_path, encoding="utf-8")) if os.path.isfile(config_path) else {}
        except (OSError, ValueError) as error:
            raise DataError(
                f"cannot read the SigLIP tokenizer in {directory!r} ({error}).", "from_huggingface"
            ) from None
        tokens = {key: config[key] for key in ("eos_token", "unk_token") if isinstance(config.get(key), str)}
        return cls(model, lowercase=config.get("do_lower_case", True), **tokens)

    @property
    def vocabulary_size(self) -> int:
        return self._processor.get_piece_size()

    def canonical(self, text: str) -> str:
        """`text` as the model was trained on it: lower case, no punctuation, single spaces."""
        text = text.lower() if self.lowercase else text
        return re.sub(r"\s+", " ", text.translate(_PUNCTUATION)).strip()

    def encode(self, text: str) -> np.ndarray:
        """The ids of the canonical text, without `</s>`."""
        return np.asarray(self._processor.encode(self.canonical(text)), "int32")

    def encode_batch(self, texts: list[str], max_length: int | None = None) -> list[np.ndarray]:
        """Each text's ids ending with `</s>`, cut to `max_length` ids as transformers' `truncation=True` cuts
        them (the end kept)."""
        keep = None if max_length is None else max_length - 1
        return [np.asarray([*self.encode(text)[:keep].tolist(), self.eos_id], "int32") for text in texts]

    def decode(self, ids) -> str:
        pieces = [int(i) for i in np.asarray(ids).reshape(-1) if int(i) != self.eos_id]
        return self._processor.decode(pieces)

    def save_huggingface(self, directory: str) -> None:
        """Writes `spiece.model` and `tokenizer_config.json`, which transformers reads as its `SiglipTokenizer`."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "spiece.model"), "wb") as file:
            file.write(self.model)
        config = {"tokenizer_class": "SiglipTokenizer", "do_lower_case": self.lowercase, "eos_token": self.eos_token,
                  "pad_token": self.eos_token, "unk_token": self.unk_token, "model_max_length": 64}  # fmt: skip
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as file:
            json.dump(config, file, indent=2)

    def save(self, path: str) -> None:
        state = {"kind": self.kind, "model": base64.b64encode(self.model).decode("ascii"), "lowercase": self.lowercase,
                 "eos_token": self.eos_token, "unk_token": self.unk_token}  # fmt: skip
        with open(path, "w", encoding="utf-8") as file:
            json.dump(state, file)


def is_siglip_checkpoint(directory: str) -> bool:
    """Whether a checkpoint directory holds SigLIP's SentencePiece tokenizer (`spiece.model` and the class
    `SiglipTokenizer` in its `tokenizer_config.json`)."""
    config_path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(os.path.join(directory, "spiece.model")) or not os.path.isfile(config_path):
        return False
    try:
        with open(config_path, encoding="utf-8") as file:
            return json.load(file).get("tokenizer_class") == "SiglipTokenizer"
    except (OSError, ValueError):
        return False
