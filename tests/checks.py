"""The checks every layer and model must pass, written once: config round trip, `.keras` round
trip, a compiled fit step, and mixed precision; and the tiny language models the command-line and server
tests share."""

from __future__ import annotations

import os
import string

import keras
import numpy as np
from keras import ops

import keras_tfm
from keras_tfm.data import CharacterTokenizer


def to_numpy(x):
    return ops.convert_to_numpy(x)


def one_program(fn):
    """`fn` as one compiled program on JAX, whose operations run one by one each compile for their shapes (a
    test of a few sampling calls: 12 s against 1 s); as it is on TensorFlow and PyTorch, which compile none."""
    if keras.backend.backend() != "jax":
        return fn
    import jax

    return jax.jit(fn)


def first(outputs):
    """The first output of a tuple or list, the first value of a dict (a head's named outputs)."""
    if isinstance(outputs, dict):
        return next(iter(outputs.values()))
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def functional_model(layer, args, kwargs=None) -> keras.Model:
    inputs = [keras.Input(shape=a.shape[1:], batch_size=a.shape[0], dtype=str(a.dtype)) for a in args]
    outputs = first(layer(*inputs, **(kwargs or {})))
    return keras.Model(inputs, outputs)


def assert_close(actual, expected, atol=1e-5, rtol=1e-5):
    np.testing.assert_allclose(to_numpy(actual), to_numpy(expected), atol=atol, rtol=rtol)


def check_config_round_trip(layer, args, kwargs=None):
    kwargs = kwargs or {}
    expected = first(layer(*args, **kwargs))
    clone = type(layer).from_config(layer.get_config())
    first(clone(*args, **kwargs))
    clone.set_weights(layer.get_weights())
    assert clone.get_config() == layer.get_config()
    assert_close(first(clone(*args, **kwargs)), expected)


def check_saved_model_round_trip(layer, args, kwargs, tmp_path):
    # Called directly: `predict` would compile the model and then the loaded one, where the eager
    # calls reuse what the config round trip on the same inputs compiled.
    model = functional_model(layer, args, kwargs)
    expected = model(list(args))
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert_close(loaded(list(args)), expected)


def check_fit_step(layer, args, kwargs=None):
    """Two compiled training steps: finite loss, and the layer's weights move.

    Compiled as Keras does by default on a CPU: XLA on JAX, a `tf.function` graph on TensorFlow (its XLA
    compile, 10-20 s a model here, is tested once for every layer by the every-layer model's fit in
    `tests/layers/test_all_layers.py` and for whole models by the recipes), eager on PyTorch, where
    `jit_compile=True` means torch.compile (about 30 s a model on 2 CPU cores, and not what the runtime uses).
    """
    model = functional_model(layer, args, kwargs)
    target_shape = model.output.shape[1:]
    jit = keras.backend.backend() == "jax"
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=jit)
    before = [to_numpy(w).copy() for w in layer.trainable_weights]
    target = np.ones((args[0].shape[0], *target_shape), "float32")
    history = model.fit(list(args), target, epochs=2, batch_size=args[0].shape[0], verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    after = [to_numpy(w) for w in layer.trainable_weights]
    assert any(not np.allclose(a, b) for a, b in zip(before, after)), "no weight changed"


def check_mixed_precision(make_layer, args, kwargs=None, policies=("mixed_bfloat16", "mixed_float16")):
    for policy in policies:
        layer = make_layer(dtype=policy)
        output = first(layer(*args, **(kwargs or {})))
        compute_dtype = keras.DTypePolicy(policy).compute_dtype
        assert keras.backend.standardize_dtype(output.dtype) == compute_dtype, policy
        assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in layer.weights)
        assert np.all(np.isfinite(to_numpy(ops.cast(output, "float32")))), policy


def run_layer_checks(make_layer, args, kwargs=None, tmp_path=None, mixed_precision=True, fit=True):
    """All common checks for a layer made by `make_layer(**layer_kwargs)` called as `layer(*args, **kwargs)`
    (`fit=False`: no training step, where a model holding the layer trains it)."""
    check_config_round_trip(make_layer(), args, kwargs)
    if tmp_path is not None:
        check_saved_model_round_trip(make_layer(), args, kwargs, tmp_path)
    if fit:
        check_fit_step(make_layer(), args, kwargs)
    if mixed_precision:
        check_mixed_precision(make_layer, args, kwargs)


def all_layers_model(vocabulary_size=50, hidden_dim=32, length=8, image_size=16) -> keras.Model:
    """A small functional model that uses every layer of `keras_tfm.layers` once."""
    from keras_tfm import layers

    ids = keras.Input((length,), dtype="int32", name="ids")
    images = keras.Input((image_size, image_size, 3), name="images")
    embedding = layers.TokenEmbedding(vocabulary_size, hidden_dim, mask_zero=True)
    tokens = embedding(ids)
    tokens = tokens + layers.LearnedPositionEmbedding(length)(tokens)
    tokens = tokens + layers.SinusoidalPositionEncoding()(tokens)
    tokens = layers.EncoderBlock(4, 2 * hidden_dim, norm_first=False, dropout=0.1)(tokens)
    patches = layers.PatchEmbedding(4, hidden_dim)(images)
    grid = image_size // 4
    patches = patches + layers.SinusoidalPositionEncoding2D()(patches, grid_shape=(grid, grid))
    patches = layers.EncoderBlock(4, 2 * hidden_dim)(patches)
    decoded = layers.DecoderBlock(4, 2 * hidden_dim, use_cross_attention=True)(tokens, patches)
    decoded = layers.DecoderBlock(  # the Llama form: RMSNorm, grouped-query attention with RoPE, SwiGLU
        4,
        2 * hidden_dim,
        num_key_value_heads=2,
        normalization="rms_norm",
        gated_feed_forward=True,
        activation="silu",
        rotary_embedding={"max_wavelength": 100.0},
        sliding_window=length // 2,
        query_key_norm_epsilon=1e-6,
    )(decoded)
    decoded = decoded + layers.MultiHeadAttention(2, 8)(decoded, patches)
    decoded = layers.FeedForward(2 * hidden_dim, activation="gelu_approximate")(decoded)
    logits = embedding(decoded, reverse=True)
    return keras.Model([ids, images], logits)


def bert_vocabulary(text: str) -> list[str]:
    """Special tokens, whole lowercase words of `text`, and every character alone and as a ##suffix."""
    words = sorted({word.strip(string.punctuation).lower() for word in text.split()} - {""})
    characters = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words[:300], *characters, *("##" + c for c in characters)]
    return list(dict.fromkeys(tokens))


def count_of_size(size_function, num_layers: int, vocabulary_size: int, **arguments) -> int:
    """The parameters of `size_function(**arguments)`, counted from three small builds instead of the whole model:
    one block over a one-token vocabulary, then a second block, then a second token; the rest repeats those."""
    one, two, wider = (
        size_function(num_layers=layers, vocabulary_size=rows, **arguments).count_params()
        for layers, rows in ((1, 1), (2, 1), (1, 2))
    )
    return one + (num_layers - 1) * (two - one) + (vocabulary_size - 1) * (wider - one)


def saved_language_model(path, max_length: int) -> keras_tfm.DecoderLM:
    """A tiny character-level language model with its tokenizer, saved as a `.keras` file at `path`."""
    model = keras_tfm.DecoderLM(
        vocabulary_size=28, max_length=max_length, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16
    )
    model.tokenizer = CharacterTokenizer.fit("abcdefghijklmnopqrstuvwxyz .")
    model.save(path)
    return model


def chat_model(max_length: int) -> keras_tfm.DecoderLM:
    """A tiny character-level language model whose tokenizer has a chat template."""
    import tokenizers

    from keras_tfm.data import HuggingFaceTokenizer

    characters = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({c: i for i, c in enumerate(" <>abcdefghijklmnopqrstuvwxyz")}, unk_token=" ")
    )
    characters.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    characters.decoder = tokenizers.decoders.Fuse()
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    model = keras_tfm.DecoderLM(
        vocabulary_size=29, max_length=max_length, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16
    )
    model.tokenizer = HuggingFaceTokenizer(characters.to_str(), chat_template=template)
    return model
