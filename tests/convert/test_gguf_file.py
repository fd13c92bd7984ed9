"""`gguf_file.read` against llama.cpp's own reader (`gguf.GGUFReader`): every kind of metadata value, plain
and block-quantized tensors, both byte orders, and files cut short or stating sizes they cannot hold."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from keras_tfm.convert import gguf_file

gguf = pytest.importorskip("gguf")


def written(path, endianness=None, alignment: int | None = None):
    """A file with a value of every metadata type, arrays of strings, numbers and arrays, and tensors of
    float32, float16, int32 and two block-quantized types."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endianness or gguf.GGUFEndian.LITTLE)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    value = gguf.GGUFValueType
    for kind, item in [(value.UINT8, 200), (value.INT8, -3), (value.UINT16, 60000), (value.INT16, -300),
                       (value.UINT32, 4_000_000_000), (value.INT32, -7), (value.FLOAT32, 0.25),
                       (value.BOOL, True), (value.UINT64, 2**40), (value.INT64, -(2**40)), (value.FLOAT64, 1e-300),
                       (value.STRING, "naïve ✓")]:  # fmt: skip
        writer.add_key_value(f"test.{kind.name.lower()}", item, kind)
    writer.add_token_list(["<s>", "a", "b ✓", ""] * 50)
    writer.add_token_scores(rng.standard_normal(200).astype(np.float32).tolist())
    writer.add_token_types([1, 3, 6, 1] * 50)
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_tensor("plain.weight", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("half.weight", rng.standard_normal((4, 6)).astype(np.float16))
    writer.add_tensor("ids", np.arange(7, dtype=np.int32))
    for kind in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
        values = rng.standard_normal((2, 64)).astype(np.float32)
        writer.add_tensor(f"{kind.name}.weight", gguf.quants.quantize(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_same_as_llama_cpp_reader(path) -> None:
    ours, reader = gguf_file.read(path), gguf.GGUFReader(path)
    theirs = {name: field.contents() for name, field in reader.fields.items()}
    assert theirs.pop("test.nested") == [1, 2, 3]  # llama.cpp's reader flattens an array of arrays
    assert ours.metadata.pop("test.nested") == [[1, 2], [3]]
    assert ours.metadata == theirs
    assert [t.name for t in ours.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(ours.tensors, reader.tensors):
        assert mine.tensor_type == theirs.tensor_type and list(mine.shape) == theirs.shape.tolist(), mine.name
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape, mine.name
        np.testing.assert_array_equal(mine.data, theirs.data)


@pytest.mark.backend_independent
def test_a_file_reads_as_llama_cpps_reader_reads_it(tmp_path):
    path = written(tmp_path / "every.gguf")
    assert_same_as_llama_cpp_reader(path)
    metadata = gguf_file.read(path).metadata
    assert metadata["test.string"] == "naïve ✓" and metadata["test.bool"] is True
    assert metadata["tokenizer.ggml.tokens"][2] == "b ✓" and metadata["test.uint64"] == 2**40
    assert_same_as_llama_cpp_reader(written(tmp_path / "aligned.gguf", alignment=256))
    assert_same_as_llama_cpp_reader(written(tmp_path / "big.gguf", gguf.GGUFEndian.BIG))
    big = gguf_file.read(tmp_path / "big.gguf")
    assert big.metadata["test.uint64"] == 2**40 and big.tensors[0].data.dtype.byteorder == ">"
    np.testing.assert_array_equal(big.tensors[0].data, gguf_file.read(path).tensors[0].data)


@pytest.mark.backend_independent
def test_a_file_cut_short_or_stating_sizes_it_cannot_hold_is_refused_at_once(tmp_path):
    data = written(tmp_path / "whole.gguf").read_bytes()
    for end in (3, 10, 30, 200, 900, len(data) // 2, len(data) - 40):  # the last 24 bytes pad
        (tmp_path / "cut.gguf").write_bytes(data[:end])
        with pytest.raises(Exception) as caught:
            gguf_file.read(tmp_path / "cut.gguf")
        assert isinstance(caught.value, (ValueError, UnicodeDecodeError, struct.error)), caught.value
    tokens = data.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 8  # its array's count
    huge = data[:tokens] + (2**60).to_bytes(8, "little") + data[tokens + 8 :]
    (tmp_path / "huge.gguf").write_bytes(huge)
    with pytest.raises(ValueError, match=r"a count of 1152921504606846976 items runs past the file's end"):
        gguf_file.read(tmp_path / "huge.gguf")  # refused before a loop of 2**60 strings
    (tmp_path / "version.gguf").write_bytes(data[:4] + (1).to_bytes(4, "little") + data[8:])
    with pytest.raises(ValueError, match=r"GGUF version 1 cannot be read"):
        gguf_file.read(tmp_path / "version.gguf")
