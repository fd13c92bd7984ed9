"""Tokenizers: learned here on a run's text (`learned`), a checkpoint's own (`checkpoint`), and on disk
(`storage`); every one meets the `Tokenizer` protocol (`base`)."""

from keras_tfm.data.tokenizers.base import Tokenizer
from keras_tfm.data.tokenizers.checkpoint import HuggingFaceTokenizer, MarianTokenizer, checkpoint_tokenizer
from keras_tfm.data.tokenizers.learned import (
    WORDPIECE_RESERVED,
    BytePairTokenizer,
    CharacterTokenizer,
    SentencePieceTokenizer,
    TranslationTokenizer,
    WordPieceTokenizer,
)
from keras_tfm.data.tokenizers.storage import (
    TOKENIZERS,
    load_or_fit_tokenizer,
    load_tokenizer,
    save_tokenizer,
    tokenizer_from_state,
    tokenizer_state,
)
