"""Hugging Face Hub model ids as local directories: the bottom floor that both `convert` (checkpoints)
and `data` (their tokenizers) read through, so that no import runs upward."""

from __future__ import annotations

import os
import re

from keras_tfm.errors import CheckpointError

# "gpt2", "google/vit-base-patch16-224": the Hub's model ids (one optional namespace)
_HUB_MODEL_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# what the converters, tokenizers and image processors read: configs, safetensors weights, vocabularies
_HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.spm", "*.model"]


def checkpoint_directory(name_or_path, caller: str = "from_huggingface") -> str:
    """The local directory of a checkpoint: `name_or_path` itself when it is a directory; otherwise,
    for a Hugging Face Hub model id ("gpt2", "google/vit-base-patch16-224"), its snapshot in the
    local Hugging Face cache, downloaded there first where the Hub can be reached (`huggingface_hub`;
    with `HF_HUB_OFFLINE=1` only the cache is read). From the Hub it takes the configuration files,
    the tokenizer files and the safetensors weights, or `pytorch_model.bin` (`adapter_model.bin`)
    where a model (a peft adapter) has no safetensors.

    Example:
    >>> import os
    >>> os.makedirs("my-checkpoint", exist_ok=True)
    >>> checkpoint_directory("my-checkpoint")  # a Hub id gives its snapshot: .../snapshots/<commit>
    'my-checkpoint'

    """
    path = os.fspath(name_or_path)
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise CheckpointError(
            f"{path!r} is a file; expected a checkpoint directory or a Hugging Face Hub model id.", caller=caller
        )
    if not _HUB_MODEL_ID.fullmatch(path):
        raise CheckpointError(f"there is no directory {path!r} (nor is it a Hugging Face Hub model id).", caller=caller)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(
            f"there is no directory {path!r}; to read it as a Hugging Face Hub model id, install huggingface_hub.",
            caller=caller,
        ) from None
    try:
        directory = snapshot_download(path, allow_patterns=_HUB_FILES)
        if not any(name.endswith(".safetensors") for name in os.listdir(directory)):
            directory = snapshot_download(path, allow_patterns=["pytorch_model*.bin", "adapter_model.bin"])
    except Exception as error:  # huggingface_hub's errors: offline without a cached copy, unknown id, gated, ...
        raise CheckpointError(
            f"{path!r} is neither a local directory nor a Hugging Face Hub model found in the local "
            f"cache or on the Hub ({type(error).__name__}: {error})",
            caller=caller,
        ) from None
    return directory
