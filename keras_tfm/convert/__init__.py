"""Hugging Face checkpoints -> keras_tfm models. Models do not know about this package."""

from keras_tfm.convert.huggingface import from_huggingface
from keras_tfm.convert.vit import image_preprocessing

__all__ = ["from_huggingface", "image_preprocessing"]
