"""Hugging Face checkpoints, GGUF files and keras-hub models -> keras_tfm models, and keras_tfm models -> Hugging Face checkpoints. Models do not know about this package."""

from keras_tfm.convert.adapters import save_peft_adapter
from keras_tfm.convert.gguf import from_gguf
from keras_tfm.convert.huggingface import checkpoint_directory, from_huggingface, save_huggingface
from keras_tfm.convert.keras_hub import from_keras_hub
from keras_tfm.convert.vit import image_preprocessing

__all__ = [
    "checkpoint_directory",
    "from_gguf",
    "from_huggingface",
    "from_keras_hub",
    "image_preprocessing",
    "save_huggingface",
    "save_peft_adapter",
]
