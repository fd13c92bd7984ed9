"""sentence-transformers checkpoints <-> `SentenceEmbedder`: a directory whose `modules.json` lists a
`Transformer` (a transformers checkpoint, read by this package's converters), a `Pooling`, optionally
`Dense` modules and a `Normalize` module; the files sentence-transformers 2 to 6 write and read."""

from __future__ import annotations

import json
import os

import numpy as np

from keras_tfm.convert.files import read_weights
from keras_tfm.convert.registry import exporter, exporter_of
from keras_tfm.convert.weights import WeightWriter
from keras_tfm.errors import CheckpointError
from keras_tfm.layers.token_pooling import MODES
from keras_tfm.models.bert import Bert
from keras_tfm.models.modern_bert import ModernBert
from keras_tfm.models.sentence_embedder import SentenceEmbedder

# the legacy `pooling_mode_*` flags of a Pooling config, in the order their vectors are concatenated
_LEGACY_FLAGS = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
# sentence-transformers' Dense activations (torch modules by their path) -> Keras' names
_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "linear",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.GELU": "gelu",
}


def is_sentence_transformers(directory) -> bool:
    return isinstance(directory, (str, os.PathLike)) and os.path.isfile(os.path.join(directory, "modules.json"))


def from_sentence_transformers(directory: str, load) -> SentenceEmbedder:
    """The embedder of a sentence-transformers `directory`; `load(path)` reads its Transformer module's
    transformers checkpoint (`from_huggingface` with the caller's dtype)."""
    modules = _modules(directory)
    encoder = load(modules["Transformer"])
    encoder = getattr(encoder, "encoder", encoder)  # a task model's checkpoint: its encoder
    if not isinstance(encoder, (Bert, ModernBert)):
        raise CheckpointError(
            f"{directory!r}: its Transformer module is a {type(encoder).__name__}; sentence embedders are read "
            "for BERT-family encoders (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ModernBERT).",
            caller="from_huggingface",
        )
    settings = _transformer_settings(modules["Transformer"], encoder.longest_input)
    pooling = _pooling(os.path.join(modules["Pooling"], "config.json"), encoder.hidden_dim)
    prompts = _read_json(os.path.join(directory, "config_sentence_transformers.json"), {})
    dense = [_dense(path, size) for path, size in zip(modules["Dense"], _sizes(modules["Dense"], encoder, pooling))]
    embedder = SentenceEmbedder(
        encoder,
        pooling=pooling,
        normalize="Normalize" in modules,
        prompts={name: text for name, text in (prompts.get("prompts") or {}).items() if text},
        default_prompt_name=prompts.get("default_prompt_name") or None,
        projections=[projection for projection, _ in dense],
        dtype=encoder.dtype_policy,
        **settings,
    )
    embedder.build()
    for layer, (_, arrays) in zip(embedder.projection_layers, dense):
        layer.kernel.assign(arrays["linear.weight"].T)
        if layer.use_bias:
            layer.bias.assign(arrays["linear.bias"])
    embedder.tokenizer = encoder.tokenizer
    return embedder


def _sizes(paths: list, encoder, pooling: tuple) -> list:
    """The input size each Dense module must take: the pooled vector's, then each one's `out_features`."""
    sizes = [encoder.hidden_dim * len(pooling)]
    for path in paths[:-1]:
        sizes.append(_read_json(os.path.join(path, "config.json"), None).get("out_features"))
    return sizes


def _dense(path: str, size: int) -> tuple[dict, dict]:
    """A Dense module's projection (`SentenceEmbedder`'s) and its weights, refused by name where its
    activation or sizes do not fit."""
    config = _read_json(os.path.join(path, "config.json"), None)
    activation = _ACTIVATIONS.get(config.get("activation_function", "torch.nn.modules.activation.Tanh"))
    if activation is None or config.get("in_features") != size:
        raise CheckpointError(
            f"{path!r}: a Dense module of activation {config.get('activation_function')!r} from "
            f"{config.get('in_features')} features; expected one of {', '.join(_ACTIVATIONS)} from {size}.",
            caller="from_huggingface",
        )
    arrays = read_weights(path)
    bias = bool(config.get("bias", True))
    expected = {
        "linear.weight": (config.get("out_features"), size),
        **({"linear.bias": (config.get("out_features"),)} if bias else {}),
    }
    found = {name: tuple(arrays[name].shape) for name in expected if name in arrays}
    if found != expected:
        raise CheckpointError(f"{path!r}: expected weights {expected}; found {found}.", caller="from_huggingface")
    projection = {"units": config["out_features"], "activation": activation, "use_bias": bias}
    return projection, {name: np.asarray(arrays[name], "float32") for name in expected}


def _modules(directory: str) -> dict:
    """Each module's kind -> its folder, refusing the kinds `SentenceEmbedder` has no part for."""
    listed = _read_json(os.path.join(directory, "modules.json"), None)
    modules = {}
    for module in sorted(listed, key=lambda module: module.get("idx", 0)):
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind not in _MODULES:
            raise CheckpointError(
                f"{directory!r}: its sentence-transformers module {module.get('type')!r} is not supported; "
                f"supported: {', '.join(_MODULES)}.",
                caller="from_huggingface",
            )
        path = os.path.join(directory, module.get("path", ""))
        if kind == "Dense":
            modules.setdefault("Dense", []).append(path)  # any number, in order
        else:
            modules[kind] = path
    modules.setdefault("Dense", [])
    if "Transformer" not in modules or "Pooling" not in modules:
        raise CheckpointError(
            f"{directory!r}: modules.json lists no {'Transformer' if 'Transformer' not in modules else 'Pooling'} "
            "module; a sentence embedder needs both.",
            caller="from_huggingface",
        )
    return modules


def _transformer_settings(path: str, max_length: int) -> dict:
    """The tokenizing settings: `max_seq_length` from sentence_bert_config.json (older files), else the
    tokenizer's `model_max_length` (newer ones), at most the encoder's positions."""
    config = _read_json(os.path.join(path, "sentence_bert_config.json"), {})
    tokenizer_limit = _read_json(os.path.join(path, "tokenizer_config.json"), {}).get("model_max_length")
    limit = config.get("max_seq_length") or (tokenizer_limit if (tokenizer_limit or 1e30) < 1e6 else None)
    return {
        "max_sequence_length": min(int(limit or max_length), max_length),
        "lowercase": bool(config.get("do_lower_case")),
    }


def _pooling(path: str, hidden_dim: int) -> tuple:
    config = _read_json(path, None)
    if not config.get("include_prompt", True):
        raise CheckpointError(
            f"{path!r}: a pooling that leaves out the prompt's tokens (include_prompt=false) is not supported.",
            caller="from_huggingface",
        )
    modes = config.get("pooling_mode") or [mode for mode, flag in _LEGACY_FLAGS.items() if config.get(flag)] or "mean"
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension", hidden_dim))
    if dimension != hidden_dim or not set(modes) <= set(MODES):
        raise CheckpointError(
            f"{path!r}: pooling {modes} of {dimension} dimensions does not fit an encoder of {hidden_dim}.",
            caller="from_huggingface",
        )
    return modes


def _read_json(path: str, default):
    if not os.path.isfile(path):
        if default is None:
            raise CheckpointError(f"{path!r} is missing.", caller="from_huggingface")
        return default
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except ValueError as error:
        raise CheckpointError(f"{path!r} is not valid JSON ({error}).", caller="from_huggingface") from None


@exporter(SentenceEmbedder)
def export_sentence_embedder(model: SentenceEmbedder, w: WeightWriter) -> dict:
    """The encoder as its transformers checkpoint, and beside it the module files sentence-transformers reads."""
    export = exporter_of(model.encoder)
    if export is None:
        raise CheckpointError(f"no checkpoint format for an encoder {type(model.encoder).__name__}.",
                              caller="save_huggingface")  # fmt: skip
    config = export(model.encoder, w)
    legacy = list(model.pooling) == [mode for mode in _LEGACY_FLAGS if mode in model.pooling]
    pooling = {flag: mode in model.pooling for mode, flag in _LEGACY_FLAGS.items()} if legacy else {}
    dense = [("Dense", f"{2 + i}_Dense") for i in range(len(model.projections))]
    modules = [("Transformer", ""), ("Pooling", "1_Pooling"), *dense]
    modules += [("Normalize", f"{2 + len(dense)}_Normalize")] * model.normalize
    _write_dense(model, [path for _, path in dense], w)
    w.files.update(
        {
            "modules.json": [
                {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
                for i, (kind, path) in enumerate(modules)
            ],
            "sentence_bert_config.json": {
                "max_seq_length": model.max_sequence_length,
                "do_lower_case": model.lowercase,
            },
            "config_sentence_transformers.json": {
                "prompts": model.prompts,
                "default_prompt_name": model.default_prompt_name,
                "similarity_fn_name": "cosine",
            },
            "1_Pooling/config.json": {
                "word_embedding_dimension": model.encoder.hidden_dim,
                **(pooling or {"pooling_mode": list(model.pooling)}),
                "include_prompt": True,
            },
            **({f"{2 + len(dense)}_Normalize/config.json": {}} if model.normalize else {}),
        }
    )
    return config


def _write_dense(model: SentenceEmbedder, folders: list, w: WeightWriter) -> None:
    """The model's projections as sentence-transformers' Dense modules in `folders`, each its config and
    its own weights file."""
    size, torch_names = model.pooled_dim, {name: path for path, name in _ACTIVATIONS.items()}
    for folder, layer, projection in zip(folders, model.projection_layers, model.projections):
        if projection["activation"] not in torch_names:
            raise CheckpointError(
                f"a projection's activation {projection['activation']!r} has no sentence-transformers Dense "
                f"module; those it has: {', '.join(torch_names)}.",
                caller="save_huggingface",
            )
        w.module_weights[folder] = WeightWriter()
        w.module_weights[folder].linear("linear", layer)
        w.files[f"{folder}/config.json"] = {
            "in_features": size, "out_features": projection["units"], "bias": projection["use_bias"],
            "activation_function": torch_names[projection["activation"]],
        }  # fmt: skip
        size = projection["units"]
