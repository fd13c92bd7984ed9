"""Every model of the zoo builds on demand where Keras reads its weights (`keras_tfm.models.base.ZooModel`)."""

import gc
import io
import re
import warnings
from contextlib import redirect_stdout

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.data import CharacterTokenizer
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.models.text_tasks import FlatArguments
from tests.checks import assert_close, to_numpy

# Tests of input checks that run before Keras' training step: TensorFlow's XLA compile of the step
# (about 20 s a model here) tests nothing of theirs, and compiled training is tested elsewhere.
EAGER_ON_TF = {"run_eagerly": keras.backend.backend() == "tensorflow"}

MODELS = {
    "gpt": (
        lambda: keras_tfm.GPT(vocabulary_size=30, max_length=16, num_layers=1, num_heads=2, hidden_dim=16),
        lambda rng: (rng.integers(0, 30, (2, 6)),),
    ),
    "decoder_lm": (
        lambda: keras_tfm.DecoderLM(
            vocabulary_size=30,
            max_length=16,
            num_layers=1,
            num_heads=2,
            num_key_value_heads=1,
            hidden_dim=16,
            intermediate_dim=24,
            sliding_window=4,
            query_key_norm=True,
        ),
        lambda rng: (rng.integers(0, 30, (2, 6)),),
    ),
    "bert_mlm": (
        lambda: keras_tfm.bert_tiny(vocabulary_size=30, max_length=16, num_layers=1),
        lambda rng: (rng.integers(1, 30, (2, 6)),),
    ),
    "bert_classifier": (
        lambda: keras_tfm.bert_tiny(head="classifier", vocabulary_size=30, max_length=16, num_layers=1),
        lambda rng: (rng.integers(1, 30, (2, 6)),),
    ),
    "bert": (
        lambda: keras_tfm.bert_tiny(head=None, vocabulary_size=30, max_length=16, num_layers=1),
        lambda rng: (rng.integers(1, 30, (2, 6)),),
    ),
    "translator": (
        lambda: keras_tfm.transformer_small(
            source_vocabulary_size=30,
            target_vocabulary_size=20,
            num_encoder_layers=1,
            num_decoder_layers=1,
            hidden_dim=16,
            num_heads=2,
            intermediate_dim=32,
        ),
        lambda rng: (rng.integers(1, 30, (2, 6)), rng.integers(1, 20, (2, 5))),
    ),
    "vit": (
        lambda: keras_tfm.ViT(image_size=16, patch_size=4, num_layers=1, num_heads=2, hidden_dim=16, num_classes=3),
        lambda rng: (rng.random((2, 16, 16, 3)).astype("float32"),),
    ),
}


@pytest.mark.backend_independent  # the base class's Python; weights files per backend: the fit-and-resume test
@pytest.mark.parametrize("name", MODELS)
def test_keras_methods_that_read_weights_build_a_new_model_first(tmp_path, rng, name):
    make, make_inputs = MODELS[name]
    inputs = make_inputs(rng)
    trained = make()
    trained.build()
    expected_count = trained.count_params()
    assert expected_count > 0
    expected = to_numpy(trained(*inputs))
    trained.save_weights(str(tmp_path / "model.weights.h5"))

    assert make().count_params() == expected_count

    printed = io.StringIO()
    with redirect_stdout(printed):
        make().summary()
    assert f"Total params: {expected_count:,}" in printed.getvalue()

    loaded = make()
    loaded.load_weights(str(tmp_path / "model.weights.h5"))
    assert_close(to_numpy(loaded(*inputs)), expected, atol=1e-6)

    copied = make()
    copied.set_weights(trained.get_weights())
    assert_close(to_numpy(copied(*inputs)), expected, atol=1e-6)
    assert len(make().get_weights()) == len(trained.weights)


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", MODELS)
def test_a_new_models_random_weights_are_each_drawn_on_their_own(name):
    """Keras fixes an unseeded initializer's seed when the initializer is made: one instance handed to
    every layer gave each query, key and value kernel the same values, and every layer the first's."""
    model = MODELS[name][0]()
    if "num_layers" in model.get_config():  # two blocks: the second's draws must differ from the first's
        model = type(model).from_config({**model.get_config(), "num_layers": 2})
    model.build()
    drawn = [to_numpy(w) for w in model.weights if to_numpy(w).std() > 0]  # not the ones and zeros
    assert len(drawn) > 8
    assert len({w.tobytes() for w in drawn}) == len(drawn)


@pytest.mark.parametrize(
    "size, model",
    [
        (keras_tfm.gpt2_small, "GPT"),
        (keras_tfm.bert_tiny, "Bert"),
        (keras_tfm.transformer_small, "Translator"),
        (keras_tfm.vit_tiny, "ViT"),
    ],
)
def test_a_width_the_heads_cannot_split_is_refused_at_construction(size, model):
    # before, the blocks found out when the weights were made: at the first call, or inside `fit`
    with pytest.raises(
        ValueError, match=f"{model}: hidden_dim must be a multiple of num_heads; received hidden_dim=100, num_heads=3"
    ):
        size(hidden_dim=100, num_heads=3, **({"source_vocabulary_size": 50} if model == "Translator" else {}))


# the bare BERT encoder and the classifier are BertMLM's encoder and plain Dense layers: left out for time
@pytest.mark.parametrize(
    "name, mode",
    [
        ("gpt", "int8"),
        ("decoder_lm", "int8"),
        ("bert_mlm", "int8"),
        ("translator", "int8"),
        ("vit", "int8"),
        ("gpt", "int4"),
    ],
)
def test_a_quantized_model_keeps_its_outputs_and_its_keras_file_loads_again(tmp_path, rng, name, mode):
    make, make_inputs = MODELS[name]
    inputs = make_inputs(rng)
    model = make()
    expected = to_numpy(model(*inputs))
    full_collections = []

    def count_full_collections(phase, info):
        full_collections.append(phase == "start" and info["generation"] == 2)

    gc.callbacks.append(count_full_collections)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        model.quantize(mode)
    gc.callbacks.remove(count_full_collections)
    # Keras' warning for each layer without a quantized form (LayerNorm, Dropout, ...) is kept quiet
    assert not [w for w in warned if "does not have a `quantize` method" in str(w.message)]
    tables = [
        layer for layer in model._flatten_layers() if isinstance(layer, (keras.layers.Dense, keras.layers.Embedding))
    ]
    assert tables and all(layer.quantization_mode == mode for layer in tables)  # TokenEmbedding too
    # Keras collects garbage after each float kernel it deletes (0.15-0.6 s each with a backend loaded)
    assert sum(full_collections) <= 2 < len(tables)
    out = to_numpy(model(*inputs))
    if mode == "int8":
        assert np.abs(out - expected).max() <= 0.1 * np.abs(expected).max()  # observed: at most 0.05

    # before, the config rebuilt float layers, which refused the saved weights; and (int4) the
    # layers' own quantization configs must come back too: here, no int8 quantizer of their inputs
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert all(
        layer.quantization_mode == mode
        for layer in loaded._flatten_layers()
        if isinstance(layer, (keras.layers.Dense, keras.layers.Embedding))
    )
    assert_close(to_numpy(loaded(*inputs)), out, atol=1e-6)


@pytest.mark.parametrize("name", ["bert_mlm"])  # token and segment tables, and the tied projection
def test_a_quantized_mixed_precision_model_computes_in_bfloat16(rng, name):
    keras.config.set_dtype_policy("mixed_bfloat16")  # the fixture sets float32 again
    make, make_inputs = MODELS[name]
    inputs = make_inputs(rng)
    model = make()
    expected = to_numpy(model(*inputs)).astype("float32")
    model.quantize("int8")
    out = model(*inputs)
    # before, Keras' quantized embeddings returned float32 (their scales are float32): the models went on
    # in float32 on JAX and PyTorch, and TensorFlow refused to add float32 and bfloat16 vectors
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert np.abs(to_numpy(out).astype("float32") - expected).max() <= 0.1 * np.abs(expected).max()


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch's int8 products depend on the CPU")
def test_int8_on_a_cpu_without_vnni_says_it_saves_memory_not_time(monkeypatch):
    from keras_tfm.models import base

    monkeypatch.setattr(base, "int8_products_are_fast", lambda: False)
    with pytest.warns(UserWarning, match=r"no VNNI instructions .* int8 saves memory here, not time"):
        MODELS["gpt"][0]().quantize("int8")
    monkeypatch.setattr(base, "int8_products_are_fast", lambda: True)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        MODELS["gpt"][0]().quantize("int8")
    assert not [w for w in said if "VNNI" in str(w.message)]


@pytest.mark.parametrize(
    "name, bad, argument, message",
    [
        ("gpt", lambda ids, _: ids.__setitem__((1, 2), 30), "token_ids", "vocabulary_size=30\\); received 30"),
        ("gpt", lambda ids, _: ids.__setitem__((0, 0), -1), "token_ids", "vocabulary_size=30\\); received -1"),
        ("decoder_lm", lambda ids, _: ids.__setitem__((1, 2), 30), "token_ids", "vocabulary_size=30\\); received 30"),
        ("bert_mlm", lambda ids, _: ids.__setitem__((0, 3), 31), "token_ids", "vocabulary_size=30\\); received 31"),
        (
            "bert_classifier",
            lambda _, segments: segments.__setitem__((1, 1), 2),
            "segment_ids",
            "num_segments=2\\); received 2",
        ),
        ("bert", lambda ids, _: ids.__setitem__((0, 0), 99), "token_ids", "vocabulary_size=30\\); received 99"),
        (
            "translator",
            lambda _, target: target.__setitem__((1, 4), 20),
            "target_ids",
            "target_vocabulary_size=20\\); received 20",
        ),
    ],
)
def test_ids_outside_their_table_are_refused_at_every_entry_point(rng, name, bad, argument, message):
    """An XLA gather reads an id outside its table silently (NaN on JAX, the nearest row on TensorFlow's
    XLA): NumPy inputs and eager backend tensors are checked before Keras runs the model, by argument name."""
    make, make_inputs = MODELS[name]
    model = make()
    first, second = (*make_inputs(rng), None)[:2]
    if name.startswith("bert"):
        second = rng.integers(0, 2, first.shape)
        inputs = {"token_ids": first, "segment_ids": second}
    else:
        inputs = {"source_ids": first, "target_ids": second} if name == "translator" else first
    model.predict(inputs, verbose=0)  # in range: computed
    bad(first, second)
    model.compile(optimizer="adam", loss="mse")
    error = f"{type(model).__name__}: `{argument}` must hold ids in \\[0, {message}"
    entry_points = [
        model,
        model.predict,
        model.predict_on_batch,
        model.fit,
        model.evaluate,
        model.train_on_batch,
        model.test_on_batch,
    ]
    for entry_point in entry_points:
        with pytest.raises(ValueError, match=error):
            entry_point(inputs)
    tensors = keras.tree.map_structure(keras.ops.convert_to_tensor, inputs)
    with pytest.raises(InputError, match=error) as info:  # eager backend tensors too, on every backend
        model(tensors)
    assert info.value.argument == argument
    if name == "translator":  # a (source, target) pair, or the target as the second argument
        for call in (
            lambda: model((first, second)),
            lambda: model(first, second),
            lambda: model(first, target_ids=second),
        ):
            with pytest.raises(ValueError, match=error):
                call()


LABELS = {  # name -> (labels in range, where one goes out of it, the setting named in the error, loss)
    "gpt": (lambda rng: rng.integers(0, 30, (2, 6)), (1, 2), "vocabulary_size=30", "token_cross_entropy"),
    "bert_mlm": (lambda rng: rng.integers(0, 30, (2, 6)), (0, 5), "vocabulary_size=30", "keras_ignoring_7"),
    "bert_classifier": (lambda rng: rng.integers(0, 2, (2,)), (1,), "num_classes=2", "sparse_categorical_crossentropy"),
    "translator": (lambda rng: rng.integers(0, 20, (2, 5)), (1, 4), "target_vocabulary_size=20", "keras_ignoring_7"),
    "vit": (lambda rng: rng.integers(0, 3, (2,)), (0,), "num_classes=3", "sparse_categorical_crossentropy"),
}


@pytest.mark.backend_independent  # NumPy labels checked before Keras' step: the same on every backend
@pytest.mark.parametrize("name", LABELS)
def test_labels_outside_the_logits_are_refused_by_sparse_losses(rng, name):
    """An XLA gather reads a label outside the logits silently (a finite, wrong loss on JAX, NaN on
    TensorFlow) and PyTorch names nothing: NumPy labels are checked against the model's classes."""
    make, make_inputs = MODELS[name]
    model = make()
    inputs = make_inputs(rng)
    x = {"source_ids": inputs[0], "target_ids": inputs[1]} if name == "translator" else inputs[0]
    make_labels, where, setting, loss = LABELS[name]
    ignored = None
    if loss == "token_cross_entropy":
        model.compile(optimizer="adam", loss=keras_tfm.TokenCrossEntropy(), **EAGER_ON_TF)
    elif loss == "sparse_categorical_crossentropy":
        model.compile(optimizer="adam", loss=loss, **EAGER_ON_TF)
    else:
        ignored = 7
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=7)
        model.compile(optimizer="adam", loss=loss, **EAGER_ON_TF)
    labels = make_labels(rng)
    model.train_on_batch(x, labels)  # in range: trained
    if ignored is not None:
        with_ignored = labels.copy()
        with_ignored[where] = ignored
        assert np.isfinite(model.test_on_batch(x, with_ignored))

    for wrong in (int(setting.split("=")[1]), -1):
        bad = labels.copy()
        bad[where] = wrong
        allowed = "" if ignored is None else " \\(or ignore_class=7\\)"
        error = (
            f"{type(model).__name__}: labels \\(`y`\\) must be ids in \\[0, {setting}\\){allowed} for a sparse "
            f"cross-entropy loss; received {wrong}\\."
        )
        for call in (
            lambda bad: model.fit(x, bad, epochs=1, verbose=0),
            lambda bad: model.fit(x, y=bad, verbose=0),
            lambda bad: model.fit(x, labels, validation_data=(x, bad), verbose=0),
            lambda bad: model.evaluate(x, bad, verbose=0),
            lambda bad: model.train_on_batch(x, bad),
            lambda bad: model.test_on_batch(x, y=bad),
        ):
            with pytest.raises(ValueError, match=error):
                call(bad)


DEFAULT_LOSSES = {  # name -> the loss a model comes compiled with (None: not compiled)
    "gpt": "TokenCrossEntropy",
    "decoder_lm": "TokenCrossEntropy",
    "bert_mlm": "TokenCrossEntropy",
    "bert_classifier": "SparseCategoricalCrossentropy",
    "bert": None,  # an encoder has no task, hence no loss
    "translator": "TokenCrossEntropy",
    "vit": "SparseCategoricalCrossentropy",
}


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", MODELS)
def test_every_model_with_a_task_comes_compiled_with_its_loss_adamw_and_accuracy(name):
    model = MODELS[name][0]()
    assert model.compiled == (DEFAULT_LOSSES[name] is not None)
    if not model.compiled:
        return
    assert type(model.loss).__name__ == DEFAULT_LOSSES[name]
    assert model.loss.from_logits
    assert isinstance(model.optimizer, keras.optimizers.AdamW)
    assert float(model.optimizer.learning_rate) == pytest.approx(model.default_learning_rate)
    if name == "translator":  # padded targets are ignored
        assert model.loss.ignore_class == model.pad_token_id
    model.compile(optimizer="sgd", loss="mse")  # an explicit compile replaces the defaults
    assert isinstance(model.optimizer, keras.optimizers.SGD) and model.loss == "mse"


@pytest.mark.parametrize("name", ["vit", "translator"])
def test_a_model_fits_as_made_and_its_keras_file_resumes_the_optimizer(tmp_path, rng, name):
    """`model.fit(x, y)` right after construction, as keras-hub's task models allow."""
    make, make_inputs = MODELS[name]
    model = make()
    inputs = make_inputs(rng)
    x = {"source_ids": inputs[0], "target_ids": inputs[1]} if name == "translator" else inputs[0]
    history = model.fit(x, LABELS[name][0](rng), epochs=2, batch_size=2, verbose=0).history
    assert np.all(np.isfinite(history["loss"])) and len(history["accuracy"]) == 2
    model.save(tmp_path / "model.keras")
    loaded = keras_tfm.load_model(tmp_path / "model.keras")
    assert type(loaded.loss).__name__ == DEFAULT_LOSSES[name]
    assert int(loaded.optimizer.iterations) == 2  # the optimizer's state came back with it


@pytest.mark.backend_independent  # the same NumPy check
def test_labels_are_left_to_other_losses(rng):
    """Only a sparse cross-entropy reads labels as class ids: a ViT regressing to numbers trains on."""
    make, make_inputs = MODELS["vit"]
    model = make()
    model.compile(optimizer="adam", loss="mse", **EAGER_ON_TF)
    targets = np.full((2, 3), 5.0, "float32")  # above num_classes=3, as values
    assert np.isfinite(model.train_on_batch(*make_inputs(rng), targets))


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", MODELS)
def test_the_config_holds_every_constructor_argument(name):
    """One `get_config` (the base class's) serves every model: each argument of the class's constructor
    (and of its bases') is in it, and the model made from it has the same config."""
    import inspect

    model = MODELS[name][0]()
    config = model.get_config()
    # a family's task model is made from flat arguments: the encoder's stand for `encoder` and `head`
    made_inside = ("encoder", "head") if isinstance(model, FlatArguments) else ()
    for klass in type(model).__mro__[: type(model).__mro__.index(keras_tfm.models.base.ZooModel)]:
        for parameter in inspect.signature(klass.__init__).parameters.values():
            if (
                parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)
                and parameter.name not in made_inside
            ):
                assert parameter.name in config or parameter.name in ("self", "default_name"), parameter.name
    assert type(model).from_config(config).get_config() == config


@pytest.mark.parametrize("name", ["gpt", "bert_classifier", "translator"])
def test_non_integer_ids_are_refused_not_truncated(rng, name):
    """A call would cast 1.9 to 1 and run; `generate` already refused such ids. Arrays, lists and backend
    tensors are checked by their dtype, without reading their values."""
    make, make_inputs = MODELS[name]
    model = make()
    inputs = make_inputs(rng)
    first = list(model._id_inputs())[0]
    for bad in (inputs[0] + 0.9, (inputs[0] + 0.9).tolist(), keras.ops.convert_to_tensor(inputs[0], "float32")):
        with pytest.raises(ValueError, match=rf"`{first}` must hold integer ids; received float\d+ values"):
            model(bad, *inputs[1:])
    with pytest.raises(ValueError, match=rf"`{first}` must hold integer ids; received float\d+ values"):
        model.predict((inputs[0] + 0.9, *inputs[1:]) if len(inputs) > 1 else inputs[0] + 0.9, verbose=0)


@pytest.mark.parametrize("name", ["gpt", "vit"])
def test_empty_inputs_are_refused_and_the_weights_kept(rng, name):
    """Keras' JAX trainer lost a trained model's weights on an empty array (0 rows); refused before
    Keras sees it, on every backend, with the weights as they were."""
    make, make_inputs = MODELS[name]
    model = make()
    inputs = make_inputs(rng)[0]
    labels = np.zeros(len(inputs), "int32") if name == "vit" else inputs
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer="adam", loss=loss, **EAGER_ON_TF)
    model.fit(inputs, labels, epochs=1, verbose=0)
    trained = model.get_weights()
    empty, no_labels = inputs[:0], labels[:0]
    for method, call in (
        ("predict", lambda: model.predict(empty, verbose=0)),
        ("evaluate", lambda: model.evaluate(empty, no_labels, verbose=0)),
        ("fit", lambda: model.fit(empty, no_labels, verbose=0)),
    ):
        with pytest.raises(ValueError, match=rf"\.{method}: `x` has no rows"):
            call()
    for after, before in zip(model.get_weights(), trained):
        np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("name", ["gpt", "bert_mlm"])
def test_load_weights_refuses_another_model_and_a_damaged_file(tmp_path, name):
    """Keras loaded the first block of a deeper model's file into a shallower one without a word."""
    make = MODELS[name][0]
    shallower = make()  # one block
    deeper = type(shallower).from_config({**shallower.get_config(), "num_layers": 2})
    deeper.save_weights(str(tmp_path / "deeper.weights.h5"))
    with pytest.raises(ValueError, match=r"deeper.weights.h5' holds the weights of another model: \d+ arrays"):
        shallower.load_weights(str(tmp_path / "deeper.weights.h5"))
    same = type(shallower).from_config(deeper.get_config())
    same.load_weights(str(tmp_path / "deeper.weights.h5"))
    for loaded, saved in zip(same.get_weights(), deeper.get_weights()):
        np.testing.assert_array_equal(loaded, saved)
    damaged = tmp_path / "damaged.weights.h5"
    damaged.write_bytes((tmp_path / "deeper.weights.h5").read_bytes()[:200])
    with pytest.raises(ValueError, match="damaged.weights.h5' is damaged or not a Keras weights file"):
        same.load_weights(str(damaged))
    with pytest.raises(CheckpointError, match="there is no file '.*missing.weights.h5'"):
        same.load_weights(str(tmp_path / "missing.weights.h5"))


@pytest.mark.parametrize("name", ["gpt", "bert", "translator"])
def test_ids_of_the_wrong_rank_length_or_batch_are_refused_by_name(rng, name):
    """Each ended deep in a layer (a position table's broadcast, PyTorch's einsum) without our names."""
    make, make_inputs = MODELS[name]
    model = make()
    inputs = make_inputs(rng)
    first, rest = inputs[0], inputs[1:]
    label = f"{type(model).__name__}: `{list(model._id_inputs())[0]}`"
    for bad, message in (
        (first[0], r"must have shape \(batch, length\); received shape \(6,\)"),
        (first[..., None], r"must have shape \(batch, length\); received shape \(2, 6, 1\)"),
        (first[:, :0], r"must hold at least one id per row; received shape \(2, 0\)"),
    ):
        with pytest.raises(ValueError, match=re.escape(label) + " " + message):
            model(bad, *rest)
    if rest:  # the translator's target
        with pytest.raises(ValueError, match=r"same batch size; received `source_ids` 2, `target_ids` 1"):
            model(first, rest[0][:1])


def test_load_model_names_a_damaged_or_missing_keras_file(tmp_path, rng):
    """Keras said "File not found" of a truncated, empty or random file that was there."""
    make, make_inputs = MODELS["gpt"]
    model = make()
    inputs = make_inputs(rng)
    model.save(tmp_path / "model.keras")  # builds it first, as the other methods that read weights
    np.testing.assert_allclose(
        to_numpy(keras_tfm.load_model(tmp_path / "model.keras")(*inputs)), to_numpy(model(*inputs)), atol=1e-6
    )
    whole = (tmp_path / "model.keras").read_bytes()
    for name, content in (("truncated", whole[: len(whole) // 2]), ("empty", b""), ("random", rng.bytes(4000))):
        (tmp_path / f"{name}.keras").write_bytes(content)
        with pytest.raises(ValueError, match=rf"load_model: '.*{name}.keras' is damaged or not a .keras file"):
            keras_tfm.load_model(tmp_path / f"{name}.keras")
    with pytest.raises(CheckpointError, match="load_model: there is no file '.*missing.keras'"):
        keras_tfm.load_model(tmp_path / "missing.keras")


@pytest.mark.backend_independent
def test_a_tokenizer_with_more_ids_than_the_vocabulary_is_refused_when_attached():
    """Its ids past the table would reach the embedding only at generation time, as a bare IndexError."""
    model = keras_tfm.GPT(vocabulary_size=5, max_length=8, num_layers=1, num_heads=1, hidden_dim=4)
    with pytest.raises(
        InputError, match=r"GPT: the tokenizer makes 8 ids, more than the model's vocabulary_size=5"
    ) as info:
        model.tokenizer = CharacterTokenizer.fit("abcdefgh")
    assert info.value.argument == "tokenizer" and model.tokenizer is None
    model.tokenizer = CharacterTokenizer.fit("abcde")
    assert model.tokenizer.vocabulary_size == 5
