"""LoRA (Hu et al., 2021): fine-tune a frozen model through small low-rank updates of chosen kernels.

A LoRA `Dense` computes `x @ (W + (alpha / rank) * A @ B)`: `W` is frozen, `A` (inputs x rank,
random) and `B` (rank x units, zeros) are trained, so the model starts out unchanged. The update
lives in Keras' own `Dense.enable_lora`; this file chooses the layers, freezes the rest and keeps
the small `A`, `B` pairs in files of their own.

Saving: Keras writes a LoRA `Dense` with its update merged into the kernel (a `.keras` file of a
LoRA model is a plain fine-tuned model) and zeroes `A` and `B` when it loads one. A checkpoint that
training resumes from must instead hold the frozen kernel and the pairs apart: `unmerged(model)`
makes `save_weights` write the frozen kernels, and `save_lora_weights` writes the pairs.
"""

from __future__ import annotations

import contextlib
import json
import os

import keras
import numpy as np

from keras_tfm.compat import track_variables_again
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.layers.quantization import _named_sublayers

DEFAULT_TARGETS = ("query", "value")


def lora_layers(model: keras.layers.Layer) -> dict:
    """{path below `model`: Dense layer} of every `Dense` with LoRA enabled."""
    return {
        path: layer
        for path, layer in _named_sublayers(model)
        if isinstance(layer, keras.layers.Dense) and layer.lora_enabled
    }


def enable_lora(
    model: keras.layers.Layer,
    rank: int,
    target_layer_names=DEFAULT_TARGETS,
    lora_alpha: float | None = None,
    trainable_layer_names=(),
) -> list[str]:
    """Freezes every weight of the built `model`, then gives each `Dense` named in
    `target_layer_names` (by its name, or by the end of its path: "cross_attention/query") a
    trained rank-`rank` update, scaled by `lora_alpha / rank` (`lora_alpha` defaults to `rank`).
    Layers named in `trainable_layer_names` (a new classification head, say) stay trained whole.
    Returns the paths of the LoRA layers.

    Example:
    >>> model = keras_tfm.gpt_shakespeare_char_cpu()
    >>> model.build()
    >>> enable_lora(model, rank=4)[:2]  # the layers it adapted: every attention's query and value
    ['block_0/self_attention/query', 'block_0/self_attention/value']
    """
    if not model.built:  # its Dense layers are made when it builds: none to choose from yet
        raise InputError(
            f"{model.name!r} is not built yet; build it first (call it on a batch, or "
            "`build()`), or use a keras_tfm model's own `enable_lora`, which does.",
            caller="enable_lora",
        )
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InputError(f"rank must be a positive integer; received rank={rank!r}.", caller="enable_lora")
    if lora_alpha is not None and not lora_alpha > 0:
        raise InputError(
            f"lora_alpha must be positive (or None for the rank); received {lora_alpha!r}.", caller="enable_lora"
        )
    if isinstance(target_layer_names, str) or isinstance(trainable_layer_names, str):
        raise InputError(
            "target_layer_names and trainable_layer_names are lists of layer names; "
            f"received a string ({target_layer_names!r}, {trainable_layer_names!r}).",
            caller="enable_lora",
        )
    if lora_layers(model):
        raise InputError(
            f"LoRA is already enabled on {model.name!r} (rank "
            f"{next(iter(lora_layers(model).values())).lora_rank}); it can be enabled once.",
            caller="enable_lora",
        )
    sublayers = dict(_named_sublayers(model))
    dense = {path: layer for path, layer in sublayers.items() if isinstance(layer, keras.layers.Dense)}
    for argument, names, candidates in (
        ("target_layer_names", target_layer_names, dense),
        ("trainable_layer_names", trainable_layer_names, sublayers),
    ):
        unknown = [name for name in names if not _matching(candidates, [name])]
        if unknown or (argument == "target_layer_names" and not names):
            raise InputError(
                f"{argument} names no {'Dense ' if candidates is dense else ''}layer of {model.name!r}: "
                f"{unknown or list(names)}; its Dense layers are named "
                f"{sorted({layer.name for layer in dense.values()})} (or by the end of their path, such as "
                f"'self_attention/output').",
                caller="enable_lora",
            )
    for variable in model.weights:
        variable.trainable = False
    for layer in _matching(sublayers, trainable_layer_names).values():
        for variable in layer.weights:
            variable.trainable = True
    targets = _matching(dense, target_layer_names)
    for layer in targets.values():
        layer.enable_lora(rank, lora_alpha=lora_alpha)
    track_variables_again(model)
    return list(targets)


def _matching(layers: dict, names) -> dict:
    """The layers whose path below the model ends in one of `names`: a layer name ("query") or the
    end of a path ("self_attention/output", not the feed-forward's "output")."""
    return {
        path: layer
        for path, layer in layers.items()
        if any(path == name or path.endswith("/" + name) for name in names)
    }


def save_lora_weights(model: keras.layers.Layer, filepath: str) -> None:
    """Writes the LoRA pairs of `model` (not its frozen weights) to a `.npz` file."""
    layers = lora_layers(model)
    if not layers:
        raise InputError(
            f"{model.name!r} has no LoRA layers; call enable_lora(rank) first.", caller="save_lora_weights"
        )
    if not str(filepath).endswith(".npz"):
        raise InputError(f"filepath must end in '.npz'; received {filepath!r}.", caller="save_lora_weights")
    first = next(iter(layers.values()))
    arrays = {
        "config": np.array(
            json.dumps({"rank": first.lora_rank, "lora_alpha": first.lora_alpha, "target_layer_names": sorted(layers)})
        )
    }
    for path, layer in layers.items():
        arrays[f"{path}:a"] = keras.ops.convert_to_numpy(layer.lora_kernel_a)
        arrays[f"{path}:b"] = keras.ops.convert_to_numpy(layer.lora_kernel_b)
    with open(filepath, "wb") as file:  # a file object, so that numpy does not append its own ".npz"
        np.savez(file, **arrays)


def load_lora_weights(model: keras.layers.Layer, filepath: str) -> None:
    """Loads LoRA pairs written by `save_lora_weights` into `model`, first enabling LoRA with the
    file's rank and layers if the model has none. The frozen weights must be the ones the pairs
    were trained on (the same checkpoint)."""
    if not os.path.isfile(filepath):
        raise CheckpointError(f"no file {filepath!r}.", caller="load_lora_weights")
    try:
        with np.load(filepath, allow_pickle=False) as file:
            arrays = {key: file[key] for key in file.files}
        config = json.loads(str(arrays.pop("config")))
    except (OSError, ValueError, KeyError) as error:
        raise CheckpointError(
            f"{filepath!r} is not a LoRA file written by save_lora_weights ({type(error).__name__}: {error}).",
            caller="load_lora_weights",
        ) from None
    if not lora_layers(model):
        enable_lora(model, config["rank"], config["target_layer_names"], config["lora_alpha"])
    layers = lora_layers(model)
    expected = {f"{path}:{part}" for path in layers for part in "ab"}
    if set(arrays) != expected or any(layer.lora_rank != config["rank"] for layer in layers.values()):
        raise CheckpointError(
            f"{filepath!r} holds rank-{config['rank']} LoRA pairs for {len(arrays) // 2} layers; "
            f"{model.name!r} has rank-"
            f"{next(iter(layers.values())).lora_rank} LoRA on {len(layers)} layers "
            f"({sorted(set(arrays) ^ expected)[:4]} differ).",
            caller="load_lora_weights",
        )
    for path, layer in layers.items():
        for part, variable in (("a", layer.lora_kernel_a), ("b", layer.lora_kernel_b)):
            value = arrays[f"{path}:{part}"]
            if tuple(value.shape) != tuple(variable.shape):
                raise CheckpointError(
                    f"{path}:{part} in {filepath!r} has shape {value.shape}; the model's has {tuple(variable.shape)}.",
                    caller="load_lora_weights",
                )
            variable.assign(value)


@contextlib.contextmanager
def unmerged(model: keras.layers.Layer):
    """Within it, `save_weights` writes each LoRA layer's frozen kernel instead of the merged one.
    Loading such a file keeps those kernels and zeroes the pairs, which `load_lora_weights` restores."""
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer.lora_enabled = False
    try:
        yield
    finally:
        for layer in layers:
            layer.lora_enabled = True
