"""Checkpoint files: a directory or a Hugging Face Hub model id (`keras_tfm.hub`), its `config.json`
and its weights (safetensors or PyTorch, one file or shards)."""

from __future__ import annotations

import json
import os

from keras_tfm.convert.config import checkpoint_config
from keras_tfm.convert.registry import check_model_type
from keras_tfm.convert.safetensors_files import SafetensorsWeights
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.hub import checkpoint_directory


def read_json(path: str, caller: str) -> dict:
    """A checkpoint's JSON file; a corrupt one is a `CheckpointError` naming `caller` and the file."""
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{path!r} is not valid JSON ({error}).", caller=caller) from None


def read_config(path: str) -> dict:
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise CheckpointError(f"no config.json in directory {path!r}.", caller="from_huggingface")
    config = checkpoint_config(read_json(config_path, "from_huggingface"), repr(config_path))
    check_model_type(config)
    return config


def read_weight_file(file: str, lazy: bool = False):
    """One `.safetensors` or `.bin` file's arrays (a `.safetensors` file's read one at a time when asked
    for, with `lazy`); a corrupt file is a `CheckpointError` naming it."""
    if file.endswith(".safetensors"):
        weights = SafetensorsWeights([file])
        return weights if lazy else dict(weights)
    try:
        import torch

        state = torch.load(file, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    except Exception as error:  # safetensors and torch raise their own error types for corrupt files
        raise CheckpointError(f"cannot read {file!r}: {error}", caller="from_huggingface") from None


def read_weights(path: str) -> dict:
    """The weights of a `save_pretrained` directory: one file, or shards listed by an index file
    (`save_pretrained` shards what exceeds `max_shard_size`, e.g. GPT-2 XL in fp32)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.isfile(os.path.join(path, name)):
            return read_weight_file(os.path.join(path, name), lazy=True)
        index_path = os.path.join(path, name + ".index.json")
        if os.path.isfile(index_path):
            weight_map = read_json(index_path, "from_huggingface").get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(
                    f"{index_path!r} has no 'weight_map' of weight names to shard files.", caller="from_huggingface"
                )
            shards = [os.path.join(path, shard) for shard in sorted(set(weight_map.values()))]
            for shard in shards:
                if not os.path.isfile(shard):
                    raise CheckpointError(
                        f"shard {os.path.basename(shard)!r}, listed in {index_path!r}, is missing.",
                        caller="from_huggingface",
                    )
            if name.endswith(".safetensors"):
                return SafetensorsWeights(shards)
            return {key: value for shard in shards for key, value in read_weight_file(shard).items()}
    raise CheckpointError(
        f"directory {path!r} has neither model.safetensors nor pytorch_model.bin (nor their sharded .index.json).",
        caller="from_huggingface",
    )


def read_checkpoint(model_or_directory) -> tuple[dict, dict]:
    """(config, weights) of a transformers model, a checkpoint directory or a Hub model id."""
    if isinstance(model_or_directory, (str, os.PathLike)):
        directory = checkpoint_directory(model_or_directory)
        return read_config(directory), read_weights(directory)
    if hasattr(model_or_directory, "state_dict") and hasattr(model_or_directory, "config"):
        weights = {k: v.detach().float().cpu().numpy() for k, v in model_or_directory.state_dict().items()}
        config = checkpoint_config(model_or_directory.config.to_dict(), "the model's configuration (`model.config`)")
        if not config.get("architectures"):  # a model made in memory: its class is its task
            config["architectures"] = [type(model_or_directory).__name__]
        return config, weights
    raise InputError(
        "from_huggingface expects a transformers model or a directory path; received "
        f"{type(model_or_directory).__name__}."
    )
