"""Hugging Face checkpoints -> keras_tfm models. Models do not know about this package."""

from keras_tfm.convert.huggingface import from_huggingface

__all__ = ["from_huggingface"]
