"""`from_gguf` against transformers' GGUF loader (`from_pretrained(..., gguf_file=...)`), on files written
here with llama.cpp's `gguf` package as llama.cpp's converter writes them: logits, tokens, chat, and
the refusals of what it cannot read."""

from __future__ import annotations

import gc
import json
import math
import sys
import warnings

import numpy as np
import pytest

import keras_tfm
from keras_tfm.convert import safetensors_files
from keras_tfm.errors import CheckpointError, InputError
from tests.checks import to_numpy

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXT = open(__file__.rsplit("/tests/", 1)[0] + "/../shared/data/tinyshakespeare/input.txt").read()[:20000]
TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)
BLOCK_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def byte_level_vocabulary() -> dict:
    """A byte-level BPE learned on Shakespeare, with two control tokens, as llama.cpp lists it."""
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|start|>", "<|end|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator([TEXT], trainer)
    model = json.loads(bpe.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [3 if token in ("<|start|>", "<|end|>") else 1 for token in tokens]
    return {"model": "gpt2", "pre": "llama-bpe", "tokens": tokens, "merges": merges, "types": types, "bos": 0, "eos": 1}


def sentencepiece_vocabulary() -> dict:
    """A SentencePiece-style vocabulary (pieces with scores, byte fallback), as Llama 2's files hold."""
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(byte_fallback=True, unk_token="<unk>"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *bytes_])
    bpe.train_from_iterator([TEXT], trainer)
    vocabulary = bpe.get_vocab()
    tokens = sorted(vocabulary, key=vocabulary.get)
    scores = [0.0 if i < 259 else -float(i) for i in range(len(tokens))]
    types = [2 if t == "<unk>" else 3 if t in ("<s>", "</s>") else 6 if t in bytes_ else 1 for t in tokens]
    return {"model": "llama", "tokens": tokens, "scores": scores, "types": types, "bos": 1, "eos": 2, "unk": 0}


def hf_model(architecture: str, vocabulary_size: int, hidden: int = 64, intermediate: int = 128, **extra):
    torch.manual_seed(0)
    classes = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}
    config = getattr(transformers, classes[architecture] + "Config")(
        vocab_size=vocabulary_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        **extra,
    )
    return getattr(transformers, classes[architecture] + "ForCausalLM")(config).eval()


def write_gguf(path, model, vocabulary: dict, quantization=None, rope_freqs=None, extra=None, heads=None) -> None:
    """`model` as llama.cpp's converter writes it: its metadata, its tensors renamed (a Llama's query
    and key rows permuted for llama.cpp's RoPE), 2-D weights in `quantization`, norms in float32."""
    config = model.config
    architecture = config.model_type
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads if heads is None else heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model(vocabulary["model"])
    if "pre" in vocabulary:
        writer.add_tokenizer_pre(vocabulary["pre"])
    writer.add_token_list(vocabulary["tokens"])
    writer.add_token_types(vocabulary["types"])
    if "merges" in vocabulary:
        writer.add_token_merges(vocabulary["merges"])
    if "scores" in vocabulary:
        writer.add_token_scores(vocabulary["scores"])
    writer.add_bos_token_id(vocabulary["bos"])
    writer.add_eos_token_id(vocabulary["eos"])
    if "unk" in vocabulary:
        writer.add_unk_token_id(vocabulary["unk"])
    writer.add_chat_template(TEMPLATE)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    for name, tensor in model.state_dict().items():
        array = tensor.numpy()
        if architecture == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            array = array.reshape(heads, 2, -1, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)
        if array.ndim == 2 and quantization is not None:
            writer.add_tensor(gguf_name(name), quantized(array, quantization), raw_dtype=quantization)
        else:
            writer.add_tensor(gguf_name(name), array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_name(name: str) -> str:
    globals_ = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if name in globals_ or name == "lm_head.weight":
        return globals_.get(name, "output.weight")
    _, _, index, *module, kind = name.split(".")
    return f"blk.{index}.{BLOCK_NAMES['.'.join(module)]}.{kind}"


def quantized(array: np.ndarray, quantization) -> np.ndarray:
    """`array` in `quantization`; the K-quants, which `gguf` cannot quantize, as random blocks with
    small finite scales (both loaders dequantize the same bytes)."""
    kind = gguf.GGMLQuantizationType
    if quantization not in (kind.Q4_K, kind.Q6_K):
        return gguf.quants.quantize(array, quantization)
    block, size = gguf.GGML_QUANT_SIZES[quantization]
    rng = np.random.default_rng(array.size)
    blocks = rng.integers(0, 256, size=(array.size // block, size), dtype=np.uint8)
    scales = np.full((len(blocks), 2), 0.002, np.float16).view(np.uint8)
    if quantization == kind.Q4_K:
        blocks[:, :4] = scales
        blocks[:, 4:16] &= 0x3F  # six-bit scales and minima
    else:
        blocks[:, -2:] = scales[:, :2]
        blocks[:, 192:208] = rng.integers(-8, 8, size=(len(blocks), 16), dtype=np.int8).view(np.uint8)
    return blocks.reshape(array.shape[0], -1)


@pytest.fixture(scope="module")
def byte_level():
    return byte_level_vocabulary()


def load_both(tmp_path, architecture, vocabulary, quantization=None, **sizes):
    model = hf_model(architecture, len(vocabulary["tokens"]), **sizes)
    path = tmp_path / f"tiny-{architecture}.gguf"
    write_gguf(path, model, vocabulary, quantization)
    oracle = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).eval()
    return keras_tfm.from_gguf(path), oracle, path


def assert_same_logits(ours, oracle, ids):
    with torch.no_grad():
        expected = oracle(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(to_numpy(ours(ids)), expected, atol=1e-4)


@pytest.mark.parametrize(
    "architecture, quantization",
    [
        ("llama", None),
        ("qwen2", "Q4_0"),
        ("qwen3", "BF16"),
        # the other types differ only in the dequantization (NumPy): once
        pytest.param("llama", "Q8_0", marks=pytest.mark.backend_independent),
        pytest.param("llama", "Q4_1", marks=pytest.mark.backend_independent),
    ],
)
def test_a_gguf_file_gives_the_logits_of_transformers_gguf_loader(tmp_path, byte_level, architecture, quantization):
    kind = None if quantization is None else gguf.GGMLQuantizationType[quantization]
    ours, oracle, path = load_both(tmp_path, architecture, byte_level, kind)
    ids = np.random.default_rng(0).integers(0, len(byte_level["tokens"]), size=(2, 11)).astype("int32")
    assert_same_logits(ours, oracle, ids)
    assert ours.count_params() == sum(p.numel() for p in oracle.parameters())
    if sys.platform.startswith("linux"):  # the weights are copies: the file is not kept mapped (and resident)
        gc.collect()
        with open("/proc/self/maps") as maps:
            assert str(path) not in maps.read()


@pytest.mark.backend_independent  # the loading is from_huggingface's, tested on every backend
def test_a_quantized_file_loads_into_keras_int8_as_quantize_after_loading_makes_it(tmp_path, byte_level):
    model = hf_model("llama", len(byte_level["tokens"]))
    path = tmp_path / "tiny-q8.gguf"
    write_gguf(path, model, byte_level, gguf.GGMLQuantizationType.Q8_0)
    after = keras_tfm.from_gguf(path)
    after.quantize("int8")
    loaded = keras_tfm.from_gguf(path, quantize="int8")
    expected = {w.path.split("/", 1)[1]: w for w in after.weights}
    assert sorted(w.path.split("/", 1)[1] for w in loaded.weights) == sorted(expected)
    for weight in loaded.weights:
        reference = expected[weight.path.split("/", 1)[1]]
        assert weight.dtype == reference.dtype, weight.path
        np.testing.assert_array_equal(to_numpy(weight), to_numpy(reference), err_msg=weight.path)
    assert sum(w.dtype == "int8" for w in loaded.weights) >= 1 + 7 * 2  # the embedding and every dense layer
    assert loaded.tokenizer is not None and loaded.generation_config == after.generation_config
    with pytest.raises(InputError, match=r"quantize: from_gguf: expected None or one of int8, int4; received 'q8'"):
        keras_tfm.from_gguf(path, quantize="q8")


@pytest.mark.backend_independent
@pytest.mark.parametrize("quantization", ["Q4_K", "Q6_K"])
def test_k_quantized_files_dequantize_as_transformers_does(tmp_path, byte_level, quantization):
    ours, oracle, _ = load_both(
        tmp_path, "llama", byte_level, gguf.GGMLQuantizationType[quantization], hidden=256, intermediate=512
    )
    ids = np.random.default_rng(1).integers(0, len(byte_level["tokens"]), size=(1, 9)).astype("int32")
    assert_same_logits(ours, oracle, ids)


@pytest.mark.backend_independent
@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_the_tokenizer_and_chat_template_are_transformers_own(tmp_path, byte_level, kind):
    vocabulary = byte_level if kind == "byte_level" else sentencepiece_vocabulary()
    model = hf_model("llama", len(vocabulary["tokens"]))
    path = tmp_path / "tiny.gguf"
    write_gguf(path, model, vocabulary)
    expected = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    tokenizer = keras_tfm.from_gguf(path).tokenizer
    for text in ("To be, or not to be: that is the question.", "  Wherefore art thou\n\nRomeo? 1234 é", ""):
        assert tokenizer.encode_prompt(text).tolist() == expected(text)["input_ids"], text
        ids = expected(text)["input_ids"]
        assert tokenizer.decode_text(ids) == expected.decode(ids, skip_special_tokens=True)
    assert tokenizer.chat_template == expected.chat_template == TEMPLATE
    assert tokenizer.vocabulary_size == len(vocabulary["tokens"])  # transformers' GPT-2 class adds one of its own


@pytest.mark.backend_independent
def test_chat_stops_at_the_files_end_token_as_transformers_generates(tmp_path, byte_level):
    ours, oracle, path = load_both(tmp_path, "llama", byte_level)
    assert ours.generation_config == {"eos_token_id": 1}
    messages = [{"role": "user", "content": "Speak, Romeo."}]
    prompt = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name).apply_chat_template(
        messages, add_generation_prompt=True, return_dict=False
    )
    expected = oracle.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=1)
    new = expected[0, len(prompt) :].tolist()
    reply = ours.chat(messages, max_new_tokens=12)
    assert reply == ours.tokenizer.decode_text(new)


def llama3_factors(config, factor: float) -> np.ndarray:
    """What llama.cpp's converter writes as `rope_freqs.weight` for Llama 3.1's RoPE scaling."""
    dimension, base = config.head_dim, config.rope_parameters["rope_theta"]
    factors = []
    for frequency in 1.0 / base ** (np.arange(0, dimension, 2) / dimension):
        wavelength = 2 * math.pi / frequency
        if wavelength < 8192 / 4.0:
            factors.append(1.0)
        elif wavelength > 8192 / 1.0:
            factors.append(factor)
        else:
            smooth = (8192 / wavelength - 1.0) / (4.0 - 1.0)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, np.float32)


def test_llama3_rope_scaling_written_as_frequency_factors_is_kept(tmp_path, byte_level):
    """llama.cpp writes Llama 3.1's RoPE scaling as a tensor of factors (which transformers' GGUF loader
    drops): recognised, and the logits are the original model's; factors of no known setting are refused."""
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    model = hf_model("llama", len(byte_level["tokens"]), rope_parameters={"rope_theta": 10000.0, **scaling})
    ids = np.random.default_rng(2).integers(0, len(byte_level["tokens"]), size=(1, 12)).astype("int32")
    for factor, path in ((8.0, tmp_path / "scaled.gguf"), (3.0, tmp_path / "unknown.gguf")):
        write_gguf(path, model, byte_level, rope_freqs=llama3_factors(model.config, factor))
    assert_same_logits(keras_tfm.from_gguf(tmp_path / "scaled.gguf"), model, ids)
    with pytest.raises(CheckpointError, match="matches none of Llama 3's settings"):
        keras_tfm.from_gguf(tmp_path / "unknown.gguf")


def file_pages_resident_mb(path) -> float:
    """The resident pages of this process's mappings of `path` (the process's whole RssFile also moves as the
    kernel reclaims other files' pages, as it did with the suite's six processes on two cores)."""
    resident, inside = 0, False
    with open("/proc/self/smaps") as maps:
        for line in maps:
            fields = line.split()
            if "-" in fields[0] and ":" not in fields[0]:  # a mapping's header: address range ... [path]
                inside = len(fields) >= 6 and fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                resident += int(fields[1])
    return resident / 1024


@pytest.mark.backend_independent
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pages are released on Linux")
def test_tensors_read_through_the_files_map_leave_its_pages_unmapped(tmp_path):
    from keras_tfm.convert import gguf as gguf_loading

    values = np.random.default_rng(0).standard_normal(8 << 20).astype(np.float32)  # 32 MB
    values.tofile(tmp_path / "tensor.bin")
    mapped = np.memmap(tmp_path / "tensor.bin", np.float32, mode="r")
    file = tmp_path / "tensor.bin"
    before = file_pages_resident_mb(file)
    copy = gguf_loading._copied(mapped, values=1000)  # copied a piece at a time, each released once copied
    assert file_pages_resident_mb(file) - before < 8
    np.testing.assert_array_equal(copy, values)
    assert float(np.asarray(mapped).sum()) == float(values.sum())  # read whole: every page resident
    assert file_pages_resident_mb(file) - before > 28
    gguf_loading.release_pages(mapped[1:-1])  # its pages, rounded out to whole pages
    assert file_pages_resident_mb(file) - before < 4
    np.testing.assert_array_equal(mapped, values)  # read again from the file


@pytest.mark.backend_independent
def test_files_it_cannot_read_are_refused_by_name(tmp_path, byte_level, monkeypatch):
    with pytest.raises(CheckpointError, match=r"from_gguf: no GGUF file at"):
        keras_tfm.from_gguf(tmp_path / "missing.gguf")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"is not a GGUF file \(it starts with b'\{\}', not b'GGUF'\)"):
        keras_tfm.from_gguf(tmp_path / "config.json")
    model = hf_model("llama", len(byte_level["tokens"]))
    path = tmp_path / "tiny.gguf"
    write_gguf(path, model, byte_level)
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cut.gguf' cannot be read|truncated or damaged"):
        keras_tfm.from_gguf(tmp_path / "cut.gguf")
    other = gguf.GGUFWriter(str(tmp_path / "gemma.gguf"), "gemma2")
    other.add_block_count(1)
    other.write_header_to_file()
    other.write_kv_data_to_file()
    other.write_tensors_to_file()
    other.close()
    with pytest.raises(CheckpointError, match=r"holds a 'gemma2' model; from_gguf reads llama, qwen2, qwen3"):
        keras_tfm.from_gguf(tmp_path / "gemma.gguf")
    damaged = {  # what llama.cpp refuses too, or what would load into a model that computes something else
        "heads": ({"heads": 0}, r"llama.attention.head_count is 0; expected a positive integer"),
        "extra": ({"extra": {"blk.0.attn_gate.weight": np.ones((4, 4), np.float32)}}, r"'blk.0.attn_gate.weight' that a llama model does not have"),
        "merges": ({"vocabulary": {k: v for k, v in byte_level.items() if k != "merges"}}, r"has no merges"),
    }  # fmt: skip
    for name, (change, message) in damaged.items():
        write_gguf(tmp_path / f"{name}.gguf", model, **{"vocabulary": byte_level, **change})
        with pytest.raises(CheckpointError, match=message):
            keras_tfm.from_gguf(tmp_path / f"{name}.gguf")
    with pytest.raises(
        InputError,
        match=r"dtype: from_gguf: expected one of float32, bfloat16, float16, mixed_float16, mixed_bfloat16 or None; received 'int8'",
    ):
        keras_tfm.from_gguf(path, dtype="int8")
    values = sum(p.numel() for p in model.parameters())
    monkeypatch.setattr(safetensors_files, "available_memory", lambda: 3 * values)  # room for bfloat16 only
    with pytest.raises(CheckpointError, match=r"dtype: from_gguf: the checkpoint's weights need .* as float32"):
        keras_tfm.from_gguf(path)
    with warnings.catch_warnings(record=True) as said:  # the file's read-only arrays are only read
        warnings.simplefilter("always")
        assert keras_tfm.from_gguf(path, dtype="bfloat16").dtype_policy.name == "bfloat16"
    assert not [w for w in said if "not writable" in str(w.message)], [str(w.message) for w in said]
