"""Checkpoint files: a directory or a Hugging Face Hub model id (through the local cache), its
`config.json` and its weights (safetensors or PyTorch, one file or shards)."""

from __future__ import annotations

import json
import os
import re

from keras_tfm.convert.config import checkpoint_config
from keras_tfm.convert.registry import check_model_type


def read_json(path: str, caller: str) -> dict:
    """A checkpoint's JSON file; a corrupt one is a ValueError naming `caller` and the file."""
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{caller}: {path!r} is not valid JSON ({error}).") from None


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
        raise NotADirectoryError(
            f"{caller}: {path!r} is a file; expected a checkpoint directory or a Hugging Face Hub model id."
        )
    if not _HUB_MODEL_ID.fullmatch(path):
        raise FileNotFoundError(f"{caller}: there is no directory {path!r} (nor is it a Hugging Face Hub model id).")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FileNotFoundError(
            f"{caller}: there is no directory {path!r}; to read it as a Hugging Face Hub model "
            f"id, install huggingface_hub."
        ) from None
    try:
        directory = snapshot_download(path, allow_patterns=_HUB_FILES)
        if not any(name.endswith(".safetensors") for name in os.listdir(directory)):
            directory = snapshot_download(path, allow_patterns=["pytorch_model*.bin", "adapter_model.bin"])
    except Exception as error:  # huggingface_hub's errors: offline without a cached copy, unknown id, gated, ...
        raise FileNotFoundError(
            f"{caller}: {path!r} is neither a local directory nor a Hugging Face Hub model found in the local "
            f"cache or on the Hub ({type(error).__name__}: {error})"
        ) from None
    return directory


def read_config(path: str) -> dict:
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"from_huggingface: no config.json in directory {path!r}.")
    config = checkpoint_config(read_json(config_path, "from_huggingface"), repr(config_path))
    check_model_type(config)
    return config


def read_weight_file(file: str) -> dict:
    """One `.safetensors` or `.bin` file's arrays; a corrupt file is a ValueError naming it."""
    try:
        if file.endswith(".safetensors"):
            from safetensors.numpy import load_file

            return load_file(file)
        import torch

        state = torch.load(file, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    except Exception as error:  # safetensors and torch raise their own error types for corrupt files
        raise ValueError(f"from_huggingface: cannot read {file!r}: {error}") from None


def read_weights(path: str) -> dict:
    """The weights of a `save_pretrained` directory: one file, or shards listed by an index file
    (`save_pretrained` shards what exceeds `max_shard_size`, e.g. GPT-2 XL in fp32)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.isfile(os.path.join(path, name)):
            return read_weight_file(os.path.join(path, name))
        index_path = os.path.join(path, name + ".index.json")
        if os.path.isfile(index_path):
            weight_map = read_json(index_path, "from_huggingface").get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(
                    f"from_huggingface: {index_path!r} has no 'weight_map' of weight names to shard files."
                )
            weights = {}
            for shard in sorted(set(weight_map.values())):
                shard_path = os.path.join(path, shard)
                if not os.path.isfile(shard_path):
                    raise FileNotFoundError(f"from_huggingface: shard {shard!r}, listed in {index_path!r}, is missing.")
                weights.update(read_weight_file(shard_path))
            return weights
    raise FileNotFoundError(
        f"from_huggingface: directory {path!r} has neither model.safetensors nor pytorch_model.bin "
        f"(nor their sharded .index.json)."
    )


def read_checkpoint(model_or_directory) -> tuple[dict, dict]:
    """(config, weights) of a transformers model, a checkpoint directory or a Hub model id."""
    if isinstance(model_or_directory, (str, os.PathLike)):
        directory = checkpoint_directory(model_or_directory)
        return read_config(directory), read_weights(directory)
    if hasattr(model_or_directory, "state_dict") and hasattr(model_or_directory, "config"):
        weights = {k: v.detach().float().cpu().numpy() for k, v in model_or_directory.state_dict().items()}
        config = checkpoint_config(model_or_directory.config.to_dict(), "the model's configuration (`model.config`)")
        return config, weights
    raise TypeError(
        "from_huggingface expects a transformers model or a directory path; received "
        f"{type(model_or_directory).__name__}."
    )
