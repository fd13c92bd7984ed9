"""Where `save_huggingface` writes: a directory that holds a checkpoint alone, replaced only when asked and
only when complete (the new files are written beside it first), never a user's other files."""

from __future__ import annotations

import os
import re
import shutil

from keras_tfm.errors import InputError

# what a checkpoint's tokenizer and image processor read, beside its config and weights
PROCESSOR_FILES = re.compile(
    r"(tokenizer.*\.json|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|"
    r"merges\.txt|.*\.spm|.*\.model|preprocessor_config\.json|generation_config\.json)"
)

# what a Hugging Face checkpoint directory holds: what `overwrite=True` may replace, and nothing else
_CHECKPOINT_FILES = re.compile(
    r"config\.json|.*\.safetensors|model\.safetensors\.index\.json|pytorch_model.*\.bin(\.index\.json)?|"
    r"adapter_config\.json|modules\.json|sentence_bert_config\.json|config_sentence_transformers\.json|"
    + PROCESSOR_FILES.pattern
)
_CHECKPOINT_FOLDERS = re.compile(r"\d+_(Pooling|Dense|Normalize)")  # sentence-transformers' modules


def check_destination(directory, overwrite: bool) -> None:
    """Refuses a file, a directory with files in it unless `overwrite`, and one that holds anything but a
    checkpoint's files even then."""
    if not isinstance(overwrite, bool):
        raise InputError(f"expected True or False; received {overwrite!r}.", "overwrite", caller="save_huggingface")
    path = os.fspath(directory)
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(
            f"{path!r} is a file; expected a directory to write the checkpoint in.",
            "directory",
            caller="save_huggingface",
        )
    held = sorted(os.listdir(path)) if os.path.isdir(path) else []
    foreign = [name for name in held if not _checkpoints_own(path, name)]
    if foreign and overwrite:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise InputError(
            f"{path!r} holds what is not a checkpoint's ({shown}); `overwrite=True` replaces a checkpoint's "
            "own files only. Give a directory that holds a checkpoint alone, or a new one.",
            "directory",
            caller="save_huggingface",
        )
    if held and not overwrite:
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise InputError(
            f"{path!r} already holds files ({shown}): another checkpoint's tokenizer or "
            "weights would be left beside this one. Give `overwrite=True` to replace the checkpoint there, or "
            "another directory.",
            "directory",
            caller="save_huggingface",
        )


def _checkpoints_own(path: str, name: str) -> bool:
    if os.path.isdir(os.path.join(path, name)):
        return bool(_CHECKPOINT_FOLDERS.fullmatch(name)) and set(os.listdir(os.path.join(path, name))) <= {
            "config.json",
            "model.safetensors",
        }
    return bool(_CHECKPOINT_FILES.fullmatch(name))


def swap_in(staging: str, directory: str) -> None:
    """Puts the complete checkpoint in `staging` where `directory` is: renamed whole where there is none,
    else its old checkpoint files removed and the new ones moved in (the directory itself stays)."""
    directory = os.path.abspath(os.fspath(directory))
    if not os.path.exists(directory):
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        os.rename(staging, directory)
        return
    written = set(os.listdir(staging))
    for name in os.listdir(directory):  # only checkpoint files: check_destination refused anything else
        old = os.path.join(directory, name)
        if os.path.isdir(old):  # a module's folder: replaced whole
            shutil.rmtree(old)
        elif name not in written:
            os.remove(old)
    for name in written:
        os.replace(os.path.join(staging, name), os.path.join(directory, name))
