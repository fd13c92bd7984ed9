"""`model.export` in every format and family, each artifact run in its own runtime (TensorFlow's
SavedModel loader, onnxruntime, LiteRT's interpreter), and decoding exported as a SavedModel endpoint."""

import os

import keras
import numpy as np
import pytest

from keras_tfm.errors import InputError
from tests.checks import assert_close, to_numpy
from tests.models.test_base import MODELS

BACKEND = keras.backend.backend()

EXPORTS = {  # inputs of two batch sizes and (but ViT) two lengths; BertMLM's encoder is the classifier's
    "gpt": lambda rng: [rng.integers(0, 30, (2, 7)), rng.integers(0, 30, (1, 4))],
    "decoder_lm": lambda rng: [rng.integers(0, 30, (2, 7)), rng.integers(0, 30, (1, 4))],
    "bert_classifier": lambda rng: [  # a pair: sentence B's segment ids, and padding
        {
            "token_ids": rng.integers(1, 30, (2, 7)),
            "segment_ids": np.array([[0] * 4 + [1] * 3] * 2),
            "padding_mask": np.array([[1] * 7, [1] * 5 + [0] * 2]),
        },
        {
            "token_ids": rng.integers(1, 30, (1, 4)),
            "segment_ids": np.array([[0, 0, 1, 1]]),
            "padding_mask": np.ones((1, 4), "int32"),
        },
    ],
    "translator": lambda rng: [
        {"source_ids": rng.integers(1, 30, (2, 7)), "target_ids": rng.integers(1, 20, (2, 5))},
        {"source_ids": rng.integers(1, 30, (1, 3)), "target_ids": rng.integers(1, 20, (1, 2))},
    ],
    "vit": lambda rng: [rng.random((2, 16, 16, 3)), rng.random((3, 16, 16, 3))],
}


def _batches(name, rng) -> list:
    return [
        keras.tree.map_structure(lambda x: x.astype("float32" if x.dtype.kind == "f" else "int32"), inputs)
        for inputs in EXPORTS[name](rng)
    ]


def _input_name(name: str) -> str:
    return "images" if name == "vit" else "token_ids"


@pytest.mark.parametrize("name", ["bert_classifier", "vit"])
def test_export_with_no_arguments_serves_any_batch_and_length_before_or_after_a_call(tmp_path, rng, name, capsys):
    """`model.export(path)` as Keras documents it: the model's own inputs (int32 ids, a ViT's images) of
    any batch and length, whether the model has been called or not; TensorFlow's loader runs it.
    PyTorch, which Keras 3.15 cannot export to a SavedModel, is refused by name. (The causal LMs' `serve`
    of any batch and length, and what export prints for them: the generate endpoint's test; the
    translator's: its translate endpoint's test.)"""
    model = MODELS[name][0]()
    if BACKEND == "torch":
        with pytest.raises(
            InputError, match=r"format: .*\.export: cannot write format='tf_saved_model' from the torch"
        ):
            model.export(str(tmp_path / "served"))
        assert not (tmp_path / "served").exists()
        return
    tf = pytest.importorskip("tensorflow")
    batches = _batches(name, rng)
    if name == "bert_classifier":  # after a first call: Keras' traced shapes change nothing
        model(batches[0])
    capsys.readouterr()
    model.export(str(tmp_path / "served"))
    assert capsys.readouterr().out == f"Saved a SavedModel (serve) to {tmp_path / 'served'}\n"
    served = tf.saved_model.load(str(tmp_path / "served"))
    for inputs in batches:
        assert_close(np.asarray(served.serve(inputs)), to_numpy(model(inputs)), atol=1e-5)
    saved = tf.train.load_checkpoint(str(tmp_path / "served" / "variables" / "variables")).get_variable_to_shape_map()
    written = sum(int(np.prod(shape)) for name, shape in saved.items() if name != "_CHECKPOINTABLE_OBJECT_GRAPH")
    assert written == sum(int(np.prod(v.shape)) for v in model.variables)  # each once (Keras writes them twice on TF)


def _run_artifact(path: str, format: str, inputs, input_name: str) -> np.ndarray:
    """The artifact run in its own runtime, fed by input name (the model's own names)."""
    feeds = inputs if isinstance(inputs, dict) else {input_name: inputs}
    if format == "onnx":
        import onnxruntime

        inference = onnxruntime.InferenceSession(path)
        assert sorted(i.name for i in inference.get_inputs()) == sorted(feeds)
        return inference.run(None, feeds)[0]
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path).get_signature_runner()
    outputs = runner(**feeds)
    assert len(outputs) == 1
    return next(iter(outputs.values()))


@pytest.mark.parametrize("format", ["onnx", "litert"])
@pytest.mark.parametrize("name", [name for name in EXPORTS if name != "decoder_lm"])
def test_onnx_and_litert_artifacts_give_the_models_outputs_in_their_runtimes(tmp_path, rng, name, format, capsys):
    """ONNX (onnxruntime) and LiteRT (its interpreter) from TensorFlow: every family, two batch sizes and
    lengths, after a first call (DecoderLM's layers: its cached step's test, in both runtimes). JAX and
    PyTorch, whose routes fail on these models, are refused by name with the backend that can, before
    anything is written."""
    model = MODELS[name][0]()
    path = str(tmp_path / ("model.onnx" if format == "onnx" else "model.tflite"))
    if BACKEND != "tensorflow":
        expected = (
            rf"format: {type(model).__name__}\.export: cannot write format='{format}' from the {BACKEND} backend: "
        )
        with pytest.raises(InputError, match=expected + r".*KERAS_BACKEND=tensorflow and export it there"):
            model.export(path, format=format)
        assert not os.path.exists(path)
        return
    batches = _batches(name, rng)
    model(batches[0])
    capsys.readouterr()
    model.export(path, format=format)
    kind = "an ONNX" if format == "onnx" else "a LiteRT"
    assert capsys.readouterr().out == f"Saved {kind} model (serve) to {path}\n"  # one line, not Keras' listing
    for inputs in batches:
        assert_close(_run_artifact(path, format, inputs, _input_name(name)), to_numpy(model(inputs)), atol=1e-5)


def test_an_unknown_format_is_refused_by_name(tmp_path):
    model = MODELS["gpt"][0]()
    with pytest.raises(
        InputError,
        match=r"format: GPT\.export: must be one of \['litert', 'onnx', 'tf_saved_model'\]; received format='pdf'",
    ):
        model.export(str(tmp_path / "served"), format="pdf")
    assert not (tmp_path / "served").exists()


PROMPTS = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3]]


def _padded(prompts) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(prompts), max(map(len, prompts))), "int32")
    for row, prompt in zip(ids, prompts):
        row[: len(prompt)] = prompt
    return ids, np.array([len(p) for p in prompts], "int32")


def _expected_ends(output: np.ndarray, prompts, max_new_tokens: int, stops) -> list[int]:
    ends = []
    for row, prompt in zip(output, prompts):
        new = list(row[len(prompt) : len(prompt) + max_new_tokens])
        hits = [i for i, token in enumerate(new) if token in stops]
        ends.append(len(prompt) + (hits[0] + 1 if hits else len(new)))
    return ends


@pytest.mark.skipif(BACKEND == "torch", reason="PyTorch writes no SavedModel (refusal tested above)")
@pytest.mark.parametrize("name", ["gpt", "decoder_lm"])
def test_a_saved_models_generate_endpoint_decodes_as_generate_does(tmp_path, rng, name, capsys):
    """The exported greedy loop, run by TensorFlow's loader: prompts of three lengths, fewer new tokens
    than the exported room, a stop token met by one row: `generate`'s ids, then the pad id, and each
    row's end; and its `serve` of two batch sizes and lengths."""
    tf = pytest.importorskip("tensorflow")
    model = MODELS[name][0]()
    free = model.generate(PROMPTS, 4, stop_token_ids=())
    stop = int(free[0, len(PROMPTS[0])])  # row 0 stops at its first new token
    expected = model.generate(PROMPTS, 4, stop_token_ids=[stop])
    capsys.readouterr()
    model.export(str(tmp_path / "served"), max_new_tokens=6, stop_token_ids=[stop])
    assert capsys.readouterr().out == f"Saved a SavedModel (serve, generate) to {tmp_path / 'served'}\n"
    served = tf.saved_model.load(str(tmp_path / "served"))
    ids, lengths = _padded(PROMPTS)
    out = served.generate(token_ids=ids, lengths=lengths, max_new_tokens=np.int32(4), seed=np.int32(0))
    output = out["token_ids"].numpy()
    assert output.shape == (3, ids.shape[1] + 6)
    np.testing.assert_array_equal(output[:, : expected.shape[1]], expected)
    assert (output[:, expected.shape[1] :] == 0).all()
    assert out["lengths"].numpy().tolist() == _expected_ends(expected, PROMPTS, 4, [stop])
    assert out["lengths"].numpy()[0] == len(PROMPTS[0]) + 1
    assert set(served.signatures) == {"serve", "serving_default", "generate"}  # what TensorFlow Serving hosts
    for inputs in [ids, *_batches(name, rng)]:
        assert_close(np.asarray(served.serve(inputs)), to_numpy(model(inputs)), atol=1e-5)


@pytest.mark.skipif(BACKEND == "torch", reason="PyTorch writes no SavedModel (refusal tested above)")
def test_a_saved_models_sampling_endpoint_draws_as_generate_does_for_a_seed(tmp_path):
    tf = pytest.importorskip("tensorflow")
    model = MODELS["decoder_lm"][0]()
    sampling = dict(temperature=0.9, top_k=12, top_p=0.9)
    model.export(str(tmp_path / "served"), verbose=False, max_new_tokens=5, stop_token_ids=(), **sampling)
    served = tf.saved_model.load(str(tmp_path / "served"))
    ids, lengths = _padded(PROMPTS)
    draws = []
    for seed in (3, 4):
        expected = model.generate(PROMPTS, 5, stop_token_ids=(), seed=seed, **sampling)
        out = served.generate(token_ids=ids, lengths=lengths, max_new_tokens=np.int32(5), seed=np.int32(seed))
        np.testing.assert_array_equal(out["token_ids"].numpy(), expected)
        draws.append(expected)
    assert not np.array_equal(*draws)  # the seed is an input, not a constant of the trace


@pytest.mark.skipif(BACKEND == "torch", reason="PyTorch writes no SavedModel (refusal tested above)")
def test_a_translators_saved_model_serves_any_batch_and_length_and_translates_as_translate_does(tmp_path, rng, capsys):
    tf = pytest.importorskip("tensorflow")
    model = MODELS["translator"][0]()
    batches = _batches("translator", rng)
    model(batches[0])  # after a first call: Keras' traced shapes change nothing
    sources = np.array([[3, 4, 5, 6, 7], [8, 9, 2, 0, 0]], "int32")
    capsys.readouterr()
    model.export(str(tmp_path / "served"), max_length=6)
    assert capsys.readouterr().out == f"Saved a SavedModel (serve, translate) to {tmp_path / 'served'}\n"
    served = tf.saved_model.load(str(tmp_path / "served"))  # kept: its functions read its variables
    for inputs in batches:
        assert_close(np.asarray(served.serve(inputs)), to_numpy(model(inputs)), atol=1e-5)
    out = served.translate(source_ids=sources)
    expected = model.translate(sources, max_length=6)
    np.testing.assert_array_equal(out["token_ids"].numpy(), expected)
    ends = [row.tolist().index(model.end_token_id) + 1 if model.end_token_id in row else 6 for row in expected]
    assert out["lengths"].numpy().tolist() == ends


def _step_runner(path: str, format: str):
    """`decode(token_ids, position, cache) -> (logits, cache)` of an exported cached step, in its runtime."""
    if format == "tf_saved_model":
        import tensorflow as tf

        served = tf.saved_model.load(path)  # owns the variables: kept alive with the function

        def run(**feeds):
            outputs = served.decode(**feeds)
            return outputs["logits"].numpy(), outputs["updated_cache"].numpy()

        return run
    if format == "onnx":
        import onnxruntime

        inference = onnxruntime.InferenceSession(path)
        assert sorted(i.name for i in inference.get_inputs()) == ["cache", "position", "token_ids"]
        names = [o.name for o in inference.get_outputs()]
        return lambda **feeds: tuple(inference.run(names, feeds))
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path).get_signature_runner("decode")

    def run(**feeds):
        outputs = runner(**feeds)
        return outputs["logits"], outputs["updated_cache"]

    return run


@pytest.mark.parametrize("format", ["tf_saved_model", "onnx", "litert"])
def test_an_exported_cached_step_decodes_as_generate_does(tmp_path, format):
    """`export(..., cache_length=)`: the model's step over a cache the caller holds, run in each runtime
    by a plain greedy loop (a prefill at position 0, then one token at a time): the first logits are the
    model's and the tokens `generate`'s, for a batch of two prompts and for one."""
    model = MODELS["decoder_lm"][0]()
    path = str(tmp_path / {"tf_saved_model": "served", "onnx": "step.onnx", "litert": "step.tflite"}[format])
    if BACKEND == "torch" or (BACKEND == "jax" and format != "tf_saved_model"):
        with pytest.raises(InputError, match=rf"format: DecoderLM\.export: cannot write format='{format}'"):
            model.export(path, format=format, cache_length=12)
        return
    model.export(path, format=format, cache_length=12, verbose=False)
    step = _step_runner(path, format)
    attention = model.blocks[0].self_attention
    for prompts in ([[3, 5, 7, 2], [4, 4, 9, 1]], [[6, 2]]):
        ids = np.array(prompts, "int32")
        cache = np.zeros(
            (len(model.blocks), len(prompts), 2, attention.num_key_value_heads, 12, attention.key_dim), "float32"
        )
        logits, cache = step(token_ids=ids, position=np.array(0, "int32"), cache=cache)
        assert_close(logits, to_numpy(model(ids)), atol=1e-5)
        tokens = []
        for position in range(ids.shape[1], ids.shape[1] + 5):
            tokens.append(logits[:, -1].argmax(-1).astype("int32"))
            logits, cache = step(token_ids=tokens[-1][:, None], position=np.array(position, "int32"), cache=cache)
        expected = model.generate(prompts, max_new_tokens=5, stop_token_ids=())[:, ids.shape[1] :]
        np.testing.assert_array_equal(np.stack(tokens, axis=1), expected)
    past, _ = step(token_ids=ids[:, :2], position=np.array(11, "int32"), cache=cache)  # 13 > 12 positions
    assert np.isnan(past).all()
    with pytest.raises(
        InputError, match=r"cache_length: DecoderLM\.export: must be an integer in \[1, max_length=16\]"
    ):
        model.export(str(tmp_path / "other"), format=format, cache_length=17)
    if format != "tf_saved_model":
        with pytest.raises(InputError, match=r"input_signature: DecoderLM\.export: with cache_length, format="):
            model.export(str(tmp_path / "other"), format=format, cache_length=8, input_signature=[None])
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("format", ["onnx", "litert"])
def test_decoding_settings_for_a_format_without_the_loop_are_refused_not_dropped(tmp_path, format):
    lm, translator = MODELS["decoder_lm"][0](), MODELS["translator"][0]()
    with pytest.raises(
        InputError,
        match=rf"temperature: DecoderLM\.export: only a SavedModel holds the decoding loop; format='{format}'",
    ):
        lm.export(str(tmp_path / "model"), format=format, temperature=0.7, top_p=0.9)
    with pytest.raises(InputError, match=r"max_length: Translator\.export: only a SavedModel holds the decoding loop"):
        translator.export(str(tmp_path / "model"), format=format, max_length=8)
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="a SavedModel is written from TensorFlow or JAX")
def test_settings_the_saved_loop_does_not_hold_are_refused_not_dropped(tmp_path):
    lm = MODELS["decoder_lm"][0]()
    for name, value in (("logit_bias", {1: 5.0}), ("frequency_penalty", 0.5), ("num_return_sequences", 2),
                        ("json_schema", True), ("repetition_penalty", 1.2)):  # fmt: skip
        settings = {name: value, "temperature": 0.7}
        with pytest.raises(InputError, match=rf"^{name}: DecoderLM\.export: is not exported \(greedy decoding"):
            lm.export(str(tmp_path / "model"), **settings)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(max_new_tokens=0), r"`max_new_tokens` must be an integer >= 1; received 0"),
        (
            dict(max_new_tokens=16),
            r"max_new_tokens: DecoderLM\.export: prompt length 1 \+ max_new_tokens 16 exceeds max_length=16",
        ),
        (dict(temperature=-1.0), r"`temperature` must be a finite number >= 0; received -1.0"),
    ],
)
def test_bad_decoding_settings_are_refused_before_anything_is_written(tmp_path, arguments, message):
    if BACKEND == "torch":
        pytest.skip("PyTorch refuses the format first")
    model = MODELS["decoder_lm"][0]()
    with pytest.raises(InputError, match=message):
        model.export(str(tmp_path / "served"), **arguments)
    assert not (tmp_path / "served").exists()
