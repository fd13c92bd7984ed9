"""The data layer's exception, defined with its siblings in `keras_tfm.errors`."""

from keras_tfm.errors import DataError

__all__ = ["DataError"]
