"""sentence-transformers checkpoints <-> `SentenceEmbedder`: a directory whose `modules.json` lists a
`Transformer` (a transformers checkpoint, read by this package's converters), a `Pooling` and optionally a
`Normalize` module; the files sentence-transformers 2 to 6 write and read."""

from __future__ import annotations

import json
import os

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
_MODULES = ("Transformer", "Pooling", "Normalize")


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
    embedder = SentenceEmbedder(
        encoder,
        pooling=pooling,
        normalize="Normalize" in modules,
        prompts={name: text for name, text in (prompts.get("prompts") or {}).items() if text},
        default_prompt_name=prompts.get("default_prompt_name") or None,
        dtype=encoder.dtype_policy,
        **settings,
    )
    embedder.tokenizer = encoder.tokenizer
    return embedder


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
        modules[kind] = os.path.join(directory, module.get("path", ""))
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
    modules = [("Transformer", ""), ("Pooling", "1_Pooling")] + [("Normalize", "2_Normalize")] * model.normalize
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
            **({"2_Normalize/config.json": {}} if model.normalize else {}),
        }
    )
    return config
