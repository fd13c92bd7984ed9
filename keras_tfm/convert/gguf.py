"""`from_gguf`: a llama.cpp GGUF file (the format of llama.cpp, Ollama and LM Studio) as a keras_tfm
`DecoderLM`, with its tokenizer, chat template and end ids.

`gguf_file` maps the file and reads its header; the `gguf` package (llama.cpp's own) dequantizes its
tensors, each read, dequantized and set one at a time. The metadata becomes the Hugging Face config the Llama
family's converter reads (`llama.py`), and llama.cpp's tensor names its Hugging Face names: one
converter for both formats.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
from collections.abc import Iterator, Mapping

import numpy as np

from keras_tfm.convert import gguf_file
from keras_tfm.convert.config import checkpoint_config
from keras_tfm.errors import CheckpointError, InputError

# GGUF architecture -> the Hugging Face model type its tensors and metadata fill
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def from_gguf(path, dtype: str | None = None, allow_nan: bool = False, quantize: str | None = None):
    """A `DecoderLM` with the weights, tokenizer, chat template and end ids of a llama.cpp GGUF file.

    Args:
        path: a `.gguf` file of a Llama-architecture model (Llama, Mistral, SmolLM2, TinyLlama: GGUF
            architecture "llama"), a Qwen2 ("qwen2") or a Qwen3 ("qwen3"); one file, not split.
        dtype: the model's dtype policy: None (default), the global policy (float32 unless
            `keras.config.set_dtype_policy` says otherwise); "float32", "bfloat16", "float16",
            "mixed_float16" or "mixed_bfloat16". Quantized tensors
            (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the K-quants, ...) are dequantized one at a time as they are
            set, so memory holds the model in `dtype` and one tensor more, never the whole file's tensors.
        allow_nan: load weights that hold NaN or infinite values; by default refused, naming the weight.
        quantize: "int8" or "int4": the model comes quantized again in Keras' form, as
            `model.quantize(quantize)` after a float load would make it, without ever holding the float
            model: each layer is built quantized and set from its tensor dequantized alone, so memory
            holds the quantized model and about one float tensor more (`dtype` is then the float dtype
            of the rest). None: float.

    The tokenizer (`model.tokenizer`) is rebuilt from the file's vocabulary with Hugging Face
    `tokenizers` (byte-level BPE for Llama 3, Qwen and SmolLM2; SentencePiece BPE for Llama 2 and
    Mistral), with the file's chat template; generation stops at its end-of-sequence and end-of-turn
    tokens. `from_gguf(path).chat([...])` answers as transformers' `from_pretrained(..., gguf_file=...)`.
    Llama 3.1's RoPE scaling, which llama.cpp writes as per-frequency factors, is recognised and kept.

    Refused by name: another architecture, a tensor type the `gguf` package cannot dequantize, a file
    that is not GGUF, truncated or damaged, and weights larger than the memory available (from the
    file's tensor sizes, before anything is built).

    Example:
    >>> model = keras_tfm.from_gguf("SmolLM2-135M-Instruct-Q8_0.gguf")  # doctest: +SKIP
    >>> model.chat([{"role": "user", "content": "Hello"}], max_new_tokens=20)  # doctest: +SKIP
    """
    import keras

    from keras_tfm.convert import huggingface, quantized_loading, variables
    from keras_tfm.convert.registry import convert_checkpoint
    from keras_tfm.data.tokenizers.gguf import gguf_tokenizer

    dtype = huggingface.resolved_dtype(dtype, "from_gguf")
    if dtype not in huggingface.DTYPES or dtype == "auto":
        raise InputError(
            f"expected one of {', '.join(huggingface.DTYPES[:-1])} or None; received {dtype!r}.",
            "dtype",
            caller="from_gguf",
        )
    if not isinstance(allow_nan, bool):
        raise InputError(f"expected True or False; received {allow_nan!r}.", "allow_nan", caller="from_gguf")
    quantized_loading.check_mode(quantize, "from_gguf")
    tensors, metadata = read_gguf(path)
    config = gguf_config(metadata, {tensor.name for tensor in tensors})
    factors = next((t for t in tensors if t.name == "rope_freqs.weight"), None)
    if factors is not None:
        config["rope_scaling"] = llama3_rope_scaling(np.asarray(factors.data, np.float64), config)
    weights = GGUFWeights(tensors, config)
    huggingface.check_room(weights, quantize or dtype, "from_gguf")
    tokenizer = gguf_tokenizer(metadata)  # before the model: a tokenizer it cannot build is refused first
    if tokenizer is not None and tokenizer.vocabulary_size > config["vocab_size"]:
        raise CheckpointError(
            f"the file's tokenizer has {tokenizer.vocabulary_size:,} tokens, more than the model's "
            f"{config['vocab_size']:,} embeddings: the file is damaged.",
            "path",
            caller="from_gguf",
        )
    with huggingface.dtype_policy(dtype):
        model, _ = convert_checkpoint(config, weights, None, allow_nan, quantize)
    variables.return_freed_memory()
    model.tokenizer, model.generation_config = tokenizer, end_ids(metadata)
    if model.compiled:
        model.compile(optimizer=keras.optimizers.AdamW(huggingface.FINE_TUNING_LEARNING_RATE))
    return model


def read_gguf(path) -> tuple:
    """(tensors, metadata) of the GGUF file at `path`: its `gguf_file.GGUFTensor`s and its metadata as
    Python values (strings, numbers, lists). A missing, foreign, truncated or damaged file raises
    `CheckpointError` naming it."""
    try:
        import gguf  # noqa: F401  (its dequantizers read the tensors)
    except ImportError:
        raise InputError(
            "reading GGUF files needs the `gguf` package: pip install 'keras_tfm[gguf]'.", caller="from_gguf"
        ) from None
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise CheckpointError(f"no GGUF file at {path!r}.", "path", caller="from_gguf")
    with open(path, "rb") as file:
        magic = file.read(4)
    if magic != b"GGUF":
        raise CheckpointError(
            f"{os.fspath(path)!r} is not a GGUF file (it starts with {magic!r}, not b'GGUF').",
            "path",
            caller="from_gguf",
        )
    try:
        file = gguf_file.read(path)
    except Exception as error:  # ValueError, struct.error, UnicodeDecodeError, ... on a cut or damaged file
        raise CheckpointError(
            f"cannot read {os.fspath(path)!r}: the file is truncated or damaged ({type(error).__name__}: "
            f"{str(error)[:200]}). Download it again.",
            "path",
            caller="from_gguf",
        ) from None
    return file.tensors, file.metadata


def gguf_config(metadata: dict, tensor_names: set[str]) -> dict:
    """The Hugging Face config (`LlamaConfig`, `Qwen2Config` or `Qwen3Config` fields) a file's metadata
    states; an architecture other than these is refused by name."""
    architecture = metadata.get("general.architecture")
    if architecture not in ARCHITECTURES:
        raise CheckpointError(
            f"the file holds a {architecture!r} model; from_gguf reads {', '.join(ARCHITECTURES)} "
            "(Llama, Mistral, SmolLM2, Qwen2, Qwen3).",
            "path",
            caller="from_gguf",
        )

    def key(name: str, default=None):
        value = metadata.get(f"{architecture}.{name}", default)
        if value is None:
            raise CheckpointError(
                f"the file's metadata has no {architecture}.{name}: it is damaged or incomplete.", caller="from_gguf"
            )
        return value

    heads, hidden = key("attention.head_count"), key("embedding_length")
    for name, value in (("attention.head_count", heads), ("embedding_length", hidden)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(
                f"the file's {architecture}.{name} is {value!r:.80}; expected a positive integer: it is damaged.",
                "path",
                caller="from_gguf",
            )
    config = {
        "model_type": ARCHITECTURES[architecture],
        "vocab_size": metadata.get(f"{architecture}.vocab_size") or len(metadata.get("tokenizer.ggml.tokens") or ()),
        "max_position_embeddings": key("context_length"),
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": key("attention.key_length", hidden // heads),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
    }
    if not config["vocab_size"]:
        raise CheckpointError("the file states no vocabulary size and holds no tokens.", caller="from_gguf")
    scaling = metadata.get(f"{architecture}.rope.scaling.type")
    if scaling in ("linear", "yarn"):
        config["rope_scaling"] = {"rope_type": scaling, "factor": float(key("rope.scaling.factor"))}
        if scaling == "yarn":
            original = key("rope.scaling.original_context_length")
            config["rope_scaling"]["original_max_position_embeddings"] = original
    elif scaling not in (None, "none"):
        raise CheckpointError(f"the file's RoPE scaling {scaling!r} is not supported.", caller="from_gguf")
    if config["model_type"] == "qwen2" and config["attention_bias"] is False:
        raise CheckpointError("a qwen2 file without query/key/value biases is damaged.", caller="from_gguf")
    return checkpoint_config(config, "the file's metadata")


def llama3_rope_scaling(factors: np.ndarray, config: dict) -> dict:
    """The Hugging Face `rope_scaling` of Llama 3.1 and later, which llama.cpp writes as the tensor
    `rope_freqs.weight` (one factor per frequency): recognised among the published settings."""
    dimension = config["head_dim"]
    frequencies = 1.0 / config["rope_theta"] ** (np.arange(0, dimension, 2, dtype=np.float64) / dimension)
    for factor in (8.0, 32.0, 16.0, 4.0):
        for original in (8192, 4096, 2048):
            candidate = {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": original,
            }
            if np.allclose(_llama3_factors(frequencies, candidate), factors, rtol=1e-4):
                return candidate
    raise CheckpointError(
        "the file's rope_freqs.weight (per-frequency RoPE factors) matches none of Llama 3's settings; "
        "such a model is not supported.",
        caller="from_gguf",
    )


def _llama3_factors(frequencies: np.ndarray, scaling: dict) -> np.ndarray:
    """What llama.cpp's converter writes as `rope_freqs.weight` for a Llama 3 `rope_scaling`."""
    low = scaling["original_max_position_embeddings"] / scaling["low_freq_factor"]
    high = scaling["original_max_position_embeddings"] / scaling["high_freq_factor"]
    wavelengths = 2 * math.pi / frequencies
    smooth = (scaling["original_max_position_embeddings"] / wavelengths - scaling["low_freq_factor"]) / (
        scaling["high_freq_factor"] - scaling["low_freq_factor"]
    )
    between = 1 / ((1 - smooth) / scaling["factor"] + smooth)
    return np.where(wavelengths < high, 1.0, np.where(wavelengths > low, scaling["factor"], between))


class GGUFWeights(Mapping):
    """A GGUF file's tensors under their Hugging Face names, each dequantized to float32 (float16 kept)
    when it is looked up and not kept. llama.cpp stores a Llama's query and key rows interleaved for its
    RoPE: put back in Hugging Face's order here."""

    def __init__(self, tensors: list, config: dict):
        self._tensors, self._config = {}, config
        self._unpermute = config["model_type"] == "llama"
        for tensor in tensors:
            if tensor.tensor_type.name in ("Q8_1", "Q8_K"):
                raise CheckpointError(
                    f"tensor {tensor.name!r} is stored as {tensor.tensor_type!r}, which cannot be read here.",
                    caller="from_gguf",
                )
            if tensor.name == "rope_freqs.weight":  # read as the config's rope_scaling
                continue
            name = _huggingface_name(tensor.name)
            if name == tensor.name:  # a tensor no model here has: loading without it would compute something else
                raise CheckpointError(
                    f"the file holds a tensor {tensor.name!r} that a {config['model_type']} model does not have; "
                    "from_gguf reads the tensors llama.cpp writes for llama, qwen2 and qwen3.",
                    "path",
                    caller="from_gguf",
                )
            self._tensors[name] = tensor

    def __getitem__(self, name: str) -> np.ndarray:
        from gguf import GGMLQuantizationType, quants

        tensor = self._tensors[name]
        if tensor.tensor_type == GGMLQuantizationType.F16:
            array = np.array(tensor.data, np.float16)
        else:
            try:
                array = quants.dequantize(tensor.data, tensor.tensor_type)
            except NotImplementedError:
                raise CheckpointError(
                    f"tensor {tensor.name!r} is stored as {tensor.tensor_type.name}, which the gguf package "
                    "cannot dequantize.",
                    caller="from_gguf",
                ) from None
            array = np.asarray(array, np.float32)
            if np.may_share_memory(array, tensor.data):  # a float32 tensor's view would keep the file mapped
                array = _copied(array)
        release_pages(tensor.data)
        array = array.reshape([int(n) for n in reversed(tensor.shape)])
        if self._unpermute and (".q_proj." in name or ".k_proj." in name):
            heads = self._config["num_attention_heads" if ".q_proj." in name else "num_key_value_heads"]
            array = array.reshape(heads, -1, 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)
        return array

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def values_count(self) -> int:
        """How many values the tensors hold together."""
        return sum(int(np.prod([int(n) for n in tensor.shape])) for tensor in self._tensors.values())


def _copied(view: np.ndarray, values: int = 1 << 22) -> np.ndarray:
    """A copy of a tensor's `view` of the mapped file, its pages released `values` at a time as they are
    copied: the largest tensor (often the token table) is never resident twice."""
    source = view.reshape(-1)
    copy = np.empty_like(source)
    for start in range(0, source.size, values):
        copy[start : start + values] = source[start : start + values]
        release_pages(source[start : start + values])
    return copy.reshape(view.shape)


def release_pages(view: np.ndarray) -> None:
    """Unmaps the pages of a memory-mapped file under `view`, read and copied already (they stay in the
    system's file cache). Resident memory counts a mapping's pages once read, so reading every tensor
    through the reader's map would hold the whole file beside the model it became (Linux only)."""
    if not sys.platform.startswith("linux") or view.nbytes == 0:
        return
    page = mmap.PAGESIZE
    start = view.ctypes.data // page * page
    end = -(-(view.ctypes.data + view.nbytes) // page) * page
    ctypes.CDLL(None, use_errno=True).madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)


def _huggingface_name(name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; an unknown name is returned as
    it is (and refused)."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    return name


def end_ids(metadata: dict) -> dict | None:
    """The ids generation stops at (the end-of-sequence and end-of-turn tokens) and pads with."""
    ends = [metadata.get(f"tokenizer.ggml.{name}_token_id") for name in ("eos", "eot", "eom")]
    ends = list(dict.fromkeys(int(i) for i in ends if i is not None))
    settings = {}
    if ends:
        settings["eos_token_id"] = ends[0] if len(ends) == 1 else ends
    if metadata.get("tokenizer.ggml.padding_token_id") is not None:
        settings["pad_token_id"] = int(metadata["tokenizer.ggml.padding_token_id"])
    return settings or None
