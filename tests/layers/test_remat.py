"""Rematerialized blocks (`remat=True`) train exactly as stored ones, dropout included."""

import os

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.layers import DecoderBlock, EncoderBlock, TokenEmbedding
from tests.checks import to_numpy


@pytest.fixture
def remat_calls(monkeypatch):
    """Counts the functions handed to `keras.remat`: proof that the backward pass recomputes."""
    calls = []
    original = keras.remat

    def counted(function):
        calls.append(function)
        return original(function)

    monkeypatch.setattr(keras, "remat", counted)
    return calls


def _train(make_model, inputs, targets, loss, steps=2):
    keras.utils.set_random_seed(7)
    model = make_model()
    model.compile(keras.optimizers.SGD(0.05), loss, jit_compile="auto")
    losses = [float(to_numpy(model.train_on_batch(inputs, targets))) for _ in range(steps)]
    return model, losses, [to_numpy(w) for w in model.weights]


def _assert_same_training(make_model, inputs, targets, loss, remat_calls, expected_blocks):
    _, plain_losses, plain_weights = _train(lambda: make_model(False), inputs, targets, loss)
    assert not remat_calls
    model, losses, weights = _train(lambda: make_model(True), inputs, targets, loss)
    assert len(remat_calls) >= expected_blocks  # traced once per block (JAX, TensorFlow) or run each step
    assert all(layer.remat for layer in model._flatten_layers() if isinstance(layer, (EncoderBlock, DecoderBlock)))
    # Two steps: the second step's dropout masks come from seeds the first step advanced.
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    for w, w_plain, variable in zip(weights, plain_weights, model.weights):
        np.testing.assert_allclose(w, w_plain, atol=1e-5, err_msg=variable.path)


def test_blocks_with_dropout_and_masks_train_as_without_remat(rng, remat_calls):
    ids = rng.integers(1, 40, size=(2, 9)).astype("int32")
    ids[0, 6:] = 0  # padding: the embedding's Keras mask reaches both blocks through the checkpoint
    source = rng.normal(size=(2, 5, 16)).astype("float32")

    def make(remat):
        token_ids, encoder_output = keras.Input((9,), dtype="int32"), keras.Input((5, 16))
        x = TokenEmbedding(40, 16, mask_zero=True)(token_ids)
        x = EncoderBlock(4, 32, dropout=0.3, attention_dropout=0.3, remat=remat)(x)
        x = DecoderBlock(4, 32, dropout=0.3, attention_dropout=0.3, use_cross_attention=True, remat=remat)(
            x, encoder_output
        )
        return keras.Model([token_ids, encoder_output], keras.layers.Dense(3)(x))

    targets = rng.integers(0, 3, size=(2, 9))
    _assert_same_training(
        make,
        [ids, source],
        targets,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        remat_calls,
        expected_blocks=2,
    )


def _model_and_data(rng, model_name):
    """`make(remat)`, inputs, targets and loss of a small model of the family `model_name`."""
    ids = rng.integers(1, 50, size=(2, 12)).astype("int32")
    if model_name == "gpt":

        def make(remat):
            return keras_tfm.GPT(50, 16, num_layers=1, num_heads=2, hidden_dim=32, dropout=0.2, remat=remat)

        inputs, targets, loss = ids, ids, keras_tfm.TokenCrossEntropy()
    elif model_name == "bert":

        def make(remat):  # the masked LM: its last block computes only the masked positions
            return keras_tfm.BertMLM(
                vocabulary_size=50, max_length=16, num_layers=2, num_heads=2, hidden_dim=32, remat=remat
            )

        positions = np.array([[1, 4, 7], [0, 2, 11]], "int32")
        inputs = {"token_ids": ids, "padding_mask": ids > 5, "mask_positions": positions}
        targets, loss = np.take_along_axis(ids, positions, axis=1), keras_tfm.TokenCrossEntropy()
    elif model_name == "vit":

        def make(remat):
            return keras_tfm.ViT(
                image_size=16,
                patch_size=4,
                num_classes=3,
                num_layers=2,
                num_heads=2,
                hidden_dim=32,
                dropout=0.2,
                attention_dropout=0.2,
                remat=remat,
            )

        inputs, targets = rng.random((2, 16, 16, 3)).astype("float32"), np.array([0, 2])
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        source = rng.integers(3, 50, size=(2, 9)).astype("int32")
        source[0, 6:] = 0

        def make(remat):
            return keras_tfm.Translator(
                50,
                num_encoder_layers=2,
                num_decoder_layers=2,
                num_heads=2,
                hidden_dim=32,
                intermediate_dim=64,
                max_length=16,
                remat=remat,
            )

        inputs, targets, loss = {"source_ids": source, "target_ids": ids}, ids, keras_tfm.TokenCrossEntropy()
    return make, inputs, targets, loss


@pytest.mark.parametrize("model_name", ["gpt", "bert"])
def test_models_train_as_without_remat(rng, remat_calls, model_name):
    """The decoder, and BERT's masked LM whose last block computes only the masked positions. The blocks
    with cross-attention, dropout and masks train as without remat in the first test."""
    make, inputs, targets, loss = _model_and_data(rng, model_name)
    blocks = {"gpt": 1, "bert": 2}[model_name]
    _assert_same_training(make, inputs, targets, loss, remat_calls, expected_blocks=blocks)


@pytest.mark.backend_independent  # which blocks get the flag is Python; training under remat: the tests above
@pytest.mark.parametrize("model_name", ["vit", "translator"])
def test_models_hand_remat_to_every_block_and_keep_their_outputs(rng, model_name):
    """Without training (the blocks' own tests train): every block rematerialized, the outputs unchanged."""
    make, inputs, _, _ = _model_and_data(rng, model_name)
    plain, remat = make(False), make(True)
    expected = to_numpy(plain(inputs))
    remat(inputs)
    remat.set_weights(plain.get_weights())
    blocks = [layer for layer in remat._flatten_layers() if isinstance(layer, (EncoderBlock, DecoderBlock))]
    assert len(blocks) >= 2 and all(block.remat for block in blocks)
    np.testing.assert_allclose(to_numpy(remat(inputs)), expected, atol=1e-6)


def test_remat_under_mixed_precision(rng, remat_calls):
    keras.config.set_dtype_policy("mixed_bfloat16")
    ids = rng.integers(1, 50, size=(2, 12)).astype("int32")

    def make(remat):
        return keras_tfm.GPT(50, 16, num_layers=1, num_heads=2, hidden_dim=32, dropout=0.2, remat=remat)

    _assert_same_training(make, ids, ids, keras_tfm.TokenCrossEntropy(), remat_calls, expected_blocks=1)


def test_output_positions_and_masks_through_remat(rng):
    ids = rng.integers(1, 40, size=(2, 10)).astype("int32")
    ids[0, 7:] = 0
    positions = np.array([[1, 8], [0, 9]], "int32")
    embedding = TokenEmbedding(40, 16, mask_zero=True)
    x = embedding(ids)
    plain, remat = EncoderBlock(4, 32), EncoderBlock(4, 32, remat=True)
    plain.build(x.shape)
    remat.build(x.shape)
    remat.set_weights(plain.get_weights())
    for kwargs in ({}, {"output_positions": positions}):
        expected, got = plain(x, training=True, **kwargs), remat(x, training=True, **kwargs)
        np.testing.assert_allclose(to_numpy(got), to_numpy(expected), atol=1e-6)
        np.testing.assert_array_equal(
            to_numpy(keras.src.backend.get_keras_mask(got)), to_numpy(keras.src.backend.get_keras_mask(expected))
        )
    assert not to_numpy(keras.src.backend.get_keras_mask(got))[0, 1]  # position 8 of the first row is padding


def test_remat_property_config_and_saving(tmp_path):
    model = keras_tfm.GPT(50, 16, num_layers=2, num_heads=2, hidden_dim=32)
    assert not model.remat
    model.remat = True
    assert all(block.remat for block in model.blocks)
    assert model.get_config()["remat"] is True
    assert keras_tfm.GPT.from_config(model.get_config()).remat
    model.build()
    path = os.path.join(tmp_path, "gpt.keras")
    model.save(path)
    assert keras.saving.load_model(path).remat
    assert (
        keras_tfm.BertMLM(
            vocabulary_size=50, max_length=16, num_layers=1, num_heads=2, hidden_dim=32, remat=True
        ).get_config()["remat"]
        is True
    )
