"""Tokenizers: learned here on a run's text (`learned`), a checkpoint's own (`checkpoint`), and on disk
(`storage`); every one meets the `Tokenizer` protocol (`base`), and each kind registers itself
there, so that a saved file of any kind loads."""

from keras_tfm.data.tokenizers.base import TOKENIZERS, Tokenizer, tokenizer_from_state, tokenizer_state
from keras_tfm.data.tokenizers.checkpoint import HuggingFaceTokenizer, MarianTokenizer, checkpoint_tokenizer
from keras_tfm.data.tokenizers.learned import (
    WORDPIECE_RESERVED,
    BytePairTokenizer,
    CharacterTokenizer,
    SentencePieceTokenizer,
    TranslationTokenizer,
    WordPieceTokenizer,
)
from keras_tfm.data.tokenizers.siglip import SiglipTokenizer
from keras_tfm.data.tokenizers.storage import load_or_fit_tokenizer, load_tokenizer, save_tokenizer
