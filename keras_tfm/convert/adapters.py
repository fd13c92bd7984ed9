"""`peft` LoRA adapters on Hugging Face checkpoints, as keras_tfm models with LoRA enabled.

An adapter (`PeftModel.save_pretrained`) is a directory with `adapter_config.json` (rank `r`,
`lora_alpha`, the base checkpoint's `base_model_name_or_path`, ...) and `adapter_model.safetensors`:
for each adapted linear module, `<module>.lora_A.weight` (rank, in) and `<module>.lora_B.weight`
(out, rank), and the whole weights of its `modules_to_save` (a new classification head), every name
under `base_model.model.`. peft adds `(lora_alpha / r) * B @ A` to a weight (out, in); Keras'
`Dense.enable_lora` adds `(lora_alpha / rank) * A' @ B'` to a kernel (in, out), with `A' = A.T` and
`B' = B.T`. A module the converter splits (GPT-2's fused query/key/value `c_attn`) gives each part
the same `A` and its rows of `B`: the same outputs, with `A` trained per part from then on.

`from_huggingface` converts the base checkpoint with the adapter's head weights in place of its
own (`WeightReader.linear` takes each module's pair as it goes), then enables LoRA on the modules
the adapter adapts and loads their pairs (`enable_adapter`). `save_peft_adapter` goes the other
way: a keras_tfm LoRA model's pairs as an adapter that peft loads onto the base checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import re

import keras
import numpy as np

from keras_tfm.convert.config import checkpoint_config
from keras_tfm.convert.files import read_checkpoint, read_json, read_weight_file
from keras_tfm.convert.registry import convert_checkpoint
from keras_tfm.convert.weights import WeightReader
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.layers.quantization import _named_sublayers
from keras_tfm.models import lora

PREFIX = "base_model.model."  # what peft puts before the base model's module names


def is_adapter_directory(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "adapter_config.json"))


def is_peft_model(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_model_name(directory: str) -> str:
    """The base checkpoint an adapter directory names (a Hub model id or a local directory)."""
    config = read_json(os.path.join(directory, "adapter_config.json"), "from_huggingface")
    name = config.get("base_model_name_or_path")
    if not name:
        raise CheckpointError(
            f"the adapter in {directory!r} names no base checkpoint "
            "(base_model_name_or_path is empty); pass the base checkpoint as model_or_directory and "
            "the adapter as adapter=.",
            caller="from_huggingface",
        )
    return name


def read_adapter(directory: str) -> tuple[dict, dict]:
    """(adapter config, adapter weights named as in the base model) of an adapter directory."""
    if not is_adapter_directory(directory):
        raise CheckpointError(
            f"adapter: no adapter_config.json in {directory!r} (a peft "
            "adapter directory, saved by PeftModel.save_pretrained).",
            caller="from_huggingface",
        )
    config = read_json(os.path.join(directory, "adapter_config.json"), "from_huggingface")
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        if os.path.isfile(os.path.join(directory, name)):
            weights = read_weight_file(os.path.join(directory, name))
            break
    else:
        raise CheckpointError(
            f"adapter directory {directory!r} has neither adapter_model.safetensors nor adapter_model.bin.",
            caller="from_huggingface",
        )
    _check_config(config, directory)
    return config, {name.removeprefix(PREFIX): value for name, value in weights.items()}


def peft_model_parts(peft_model) -> tuple[dict, dict, dict, dict]:
    """(base config, base weights, adapter config, adapter weights) of an in-memory `PeftModel`
    (its active adapter), named as in a base checkpoint and an adapter directory."""
    name = peft_model.active_adapter
    if not isinstance(name, str):  # several adapters active at once: their sum is not one LoRA
        raise CheckpointError(
            f"the PeftModel has several active adapters {name!r}; activate one (set_adapter).",
            caller="from_huggingface",
        )
    config = {key: getattr(value, "value", value) for key, value in peft_model.peft_config[name].to_dict().items()}
    _check_config(config, "the PeftModel")
    base, adapter = {}, {}
    for key, value in peft_model.state_dict().items():
        key = key.removeprefix(PREFIX)
        value = value.detach().float().cpu().numpy()
        lora_key = re.sub(rf"(\.lora_\w+)\.{re.escape(name)}(?=\.|$)", r"\1", key)  # x.lora_A.default.weight
        if lora_key != key:
            adapter[lora_key] = value
        elif f".modules_to_save.{name}." in key:
            adapter[key.replace(f".modules_to_save.{name}.", ".")] = value
        elif not any(part in key for part in (".lora_", ".modules_to_save.", ".original_module.")):
            base[key.replace(".base_layer.", ".")] = value
    base_config = checkpoint_config(
        peft_model.get_base_model().config.to_dict(), "the PeftModel's base configuration (`model.config`)"
    )
    return base_config, base, config, adapter


def _check_config(config: dict, source: str) -> None:
    """Refuses, by name, adapters whose update is not `(lora_alpha / r) * B @ A` on linear modules."""
    if config.get("peft_type") != "LORA":
        raise CheckpointError(
            f"{source!r} is a {config.get('peft_type')!r} adapter; keras_tfm loads LoRA adapters (peft_type 'LORA').",
            caller="from_huggingface",
        )
    unsupported = {
        "use_dora": False,
        "bias": "none",
        "lora_bias": False,
        "rank_pattern": {},
        "alpha_pattern": {},
        "layer_replication": None,
        "trainable_token_indices": None,
        "target_parameters": None,
        "enable_lora": None,
    }  # (peft < 0.3's merged query/key/value layout)
    for field, value in unsupported.items():
        received = config.get(field, value)
        if received != value and (received or value):  # None, {} and False alike mean "not used"
            raise CheckpointError(
                f"LoRA adapters with {field}={received!r} are not supported; "
                f"keras_tfm loads those with {field}={value!r}.",
                caller="from_huggingface",
            )


def check_weights(adapter_weights: dict, num_classes: int | None) -> int | None:
    """Refuses LoRA on embeddings, and a new head of `num_classes` classes where the adapter brings
    a trained head of another size; returns the `num_classes` to convert with (None: the adapter's
    head, where it has one of that size)."""
    embeddings = sorted(name for name in adapter_weights if ".lora_embedding_" in name)
    if embeddings:
        raise CheckpointError(
            f"the adapter adapts embeddings ({embeddings[:2]}); keras_tfm's LoRA adapts linear layers only.",
            caller="from_huggingface",
        )
    heads = sorted(name for name in adapter_weights if ".lora_" not in name)
    if num_classes is None or not heads:
        return num_classes
    classes = adapter_weights["classifier.weight"].shape[0] if "classifier.weight" in adapter_weights else None
    if classes != num_classes:
        raise CheckpointError(
            f"the adapter brings its own trained head ({heads[:2]}"
            f"{f', {classes} classes' if classes else ''}); num_classes={num_classes} would replace it. "
            "Leave num_classes None.",
            caller="from_huggingface",
        )
    return None


def enable_adapter(model, w: WeightReader, config: dict) -> None:
    """Enables LoRA on the layers made from the modules whose pairs `w` took while converting the
    base checkpoint, and loads those pairs; the layers made from `modules_to_save` stay trainable."""
    if not w.lora_pairs:
        raise CheckpointError("the adapter has no LoRA pairs (lora_A / lora_B weights).", caller="from_huggingface")
    rank = config["r"]
    # Keras scales by lora_alpha / rank; rsLoRA by lora_alpha / sqrt(rank)
    alpha = config["lora_alpha"] * (math.sqrt(rank) if config.get("use_rslora") else 1.0)
    paths = {id(layer): path for path, layer in _named_sublayers(model)}
    saved = config.get("modules_to_save") or []
    trainable = [
        paths[id(dense)]
        for name, layers in w.linear_layers.items()
        for dense in layers
        if any(name == module or name.endswith("." + module) for module in saved)
    ]
    targets = [paths[id(dense)] for name in w.lora_pairs for dense in w.linear_layers[name]]
    lora.enable_lora(model, rank, targets, alpha, trainable)
    for name, (a, b) in w.lora_pairs.items():
        if a.shape[0] != rank:
            raise CheckpointError(
                f"the adapter's {name}.lora_A has rank {a.shape[0]}; its config says r={rank}.",
                caller="from_huggingface",
            )
        layers = w.linear_layers[name]
        for dense, b_part in zip(layers, np.split(b, len(layers), axis=0)):
            dense.lora_kernel_a.assign(a.T)
            dense.lora_kernel_b.assign(b_part.T)


# Export: a keras_tfm LoRA model as a peft adapter on the checkpoint it was fine-tuned from.

# What peft names the model under `base_model.model.` for each keras_tfm model: the transformers
# class whose weights the model has, and its peft task type.
_TASKS = {
    "GPT": ("transformer.", "CAUSAL_LM"),
    "DecoderLM": ("model.", "CAUSAL_LM"),
    "Translator": ("model.", "SEQ_2_SEQ_LM"),
    "BertClassifier": ("bert.", "SEQ_CLS"),
    "BertMLM": ("bert.", None),
    "Bert": ("", None),
}
_ROOT_MODULES = ("lm_head", "classifier", "cls.")  # modules of the task class, not of its base model
# a ViT's head, and a BertClassifier's (the Dense of its head layer)
_HEADS = {"head": "classifier", "classifier": "classifier", "head/classifier": "classifier"}


def save_peft_adapter(model, directory: str, base, base_model_name_or_path: str | None = None) -> None:
    """Writes the LoRA pairs of `model`, fine-tuned from the Hugging Face checkpoint `base`, as a
    peft adapter directory (`adapter_config.json`, `adapter_model.safetensors`):
    `peft.PeftModel.from_pretrained(base_model, directory)` then computes what `model` computes,
    and `from_huggingface(directory)` gives `model` back. A head trained whole beside the pairs
    (`enable_lora`'s default for ViT and `BertClassifier`) goes in as `modules_to_save`.

    Args:
        model: a keras_tfm model with LoRA enabled (`enable_lora`, or an adapter loaded by
            `from_huggingface`).
        directory: where to write the adapter (made if missing).
        base: the checkpoint `model` was converted from, as `from_huggingface` took it (a directory,
            a Hub model id, or a transformers model); read to map each layer to its module.
        base_model_name_or_path: how the adapter names its base (default: `base`, where it is a
            path or id), e.g. the Hub id of a checkpoint read from the local cache.

    A fused module of the checkpoint (GPT-2's query/key/value `c_attn`) with LoRA on k of its parts
    gets one pair of rank k * rank, exact: `A` stacks the parts' `A`s, `B` is block-diagonal,
    and `lora_alpha` is k times ours, so that peft's scale `lora_alpha / r` is ours.

    Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100)).save_pretrained("tiny-gpt2")
    >>> model = keras_tfm.from_huggingface("tiny-gpt2")  # or a Hub id: "gpt2"
    >>> model.enable_lora(rank=8)
    >>> tokens = np.random.randint(0, 100, (4, 17))
    >>> history = model.fit(tokens[:, :-1], tokens[:, 1:], verbose=0)
    >>> keras_tfm.convert.save_peft_adapter(model, "gpt2-lora", base="tiny-gpt2")
    """
    from safetensors.numpy import save_file

    layers = lora.lora_layers(model)
    if not layers:
        raise InputError(
            f"{model.name!r} has no LoRA layers; call enable_lora(rank) first.", caller="save_peft_adapter"
        )
    config, w, module_of = _base_modules(model, base)
    prefix, task_type = _TASKS.get(type(model).__name__, ("vit." if getattr(model, "include_top", False) else "", None))

    def peft_name(module: str) -> str:
        return module if module.startswith(_ROOT_MODULES) else prefix + module

    adapted, parts_adapted = _adapted_modules(layers, w, module_of)
    first = next(iter(layers.values()))
    rank, alpha = first.lora_rank, first.lora_alpha
    tensors = _pair_tensors(adapted, w, rank, peft_name)
    heads = _head_tensors(model, layers, tensors)
    base_name = base_model_name_or_path or (
        os.fspath(base) if isinstance(base, (str, os.PathLike)) else config.get("_name_or_path") or None
    )
    adapter_config = {
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base_name,
        "r": parts_adapted * rank,
        "lora_alpha": parts_adapted * alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted(peft_name(module) for module in adapted),
        "modules_to_save": heads or None,
        "fan_in_fan_out": config["model_type"] == "gpt2",  # GPT-2's Conv1D stores (in, out)
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "adapter_config.json"), "w") as file:
        json.dump(adapter_config, file, indent=2)
    save_file(
        {name: np.ascontiguousarray(value, "float32") for name, value in tensors.items()},
        os.path.join(directory, "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )


def _base_modules(model, base) -> tuple[dict, WeightReader, dict]:
    """The base checkpoint's config, the reader that converted it (which layers each linear module
    became), and each of `model`'s layer paths -> (checkpoint module, part)."""
    config, weights = read_checkpoint(base)
    classifier = getattr(model, "include_top", True) and getattr(model, "num_classes", None)
    fresh, w = convert_checkpoint(config, weights, classifier or None)
    if type(fresh) is not type(model):
        described = repr(os.fspath(base)) if isinstance(base, (str, os.PathLike)) else f"(a {type(base).__name__})"
        raise InputError(
            f"{model.name!r} is a {type(model).__name__}; the checkpoint base="
            f"{described} converts to a {type(fresh).__name__}.",
            caller="save_peft_adapter",
        )
    fresh_paths = {id(layer): path for path, layer in _named_sublayers(fresh)}
    module_of = {
        fresh_paths[id(dense)]: (module, index)
        for module, parts in w.linear_layers.items()
        for index, dense in enumerate(parts)
    }
    return config, w, module_of


def _adapted_modules(layers: dict, w: WeightReader, module_of: dict) -> tuple[dict, int]:
    """Each checkpoint module with LoRA -> its parts' LoRA layers (None: a part without), and how many
    parts of each module are adapted (the same in every module: peft has one rank)."""
    adapted = {}
    for path, dense in layers.items():
        if path not in module_of:
            raise InputError(
                f"the LoRA layer {path!r} has no counterpart in the checkpoint's linear modules.",
                caller="save_peft_adapter",
            )
        module, index = module_of[path]
        adapted.setdefault(module, [None] * len(w.linear_layers[module]))[index] = dense
    counts = {sum(dense is not None for dense in parts) for parts in adapted.values()}
    if len(counts) > 1:  # peft's one rank would need a rank_pattern
        raise InputError(
            "LoRA on some parts of fused modules and not on others (GPT-2's "
            "query/key/value) makes ranks that differ between modules; enable it on the same parts in "
            "every block.",
            caller="save_peft_adapter",
        )
    return adapted, counts.pop()


def _pair_tensors(adapted: dict, w: WeightReader, rank: int, peft_name) -> dict:
    """peft's `lora_A` and `lora_B` of each module; a fused module's parts side by side (B block-diagonal)."""
    tensors = {}
    for module, parts in adapted.items():
        lora_parts = [dense for dense in parts if dense is not None]
        a = np.concatenate([keras_numpy(dense.lora_kernel_a).T for dense in lora_parts])  # (k * rank, in)
        widths = [fresh_part.units for fresh_part in w.linear_layers[module]]
        b = np.zeros((sum(widths), len(lora_parts) * rank), "float32")
        row, column = 0, 0
        for dense, width in zip(parts, widths):
            if dense is not None:
                b[row : row + width, column : column + rank] = keras_numpy(dense.lora_kernel_b).T
                column += rank
            row += width
        tensors[f"{PREFIX}{peft_name(module)}.lora_A.weight"] = a
        tensors[f"{PREFIX}{peft_name(module)}.lora_B.weight"] = b
    return tensors


def _head_tensors(model, layers: dict, tensors: dict) -> list[str]:
    """Adds the classification heads trained beside the pairs to `tensors`; returns their module names
    (peft's `modules_to_save`). Anything else trained is refused: an adapter cannot hold it."""
    heads = {
        path: layer
        for path, layer in _named_sublayers(model)
        if path in _HEADS and isinstance(layer, keras.layers.Dense) and any(v.trainable for v in layer.weights)
    }
    exported = {id(variable) for layer in [*layers.values(), *heads.values()] for variable in layer.weights}
    others = [variable.path for variable in model.trainable_weights if id(variable) not in exported]
    if others:
        raise InputError(
            f"{others[:3]} are trained beside the LoRA pairs; an adapter holds the "
            f"pairs and a classification head ({sorted(_HEADS)}), not those.",
            caller="save_peft_adapter",
        )
    for path, head in heads.items():
        tensors[f"{PREFIX}{_HEADS[path]}.weight"] = keras_numpy(head.kernel).T
        tensors[f"{PREFIX}{_HEADS[path]}.bias"] = keras_numpy(head.bias)
    return sorted({_HEADS[path] for path in heads})


def keras_numpy(variable) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(variable), "float32")
