"""`from_huggingface`: build the matching keras_tfm model and copy a Hugging Face model's weights;
`save_huggingface`: the other way, a keras_tfm model as a checkpoint that `transformers` loads.

Takes an in-memory `transformers` model (PyTorch), a local directory with `config.json` and
`model.safetensors` / `pytorch_model.bin` (or their shards and `.index.json`), or a Hugging Face Hub
model id, whose files `huggingface_hub` keeps in its local cache. Reading a directory needs no
`transformers` and no network; converting weights needs only NumPy. Each model type's file
(`gpt2.py`, ...) holds its converter and its exporter, the same names in both directions.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Callable

import keras
import numpy as np

from keras_tfm.compat import sublayers

_CONVERTERS: dict[str, tuple] = {}
_EXPORTERS: dict[type, Callable] = {}


def converter(*model_types: str, prefixes: tuple[str, ...] = (), rename: Callable[[str], str] = lambda name: name):
    """Registers a function `(config: dict, w: WeightReader, num_classes: int | None) -> keras model`.
    `prefixes`: what task models put before the base model's weight names ("bert." in
    `BertForMaskedLM`); `rename`: maps every weight name first (older checkpoints' names)."""

    def register(fn):
        for model_type in model_types:
            _CONVERTERS[model_type] = (fn, prefixes, rename)
        return fn

    return register


def exporter(model_class: type):
    """Registers a function `(model, w: WeightWriter) -> config dict` that writes a `model_class`
    model as a checkpoint: its converter's inverse. A classifier's config gives `num_labels`, which
    `save_huggingface` turns into transformers' class names."""

    def register(fn):
        _EXPORTERS[model_class] = fn
        return fn

    return register


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
    >>> directory = checkpoint_directory("google/vit-base-patch16-224")  # .../snapshots/<commit>
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
    config = read_json(config_path, "from_huggingface")
    _check_model_type(config)
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


def _read_weights(path: str) -> dict:
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


def _check_model_type(config: dict) -> None:
    if config.get("model_type") not in _CONVERTERS:
        raise ValueError(
            f"from_huggingface: unsupported model_type {config.get('model_type')!r}; supported: {sorted(_CONVERTERS)}."
        )


def from_huggingface(model_or_directory, num_classes: int | None = None, adapter=None):
    """A keras_tfm model with the weights of a Hugging Face model.

    Args:
        model_or_directory: a `transformers` PyTorch model (e.g. `GPT2LMHeadModel`), the path of
            a local directory saved by `save_pretrained` (`config.json` + weights), or a Hugging Face
            Hub model id such as "gpt2", read from the local Hugging Face cache or downloaded
            into it (`checkpoint_directory`). Also a `peft` LoRA adapter: a `PeftModel`, or an
            adapter's directory or Hub id (`adapter_config.json`), whose base checkpoint is the one
            its `base_model_name_or_path` names.
        num_classes: for fine-tuning a ViT or BERT checkpoint as a classifier: a new, freshly
            initialised head with this many classes replaces the checkpoint's own head (or is added
            where it has none); every other weight comes from the checkpoint, BERT's pooler included
            when the checkpoint has one. None (default): the checkpoint's model as it is.
        adapter: a `peft` LoRA adapter (directory or Hub id) to apply to the checkpoint
            `model_or_directory`. The model comes back with LoRA enabled (`enable_lora`) and the
            adapter's pairs loaded, ready to predict or to train on: only the pairs and the
            adapter's `modules_to_save` (a classification head) are trainable
            (`keras_tfm.convert.adapters`).

    Supported: BERT (`BertModel` without its pooler, `BertForMaskedLM`, `BertForPreTraining`, the
    layout of the published BERT checkpoints, as a `BertMLM` without its next-sentence head,
    `BertForSequenceClassification`), GPT-2 (`GPT2Model`, `GPT2LMHeadModel`), Marian (`MarianMTModel`),
    ViT (`ViTModel` without its pooler, as `include_top=False`, and `ViTForImageClassification`).

    Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64))
    >>> model = keras_tfm.from_huggingface(hf)   # a keras_tfm.GPT with the same logits
    >>> vit = keras_tfm.from_huggingface("google/vit-base-patch16-224", num_classes=10)  # to fine-tune
    >>> gpt2 = keras_tfm.from_huggingface("gpt2")                  # by Hub id, through the local cache
    >>> tuned = keras_tfm.from_huggingface("gpt2", adapter="path/to/peft_adapter")  # GPT-2 + its LoRA
    """
    from keras_tfm.convert import adapters

    if num_classes is not None and (
        isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
    ):
        raise ValueError(f"from_huggingface: num_classes must be a positive integer or None; received {num_classes!r}.")
    adapter_config = None
    if adapters.is_peft_model(model_or_directory):
        if adapter is not None:
            raise ValueError(
                "from_huggingface: received a PeftModel, which holds its adapter, and adapter="
                f"{adapter!r}; pass one of them."
            )
        config, weights, adapter_config, adapter_weights = adapters.peft_model_parts(model_or_directory)
    else:
        base = model_or_directory
        if isinstance(base, (str, os.PathLike)) and adapter is None:
            directory = checkpoint_directory(base)
            if adapters.is_adapter_directory(directory) and not os.path.isfile(os.path.join(directory, "config.json")):
                adapter, base = directory, adapters.base_model_name(directory)
        config, weights = _read_checkpoint(base)
        if adapter is not None:
            adapter_config, adapter_weights = adapters.read_adapter(checkpoint_directory(adapter, "from_huggingface"))
    _check_model_type(config)
    if adapter_config is not None:
        num_classes = adapters.check_weights(adapter_weights, num_classes)
        weights = {**weights, **adapter_weights}
    model, w = convert_checkpoint(config, weights, num_classes)
    if adapter_config is not None:
        adapters.enable_adapter(model, w, adapter_config)
    return model


def convert_checkpoint(config: dict, weights: dict, num_classes: int | None = None):
    """(model, the WeightReader that filled it) for a checkpoint's config and weights: the reader
    records which layers each linear module became."""
    _check_model_type(config)
    convert, prefixes, rename = _CONVERTERS[config["model_type"]]
    w = WeightReader({rename(name): value for name, value in weights.items()}, prefixes)
    return convert(config, w, num_classes), w


# what a checkpoint's tokenizer and image processor read, beside its config and weights
_PROCESSOR_FILES = re.compile(
    r"(tokenizer.*\.json|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|"
    r"merges\.txt|.*\.spm|.*\.model|preprocessor_config\.json|generation_config\.json)"
)


# weight files `from_pretrained` could read instead of the model.safetensors written here
_OTHER_WEIGHTS = re.compile(
    r"(pytorch_model.*\.bin|model-.*\.safetensors|.*\.index\.json|tf_model\.h5|"
    r"flax_model\.msgpack|adapter_model\..*)"
)


def save_huggingface(
    model, directory: str, tokenizer_from=None, labels=None, image_preprocessing: tuple | None = None
) -> None:
    """Writes a keras_tfm model as a Hugging Face checkpoint directory (`config.json` and
    `model.safetensors`) that `transformers`' `from_pretrained` loads with the same outputs:
    `GPT` as `GPT2LMHeadModel`, `BertMLM` as `BertForMaskedLM`, `BertClassifier` as
    `BertForSequenceClassification`, `Bert` as `BertModel`, `ViT` as `ViTForImageClassification`
    (`ViTModel` with `include_top=False`), `Translator` as `MarianMTModel`. A model with LoRA enabled
    is written with its pairs merged into the kernels (`save_peft_adapter` writes the pairs alone).
    `from_huggingface(directory)` gives the model back. Needs only NumPy and `safetensors`.

    Refused by name: what the Hugging Face model cannot compute (a pre-norm `Translator`, whose
    Marian counterpart is post-norm; a ViT with mean pooling or sinusoidal positions; an activation
    it has no name for), quantized models (their int8 tables are not a `transformers` format), and a
    directory that holds other weight files, which `from_pretrained` could read instead (its own
    `config.json` and `model.safetensors` are overwritten).
    `tokenizer_from`: a checkpoint (directory or Hub id) whose tokenizer, image processor and
    generation files to copy beside the weights, for a model fine-tuned from it: then
    `transformers.pipeline(task, directory)` works. keras_tfm's own tokenizers are not converted.
    `labels`: a classifier's class names, in the order of its outputs (default: LABEL_0, ...), which
    transformers' `id2label` gives back (a pipeline's predictions name them).
    `image_preprocessing`: for a ViT, `(side, layers)`: raw 0-255 pixels resized to `side`, then
    given to Keras `layers` (center crop, rescaling, normalisation), as `image_preprocessing(checkpoint)`
    returns them; written as the checkpoint's image processor (replacing one from `tokenizer_from`).
    A ViT fine-tuned on images of another size than its `image_size` is written at that size, with
    its positions resized as it used them: transformers then needs no `interpolate_pos_encoding`.

    Example:
    >>> model = keras_tfm.gpt_shakespeare_char(vocabulary_size=65)
    >>> model.fit(...)
    >>> keras_tfm.save_huggingface(model, "shakespeare-gpt")
    >>> transformers.GPT2LMHeadModel.from_pretrained("shakespeare-gpt")   # the same logits
    >>> keras_tfm.save_huggingface(tuned_gpt2, "gpt2-tuned", tokenizer_from="gpt2")
    >>> keras_tfm.save_huggingface(vit, "digits-vit", image_preprocessing=(28, [keras.layers.Rescaling(1 / 255)]))
    >>> transformers.pipeline("image-classification", "digits-vit")(image)
    """
    import shutil

    from safetensors.numpy import save_file

    export = next((fn for model_class, fn in _EXPORTERS.items() if type(model) is model_class), None)
    if export is None:
        raise TypeError(
            f"save_huggingface: expected a keras_tfm model ({', '.join(c.__name__ for c in _EXPORTERS)}); "
            f"received a {type(model).__name__}."
        )
    quantized = sorted({layer.quantization_mode for layer in sublayers(model) if layer.quantization_mode})
    if quantized:
        raise ValueError(
            f"save_huggingface: {model.name!r} is quantized ({', '.join(quantized)}); Hugging Face "
            "checkpoints hold float weights. Save the model before quantize(), or its .keras file."
        )
    stale = (
        sorted(name for name in os.listdir(directory) if _OTHER_WEIGHTS.fullmatch(name))
        if os.path.isdir(directory)
        else []
    )
    if stale:
        raise FileExistsError(
            f"save_huggingface: {os.fspath(directory)!r} already holds other weights ({', '.join(stale)}), "
            "which transformers could load instead of these; write into an empty directory."
        )
    source = checkpoint_directory(tokenizer_from, "save_huggingface") if tokenizer_from is not None else None
    model._build_on_demand()
    options = {} if image_preprocessing is None else {"image_preprocessing": image_preprocessing}
    if options and "image_preprocessing" not in inspect.signature(export).parameters:
        raise ValueError(f"save_huggingface: image_preprocessing is for ViT models; received a {type(model).__name__}.")
    w = WeightWriter()
    config = export(model, w, **options)
    num_labels = config.pop("num_labels", None)
    if labels is not None and (num_labels is None or len(labels) != num_labels):
        expected = f"{num_labels} class names" if num_labels else "no labels: not a classifier"
        raise ValueError(f"save_huggingface: labels: expected {expected}; received {len(labels)}.")
    if num_labels:
        labels = [str(label) for label in labels] if labels is not None else [f"LABEL_{i}" for i in range(num_labels)]
        config.update(id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    os.makedirs(directory, exist_ok=True)
    for name in sorted(os.listdir(source)) if source else []:
        if _PROCESSOR_FILES.fullmatch(name):
            shutil.copyfile(os.path.join(source, name), os.path.join(directory, name))
    for name, content in {**w.files, "config.json": config}.items():
        with open(os.path.join(directory, name), "w") as f:
            json.dump(content, f, indent=2, sort_keys=True)
    save_file(w.weights, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


# Hugging Face's activation names (`ACT2FN`) -> Keras'; the first name of each Keras activation is the
# one written to a checkpoint.
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_approximate",
    "gelu_pytorch_tanh": "gelu_approximate",
    "relu": "relu",
    "swish": "silu",
    "silu": "silu",
}


def hugging_face_activation(model_type: str, activation: str) -> str:
    """The checkpoint's name for a Keras activation: the first name in `ACTIVATIONS` that gives it."""
    for name, keras_name in ACTIVATIONS.items():
        if keras_name == activation:
            return name
    raise ValueError(
        f"save_huggingface: {model_type} has no activation for {activation!r}; supported: "
        f"{sorted(set(ACTIVATIONS.values()))}."
    )


class WeightWriter:
    """Collects a model's arrays under checkpoint names (what a converter's `WeightReader` reads) and
    the checkpoint's other files."""

    def __init__(self):
        self.weights: dict[str, np.ndarray] = {}
        self.files: dict[str, dict] = {}  # other JSON files of the checkpoint, by name (a ViT's image processor)

    def __setitem__(self, name: str, value) -> None:
        self.weights[name] = np.ascontiguousarray(keras.ops.convert_to_numpy(value), dtype="float32")

    def linear(self, name: str, *dense_layers, transpose: bool = True) -> None:
        """Writes `dense_layers` as the linear module `name`, joined along the outputs where there
        are several (`WeightReader.linear`'s inverse). LoRA pairs are merged: `Dense.kernel` adds them."""
        kernel = np.concatenate([keras.ops.convert_to_numpy(dense.kernel) for dense in dense_layers], axis=1)
        self[name + ".weight"] = kernel.T if transpose else kernel
        if dense_layers[0].use_bias:
            self[name + ".bias"] = np.concatenate([keras.ops.convert_to_numpy(dense.bias) for dense in dense_layers])

    def layer_norm(self, name: str, norm) -> None:
        self[name + ".weight"], self[name + ".bias"] = norm.gamma, norm.beta


def _read_checkpoint(model_or_directory) -> tuple[dict, dict]:
    """(config, weights) of a transformers model, a checkpoint directory or a Hub model id."""
    if isinstance(model_or_directory, (str, os.PathLike)):
        directory = checkpoint_directory(model_or_directory)
        return read_config(directory), _read_weights(directory)
    if hasattr(model_or_directory, "state_dict") and hasattr(model_or_directory, "config"):
        weights = {k: v.detach().float().cpu().numpy() for k, v in model_or_directory.state_dict().items()}
        return model_or_directory.config.to_dict(), weights
    raise TypeError(
        "from_huggingface expects a transformers model or a directory path; received "
        f"{type(model_or_directory).__name__}."
    )


class WeightReader:
    """Hands out checkpoint arrays by name, so a converter can check at the end that it used them all.
    `linear` and `layer_norm` are also `WeightWriter`'s: code that names a model's modules serves both ways."""

    def __init__(self, weights: dict, prefixes: tuple[str, ...] = ()):
        self.weights = weights
        self.prefixes = prefixes
        self.used: set[str] = set()
        self.linear_layers: dict[str, list] = {}  # checkpoint module name -> the Dense layers made from it
        self.lora_pairs: dict[str, tuple] = {}  # module name -> its (lora_A, lora_B) from a peft adapter

    def __call__(self, name: str) -> np.ndarray:
        for prefix in ("",) + self.prefixes:
            if prefix + name in self.weights:
                self.used.add(prefix + name)
                return np.asarray(self.weights[prefix + name], "float32")
        raise KeyError(f"from_huggingface: checkpoint has no weight {name!r} (prefixes tried: {self.prefixes}).")

    def __contains__(self, name: str) -> bool:
        return any(prefix + name in self.weights for prefix in ("",) + self.prefixes)

    def linear(self, name: str, *dense_layers, transpose: bool = True) -> None:
        """Sets `dense_layers` from the checkpoint's linear module `name` (`name.weight`, and
        `name.bias` where it has one), split evenly along its outputs where it feeds several (GPT-2's
        fused query/key/value). `transpose`: PyTorch `Linear` weights are (out, in), Keras kernels
        (in, out); GPT-2's `Conv1D` is stored (in, out) already. Records where the module went,
        and takes its LoRA pair where the weights include a peft adapter's."""
        kernel = self(name + ".weight")
        kernel = kernel.T if transpose else kernel
        bias = self(name + ".bias") if name + ".bias" in self else None
        splits = len(dense_layers)
        for dense, part, part_bias in zip(
            dense_layers,
            np.split(kernel, splits, axis=1),
            np.split(bias, splits) if bias is not None else [None] * splits,
        ):
            set_dense(dense, part, part_bias)
        self.linear_layers[name] = list(dense_layers)
        if name + ".lora_A.weight" in self:
            self.lora_pairs[name] = (self(name + ".lora_A.weight"), self(name + ".lora_B.weight"))

    def layer_norm(self, name: str, norm) -> None:
        set_layer_norm(norm, self(name + ".weight"), self(name + ".bias"))

    def unused(self, ignore: Callable[[str], bool] = lambda name: False) -> list[str]:
        return sorted(k for k in self.weights if k not in self.used and not ignore(k))

    def check_all_used(self, caller: str, model_type: str, ignore: Callable[[str], bool] = lambda name: False) -> None:
        """Refuses a checkpoint with weights the converter did not take (but those `ignore` names):
        a model made without them would compute something else."""
        leftover = self.unused(ignore)
        if leftover:
            raise ValueError(f"{caller}: {model_type} weights not converted: {leftover[:5]}")


def require_options(model_type: str, config: dict, caller: str = "from_huggingface", **computed) -> None:
    """Refuses a checkpoint whose config sets an option that changes the computation to another
    value than the one keras_tfm computes (`computed`: field -> that value, the default of
    transformers or keras-hub); loading it anyway would give other outputs without a word."""
    for field, value in computed.items():
        received = config.get(field, value)
        if received != value:
            raise ValueError(
                f"{caller}: {model_type} checkpoints with {field}={received!r} are not supported; "
                f"keras_tfm computes what {field}={value!r} gives."
            )


def no_classifier(model_type: str, num_classes: int | None) -> None:
    """Refuses `num_classes` for a checkpoint that is not turned into a classifier."""
    if num_classes is not None:
        raise ValueError(
            f"from_huggingface: num_classes applies to ViT and BERT checkpoints; this is a {model_type} "
            f"checkpoint (received num_classes={num_classes})."
        )


def set_dense(dense, kernel: np.ndarray, bias: np.ndarray | None = None) -> None:
    dense.set_weights([kernel] if bias is None else [kernel, bias])


def set_layer_norm(norm, gamma: np.ndarray, beta: np.ndarray) -> None:
    norm.set_weights([gamma, beta])


# Importing registers the converters.
from keras_tfm.convert import bert, gpt2, marian, vit  # noqa: E402,F401
