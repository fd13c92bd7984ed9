"""Data for the recipes: datasets (TFDS, local files, offline defaults) and tokenizers (keras-hub)."""

from keras_tfm.data.augmentation import augment, augmentation_layers, flip_averaged_probabilities
from keras_tfm.data.batches import EpochBatches
from keras_tfm.data.errors import DataError
from keras_tfm.data.image_folder import ImageFolder
from keras_tfm.data.image_processing import ImageProcessor
from keras_tfm.data.images import ImageSplits, load_images, read_idx
from keras_tfm.data.parallel import ParallelSplits, load_parallel
from keras_tfm.data.processed_images import ProcessedImages
from keras_tfm.data.shapes import Shapes, make_shapes, shape_splits
from keras_tfm.data.shards import TokenShards, prepare_token_shards
from keras_tfm.data.text import TextSplits, load_labelled_text, load_text, offline_text, read_text
from keras_tfm.data.tokenizers import (
    BytePairTokenizer,
    CharacterTokenizer,
    HuggingFaceTokenizer,
    MarianTokenizer,
    SentencePieceTokenizer,
    SiglipTokenizer,
    TranslationTokenizer,
    WordPieceTokenizer,
    checkpoint_tokenizer,
    load_or_fit_tokenizer,
    load_tokenizer,
    save_tokenizer,
)
from keras_tfm.data.windows import TokenWindows
