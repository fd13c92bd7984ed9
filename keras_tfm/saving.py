"""Loading a `.keras` file with a message that names a missing or damaged file.

`keras.saving.load_model` says "File not found" for a file that exists but is truncated, empty or not
a `.keras` archive; `load_model` here says which it is, then lets Keras load it.
"""

from __future__ import annotations

import os
import zipfile

import keras

from keras_tfm.errors import CheckpointError


def load_model(filepath, **kwargs) -> keras.Model:
    """`keras.saving.load_model(filepath, **kwargs)` after checking that `filepath` is a readable
    `.keras` archive. Any keras_tfm model saved with `model.save(path)` loads on any backend.

    Example:
    >>> keras_tfm.gpt_shakespeare_char_cpu(num_layers=1).save("shakespeare.keras")
    >>> model = keras_tfm.load_model("shakespeare.keras")  # on any backend
    """
    path = os.fspath(filepath)
    if not os.path.exists(path):
        raise CheckpointError(f"there is no file {path!r}.", caller="load_model")
    if path.endswith(".keras"):
        try:
            with zipfile.ZipFile(path) as archive:
                damaged = archive.testzip()
                names = set(archive.namelist())
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            raise CheckpointError(f"{path!r} is damaged or not a .keras file ({error}).", caller="load_model") from None
        missing = {"config.json", "model.weights.h5"} - names
        if damaged is not None or missing:
            problem = f"its member {damaged!r} is damaged" if damaged else f"it lacks {sorted(missing)}"
            raise CheckpointError(f"{path!r} is not a complete .keras file: {problem}.", caller="load_model")
    return keras.saving.load_model(path, **kwargs)


def load(checkpoint: str, dtype: str | None = None) -> keras.Model:
    """The model of a `.keras` file (in its own dtype), a `.gguf` file or a Hugging Face checkpoint
    directory or Hub id (both built in `dtype`, as `from_huggingface` takes it: None follows the global
    dtype policy): what the command line and the server load.

    Example: `lm = keras_tfm.load("HuggingFaceTB/SmolLM2-135M-Instruct")`.
    """
    from keras_tfm.convert import from_gguf, from_huggingface

    path = os.fspath(checkpoint)
    if path.endswith(".keras"):
        return load_model(path)
    if path.endswith(".gguf"):
        return from_gguf(path, dtype=dtype)
    return from_huggingface(path, dtype=dtype)
