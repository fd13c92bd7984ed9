"""Generation shared by the GPT and the translator: samplers and the cached decoding loop."""

from keras_tfm.generation.sampling import Sampler

__all__ = ["Sampler"]
