"""Generation shared by the decoders and the translator: the settings, the token chooser and the
incremental text decoder."""

from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.sampling import Sampler
from keras_tfm.generation.text import TextDecoder

__all__ = ["GenerationConfig", "Sampler", "TextDecoder"]
