"""`from_huggingface`: build the matching keras_tfm model and copy a Hugging Face model's weights;
`save_huggingface`: the other way, a keras_tfm model as a checkpoint that `transformers` loads.

Takes an in-memory `transformers` model (PyTorch), a local directory with `config.json` and
`model.safetensors` / `pytorch_model.bin` (or their shards and `.index.json`), or a Hugging Face Hub
model id, whose files `huggingface_hub` keeps in its local cache. Reading a directory needs no
`transformers` and no network; converting weights needs only NumPy. Each model type's file
(`gpt2.py`, ...) holds its converter and its exporter, the same names in both directions; it
registers them in `registry.py`, reads arrays with `weights.py`'s `WeightReader` (and writes them
with its `WeightWriter`); `files.py` finds and reads the checkpoint's files.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import json
import os

import keras

from keras_tfm.compat import sublayers

# Importing each model type's module registers its converter and exporter.
from keras_tfm.convert import (  # noqa: F401
    adapters,
    bert,
    clip,
    dinov2,
    dpt,
    gpt2,
    llama,
    marian,
    modern_bert,
    quantized_loading,
    safetensors_files,
    segformer,
    sentence_transformers,
    siglip,
    vit,
    vit_mae,
    yolos,
)
from keras_tfm.convert.config import checkpoint_config
from keras_tfm.convert.destination import PROCESSOR_FILES, check_destination, swap_in
from keras_tfm.convert.files import checkpoint_directory, read_checkpoint, read_json
from keras_tfm.convert.registry import check_model_type, convert_checkpoint, exported_classes, exporter_of
from keras_tfm.convert.variables import return_freed_memory
from keras_tfm.convert.weights import WeightWriter
from keras_tfm.errors import CheckpointError, InputError

END_FIELDS = ("eos_token_id", "pad_token_id")
# what the server takes as a request's defaults (vLLM reads the same from generation_config.json)
SAMPLING_FIELDS = ("do_sample", "temperature", "top_p", "repetition_penalty", "max_new_tokens")


def generation_settings(directory: str) -> dict | None:
    """What `generate` and the server take from a checkpoint's `generation_config.json`: its end ids
    (`eos_token_id`, one or several: Llama 3 Instruct and Qwen stop at either of two), `pad_token_id`,
    and its sampling settings (`SAMPLING_FIELDS`); None without one."""
    path = os.path.join(directory, "generation_config.json")
    if not os.path.isfile(path):
        return None
    return _generation_fields(read_json(path, "from_huggingface"), repr(path), END_FIELDS + SAMPLING_FIELDS)


def _generation_fields(config: dict, where: str, fields: tuple = END_FIELDS) -> dict | None:
    """The `fields` of a generation config (a JSON object or transformers' `GenerationConfig.to_dict()`)
    that it sets, each checked: end ids a token id or a list of them, the sampling settings numbers."""
    checked = checkpoint_config(config, where)
    settings = {key: checked[key] for key in fields if checked.get(key) is not None}
    return settings or None


def _in_memory_generation_settings(model) -> dict | None:
    """The end ids of an in-memory transformers model (or a PeftModel's base), as a directory's
    `generation_config.json` gives them: what its `generate` stops at."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    generation_config = getattr(base, "generation_config", None)
    if generation_config is None or not callable(getattr(generation_config, "to_dict", None)):
        return None
    return _generation_fields(
        generation_config.to_dict(), "the model's generation settings (`model.generation_config`)"
    )


# keras-hub's task models fine-tune at 5e-5 by default too; 1e-3 (from scratch) would wreck a checkpoint.
FINE_TUNING_LEARNING_RATE = 5e-5


def from_huggingface(
    model_or_directory,
    num_classes: int | None = None,
    adapter=None,
    allow_nan: bool = False,
    dtype: str | None = None,
    quantize: str | None = None,
):
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
        allow_nan: load weights that hold NaN or infinite values (a damaged checkpoint, or one saved
            from a diverged run); by default such a checkpoint is refused, naming the weight.
        dtype: the model's dtype policy, its weights' and its computations' dtype: None (default), the
            global policy (`keras.config.set_dtype_policy`: float32 unless set, so `"mixed_bfloat16"` there
            gives a model that trains in mixed precision); "float32", "bfloat16", "float16",
            "mixed_float16", "mixed_bfloat16"; or "auto", the checkpoint's own (its config's
            `torch_dtype`, else what most of its weights are stored in). Weights are read one at a time from safetensors
            files and made this dtype as they are set, so a bfloat16 checkpoint loaded in bfloat16
            never holds a float32 copy of itself.
        quantize: "int8" or "int4": the model comes quantized, as `model.quantize(quantize)` after a float
            load would make it (the same values), without ever holding the float model: its dense
            layers and embeddings are built quantized, and each is set from its float weights alone
            (`dtype` is then the float dtype of the rest: norms, and the computations). None: float.

    A checkpoint read from a directory or Hub id comes with its tokenizer as `model.tokenizer`
    (`keras_tfm.data.checkpoint_tokenizer`: its `tokenizer.json`, GPT-2's `vocab.json` and
    `merges.txt`, or BERT's `vocab.txt`), so that `generate` takes and returns text. A model with a
    task comes compiled for fine-tuning: its default loss and metric, AdamW at 5e-5.

    Supported: BERT (`BertModel` without its pooler, `BertForMaskedLM`, `BertForPreTraining`, the
    layout of the published BERT checkpoints, as a `BertMLM` without its next-sentence head,
    `BertForSequenceClassification`, `BertForTokenClassification`, `BertForQuestionAnswering`; the same of
    RoBERTa, XLM-RoBERTa and DistilBERT, as a `Bert` with `position_offset` or without segments), GPT-2
    (`GPT2Model`, `GPT2LMHeadModel`), Llama, Mistral, Qwen2 and Qwen3 (`*Model`, `*ForCausalLM`, as a `DecoderLM`), Marian (`MarianMTModel`), ViT (`ViTModel` without
    its pooler, as `include_top=False`, and `ViTForImageClassification`), DeiT and DINOv2 (their models and
    classifiers, as a `ViT`), ModernBERT, CLIP (`CLIPModel`, as a `CLIP`) and its
    vision tower (`CLIPVisionModel`, as a `ViT`), SigLIP and SigLIP 2 at fixed resolution (`SiglipModel`, as a
    `SigLIP`) and its vision tower (`SiglipVisionModel`, as a `ViT`). A sentence-transformers
    directory (its `modules.json`: a BERT `Transformer`, `Pooling`, `Normalize`) gives a
    `SentenceEmbedder`, whose `embed(texts)` gives the vectors sentence-transformers' `encode` gives.

    Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=100))
    >>> model = keras_tfm.from_huggingface(hf)  # a keras_tfm.GPT with the same logits
    >>> hf.save_pretrained("tiny-gpt2")
    >>> model = keras_tfm.from_huggingface("tiny-gpt2")  # a directory, or a Hub id such as "gpt2"

    A Hub id goes through the local cache (`from_huggingface("gpt2")`), `num_classes=10` gives a ViT
    or BERT checkpoint a new head to fine-tune, and `adapter="path/to/peft_adapter"` adds a peft
    adapter's LoRA pairs.
    """
    dtype = resolved_dtype(dtype, "from_huggingface")
    _check_arguments(num_classes, allow_nan, dtype, quantize, adapter)
    if isinstance(model_or_directory, (str, os.PathLike)) and adapter is None and num_classes is None:
        directory = checkpoint_directory(model_or_directory)
        if sentence_transformers.is_sentence_transformers(directory):
            load = functools.partial(
                _from_checkpoint, adapter=None, allow_nan=allow_nan, dtype=dtype, quantize=quantize
            )
            return sentence_transformers.from_sentence_transformers(directory, load)
    return _from_checkpoint(model_or_directory, num_classes, adapter, allow_nan, dtype, quantize)


def _from_checkpoint(model_or_directory, num_classes=None, adapter=None, allow_nan=False, dtype=None, quantize=None):
    """`from_huggingface` of a transformers checkpoint, its arguments checked."""
    config, weights, adapter_config, adapter_weights, base = _checkpoint_parts(model_or_directory, adapter)
    if adapter_config is not None:
        num_classes = adapters.check_weights(adapter_weights, num_classes)
        weights = collections.ChainMap(adapter_weights, weights)  # read lazily: no copy of the checkpoint
    dtype = checkpoint_dtype(config, weights, model_or_directory) if dtype == "auto" else dtype
    check_room(weights, quantize or dtype)
    with dtype_policy(dtype):
        model, w = convert_checkpoint(config, weights, num_classes, allow_nan, quantize)
    return_freed_memory()
    if adapter_config is not None:
        adapters.enable_adapter(model, w, adapter_config)
    _attach_generation_settings(model, base if isinstance(base, (str, os.PathLike)) else None, model_or_directory)
    if model.compiled:  # pretrained weights: the models' default AdamW, at a fine-tuning rate
        model.compile(optimizer=keras.optimizers.AdamW(FINE_TUNING_LEARNING_RATE))
    return model


DTYPES = ("float32", "bfloat16", "float16", "mixed_float16", "mixed_bfloat16", "auto")
# per value: what a load needs (mixed precision keeps float32 variables)
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "mixed_float16": 4, "mixed_bfloat16": 4, "int8": 1, "int4": 0.5}


def resolved_dtype(dtype: str | None, caller: str) -> str:
    """`dtype`, or the global dtype policy's name for None (what a model made now would take)."""
    if dtype is None:
        return keras.config.dtype_policy().name
    if not isinstance(dtype, str):
        raise InputError(f"expected one of {', '.join(DTYPES)} or None; received {dtype!r}.", "dtype", caller=caller)
    return dtype


# what to load instead when a dtype does not fit
SMALLER = {
    "float32": " (or dtype='bfloat16', half of it, or quantize='int8', a quarter)",
    "mixed_bfloat16": " (or dtype='bfloat16', half of it, or quantize='int8', a quarter)",
    "mixed_float16": " (or dtype='float16', half of it, or quantize='int8', a quarter)",
    "bfloat16": " (or quantize='int8', half of it)",
    "float16": " (or quantize='int8', half of it)",
}


def _check_arguments(num_classes, allow_nan, dtype, quantize, adapter) -> None:
    """Refuses `from_huggingface`'s options that are not what they should be, naming them."""
    if num_classes is not None and (
        isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
    ):
        raise InputError(
            f"num_classes must be a positive integer or None; received {num_classes!r}.", caller="from_huggingface"
        )
    if not isinstance(allow_nan, bool):
        raise InputError(f"expected True or False; received {allow_nan!r}.", "allow_nan", caller="from_huggingface")
    if dtype not in DTYPES:
        raise InputError(
            f"expected one of {', '.join(DTYPES)}; received {dtype!r}.", "dtype", caller="from_huggingface"
        )
    quantized_loading.check_mode(quantize, "from_huggingface")
    if quantize is not None and (num_classes is not None or adapter is not None):
        raise InputError(
            f"quantize={quantize!r} with {'num_classes' if num_classes is not None else 'adapter'}: a new "
            "head or an adapter's pairs are float weights to train; load without `quantize` (then "
            "`model.quantize(...)` quantizes what exists).",
            "quantize",
            caller="from_huggingface",
        )


def check_room(weights, dtype: str, caller: str = "from_huggingface") -> None:
    """Refuses, before anything is built, a checkpoint whose weights in `dtype` (or quantized: "int8",
    "int4") need more memory than the system has available (a load that would end in the out-of-memory
    killer, or in swap)."""
    files = weights.maps[-1] if isinstance(weights, collections.ChainMap) else weights
    available = safetensors_files.available_memory()
    if not hasattr(files, "values_count") or available is None:
        return
    needed = int(files.values_count() * BYTES[dtype])
    if needed > available:
        raise CheckpointError(
            f"the checkpoint's weights need {needed / 2**30:.1f} GiB as {dtype}, and this machine has "
            f"{available / 2**30:.1f} GiB of memory available: free some{SMALLER.get(dtype, '')}.",
            "quantize" if dtype in quantized_loading.MODES else "dtype",
            caller=caller,
        )


@contextlib.contextmanager
def dtype_policy(dtype: str):
    """Models made in this block take `dtype` as their dtype policy (their layers keep it after)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def checkpoint_dtype(config: dict, weights, model) -> str:
    """The dtype a checkpoint was saved in: its config's `torch_dtype` (or `dtype`), else the storage
    dtype of most of its weights (safetensors files), else float32."""
    named = config.get("torch_dtype") or config.get("dtype")
    if hasattr(model, "parameters"):  # a transformers model in memory
        named = str(next(model.parameters()).dtype).removeprefix("torch.")
    if named in ("float32", "bfloat16", "float16"):
        return named
    files = getattr(weights, "paths", None) or getattr(getattr(weights, "maps", [None])[-1], "paths", None)
    return safetensors_files.checkpoint_dtype(files) if files else "float32"


def _checkpoint_parts(model_or_directory, adapter) -> tuple:
    """(config, weights, adapter config, adapter weights, the base checkpoint) of a transformers model,
    a PeftModel, a directory or Hub id, with a peft adapter's where one is given or found."""
    if adapters.is_peft_model(model_or_directory):
        if adapter is not None:
            raise InputError(
                f"received a PeftModel, which holds its adapter, and adapter={adapter!r}; pass one of them.",
                caller="from_huggingface",
            )
        return (*adapters.peft_model_parts(model_or_directory), None)
    base, adapter_config, adapter_weights = model_or_directory, None, None
    if isinstance(base, (str, os.PathLike)) and adapter is None:
        directory = checkpoint_directory(base)
        if adapters.is_adapter_directory(directory) and not os.path.isfile(os.path.join(directory, "config.json")):
            adapter, base = directory, adapters.base_model_name(directory)
    config, weights = read_checkpoint(base)
    if adapter is not None:
        adapter_config, adapter_weights = adapters.read_adapter(checkpoint_directory(adapter, "from_huggingface"))
    check_model_type(config)
    return config, weights, adapter_config, adapter_weights, base


def _attach_generation_settings(model, directory, in_memory) -> None:
    """A checkpoint directory's tokenizer, end ids and image processor on `model`; an in-memory model's end
    ids."""
    if directory is None:  # an in-memory model stops where its `generate` stops
        model.generation_config = _in_memory_generation_settings(in_memory)
        return
    from keras_tfm.data.tokenizers import checkpoint_tokenizer

    directory = checkpoint_directory(directory)
    tokenizer = checkpoint_tokenizer(directory)
    check_tokenizer_fits(model, tokenizer, directory)
    model.tokenizer = tokenizer
    model.generation_config = generation_settings(directory)
    from keras_tfm.data.image_processing import ImageProcessor

    model.image_processor = ImageProcessor.from_huggingface(directory)


def check_tokenizer_fits(model, tokenizer, directory: str) -> None:
    """Refuses a checkpoint whose tokenizer makes ids the model has no embedding for."""
    limit = getattr(model, "vocabulary_size", None)  # a translator's two tables: each side's tokenizer
    if tokenizer is not None and isinstance(limit, int) and tokenizer.vocabulary_size > limit:
        size = tokenizer.vocabulary_size
        raise CheckpointError(
            f"the tokenizer in {directory!r} has {size:,} tokens, more than the "
            f"{limit:,} embeddings of its model (config.json's vocab_size): its ids past {limit - 1} have no "
            "embedding. The tokenizer files belong to another checkpoint; restore this checkpoint's own.",
            caller="from_huggingface",
        )


def save_huggingface(
    model,
    directory: str,
    tokenizer_from=None,
    labels=None,
    image_preprocessing: tuple | None = None,
    overwrite: bool = False,
) -> None:
    """Writes a keras_tfm model as a Hugging Face checkpoint directory (`config.json` and
    `model.safetensors`) that `transformers`' `from_pretrained` loads with the same outputs:
    `GPT` as `GPT2LMHeadModel`, `DecoderLM` as `LlamaForCausalLM` (`MistralForCausalLM` with a sliding
    window, `Qwen2ForCausalLM` with query/key/value biases, `Qwen3ForCausalLM` with QK-norm),
    `BertMLM` as `BertForMaskedLM`, `BertClassifier` as
    `BertForSequenceClassification`, `BertTokenClassifier` and `BertQuestionAnswerer` as
    `BertForTokenClassification` and `BertForQuestionAnswering`, `Bert` as `BertModel`, a `SentenceEmbedder` as
    a sentence-transformers directory, `ViT` as `ViTForImageClassification`
    (`ViTModel` with `include_top=False`), `Translator` as `MarianMTModel`. A model with LoRA enabled
    is written with its pairs merged into the kernels (`save_peft_adapter` writes the pairs alone).
    `from_huggingface(directory)` gives the model back. Needs only NumPy and `safetensors`.

    Refused by name: what the Hugging Face model cannot compute (a pre-norm `Translator`, whose
    Marian counterpart is post-norm; a ViT with mean pooling or sinusoidal positions; an activation
    it has no name for), quantized models (their int8 tables are not a `transformers` format), and a
    `directory` that already holds files (another checkpoint, whose tokenizer or weights would be left
    beside these) unless `overwrite=True`: the checkpoint files there (config, weights, tokenizer and
    generation files) are then replaced, and a directory holding anything else (a sub-folder, a file no
    checkpoint has) is still refused, naming what it holds. The checkpoint is written beside it first and
    moved in when complete, so a failure leaves the old one as it was.
    `tokenizer_from`: a checkpoint (directory or Hub id) whose tokenizer, image processor and
    generation files to copy beside the weights, for a model fine-tuned from it: then
    `transformers.pipeline(task, directory)` works. Without it, the model's own tokenizer
    (`model.tokenizer`, where it can write itself for transformers: `tokenizer.json` with its chat
    template, GPT-2's or BERT's files) and its generation settings (`model.generation_config`) are
    written.
    `labels`: a classifier's class names, in the order of its outputs (default: LABEL_0, ...), which
    transformers' `id2label` gives back (a pipeline's predictions name them).
    `image_preprocessing`: for a ViT, `(side, layers)`: raw 0-255 pixels resized to `side`, then
    given to Keras `layers` (center crop, rescaling, normalisation), as `image_preprocessing(checkpoint)`
    returns them; written as the checkpoint's image processor (replacing one from `tokenizer_from`).
    A ViT fine-tuned on images of another size than its `image_size` is written at that size, with
    its positions resized as it used them: transformers then needs no `interpolate_pos_encoding`.

    Example:
    >>> import transformers
    >>> model = keras_tfm.gpt_shakespeare_char_cpu(num_layers=1)
    >>> keras_tfm.save_huggingface(model, "shakespeare-gpt")
    >>> hf = transformers.GPT2LMHeadModel.from_pretrained("shakespeare-gpt")  # the same logits
    >>> vit = keras_tfm.vit_tiny(image_size=28, patch_size=7, num_channels=1, num_classes=10, num_layers=1)
    >>> keras_tfm.save_huggingface(vit, "digits-vit", image_preprocessing=(28, [keras.layers.Rescaling(1 / 255)]))
    >>> classify = transformers.pipeline("image-classification", "digits-vit")  # raw pixels in, labels out

    A model fine-tuned from a checkpoint takes that checkpoint's tokenizer along:
    `save_huggingface(tuned, "gpt2-tuned", tokenizer_from="gpt2")`.
    """
    import shutil

    check_destination(directory, overwrite)
    source = checkpoint_directory(tokenizer_from, "save_huggingface") if tokenizer_from is not None else None
    w = WeightWriter()
    config = _exported_config(model, w, labels, image_preprocessing)
    staging = f"{os.path.abspath(directory)}.writing-{os.getpid()}"  # beside it, never inside (directory=".")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    try:
        _write_checkpoint(model, staging, source, w, config)
        swap_in(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _exported_config(model, w: WeightWriter, labels, image_preprocessing) -> dict:
    """The checkpoint's `config.json` (with a classifier's class names), its arrays written into `w`."""
    export = exporter_of(model)
    if export is None:
        raise InputError(
            f"expected a keras_tfm model ({', '.join(exported_classes())}); received a {type(model).__name__}.",
            caller="save_huggingface",
        )
    quantized = sorted({layer.quantization_mode for layer in sublayers(model) if layer.quantization_mode})
    if quantized:
        raise InputError(
            f"{model.name!r} is quantized ({', '.join(quantized)}); Hugging Face "
            "checkpoints hold float weights. Save the model before quantize(), or its .keras file.",
            caller="save_huggingface",
        )
    if not model.built:
        model.build()
    options = {} if image_preprocessing is None else {"image_preprocessing": image_preprocessing}
    if options and "image_preprocessing" not in inspect.signature(export).parameters:
        raise InputError(
            f"image_preprocessing is for ViT models; received a {type(model).__name__}.", caller="save_huggingface"
        )
    config = {**export(model, w, **options), "torch_dtype": stored_dtype(model)}  # transformers' name for it
    num_labels = config.pop("num_labels", None)
    labels = labels if labels is not None else getattr(model, "class_names", None)
    if labels is not None and (num_labels is None or len(labels) != num_labels):
        expected = f"{num_labels} class names" if num_labels else "no labels: not a classifier"
        raise InputError(f"labels: expected {expected}; received {len(labels)}.", caller="save_huggingface")
    if num_labels:
        labels = [str(label) for label in labels] if labels is not None else [f"LABEL_{i}" for i in range(num_labels)]
        config.update(id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    return config


def _write_checkpoint(model, directory: str, source: str | None, w: WeightWriter, config: dict) -> None:
    """The checkpoint's files in `directory`: the processor files of `source` (or the model's own
    tokenizer and generation settings), the JSON files, the weights."""
    import shutil

    processor = getattr(model, "image_processor", None)  # the model's own (a resize changed), not the source's
    for name in sorted(os.listdir(source)) if source else []:
        if PROCESSOR_FILES.fullmatch(name) and not (processor is not None and name == "preprocessor_config.json"):
            shutil.copyfile(os.path.join(source, name), os.path.join(directory, name))
    if source is None and getattr(model, "generation_config", None):  # its end ids, for transformers' generate
        w.files["generation_config.json"] = dict(model.generation_config)
    if processor is not None and "preprocessor_config.json" not in w.files:
        w.files["preprocessor_config.json"] = _processor_config(processor, source)
    for name, content in {**w.files, "config.json": config}.items():
        os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)  # a module's folder
        with open(os.path.join(directory, name), "w") as f:
            json.dump(content, f, indent=2, sort_keys=True)
    if source is None and model.tokenizer is not None and model.tokenizer.writes_huggingface():
        model.tokenizer.save_huggingface(directory)  # the model's own tokenizer, where transformers can read it
    safetensors_files.write(w.weights, os.path.join(directory, "model.safetensors"), stored_dtype(model))
    for folder, module in w.module_weights.items():
        safetensors_files.write(
            module.weights, os.path.join(directory, folder, "model.safetensors"), stored_dtype(model)
        )


def _processor_config(processor, source: str | None) -> dict:
    """The processor's `preprocessor_config.json`: the source checkpoint's, its steps replaced by the model's
    (what else it holds, such as `processor_class`, kept)."""
    path = os.path.join(source, "preprocessor_config.json") if source else ""
    if not os.path.isfile(path):
        return processor.config()
    with open(path, encoding="utf-8") as file:
        written = json.load(file)
    kind = written.get("image_processor_type")
    return {**written, **processor.config(), **({"image_processor_type": kind} if kind else {})}


def stored_dtype(model) -> str:
    """The dtype a model's checkpoint is written in: its variables' (float32 under mixed precision)."""
    dtype = keras.backend.standardize_dtype(model.variable_dtype)
    return dtype if dtype in ("bfloat16", "float16") else "float32"
