"""keras_tfm: transformers for Keras 3 that run unchanged on TensorFlow, JAX and PyTorch."""

from keras_tfm import layers

__version__ = "0.1.0"
