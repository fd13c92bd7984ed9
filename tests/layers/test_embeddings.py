import numpy as np
import pytest

from keras_tfm.layers import PatchEmbedding, TokenEmbedding
from tests.checks import assert_close, to_numpy


def test_token_embedding_looks_up_and_reverse_is_tied(rng):
    layer = TokenEmbedding(vocabulary_size=20, hidden_dim=8)
    ids = rng.integers(0, 20, size=(3, 5))
    vectors = layer(ids)
    table = to_numpy(layer.embeddings)
    assert_close(vectors, table[ids])
    hidden = rng.normal(size=(3, 5, 8)).astype("float32")
    assert_close(layer(hidden, reverse=True), hidden @ table.T, atol=1e-5)


def test_token_embedding_mask_zero():
    layer = TokenEmbedding(vocabulary_size=20, hidden_dim=8, mask_zero=True)
    ids = np.array([[4, 5, 0, 0]])
    np.testing.assert_array_equal(to_numpy(layer.compute_mask(ids)), ids != 0)


def test_reverse_rejects_wrong_hidden_dim():
    layer = TokenEmbedding(vocabulary_size=20, hidden_dim=8)
    with pytest.raises(ValueError, match="hidden_dim=8.*received shape \\(2, 3, 5\\)"):
        layer(np.zeros((2, 3, 5), "float32"), reverse=True)


@pytest.mark.parametrize("option", [{"tie_weights": False}, {"logit_soft_cap": 30.0}])
def test_options_of_keras_reversible_embedding_it_does_not_compute_are_refused(option):
    # the reverse projection is this layer's own: it would silently ignore them
    with pytest.raises(ValueError, match="always tied and uncapped"):
        TokenEmbedding(vocabulary_size=20, hidden_dim=8, **option)


def test_patch_embedding_equals_cut_reshape_project(rng):
    patch, hidden = 4, 6
    images = rng.normal(size=(2, 8, 12, 3)).astype("float32")
    layer = PatchEmbedding(patch_size=patch, hidden_dim=hidden)
    tokens = to_numpy(layer(images))
    kernel, bias = [to_numpy(w) for w in layer.projection.weights]  # (P, P, C, D), (D,)
    rows, cols = 8 // patch, 12 // patch
    patches = images.reshape(2, rows, patch, cols, patch, 3).transpose(0, 1, 3, 2, 4, 5)
    patches = patches.reshape(2, rows * cols, patch * patch * 3)  # raster order, each patch flattened
    expected = patches @ kernel.reshape(patch * patch * 3, hidden) + bias
    assert tokens.shape == (2, 6, hidden)
    np.testing.assert_allclose(tokens, expected, atol=1e-5)
    pixels = rng.integers(0, 256, size=(2, 8, 12, 3)).astype("uint8")  # raw pixels work as their float values
    np.testing.assert_allclose(to_numpy(layer(pixels)), to_numpy(layer(pixels.astype("float32"))), atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 30, 32, 3), (1, 32, 30, 3)])
def test_patch_embedding_rejects_indivisible_image(shape):
    with pytest.raises(ValueError, match=r"multiple of patch_size=4.*received image shape"):
        PatchEmbedding(patch_size=4, hidden_dim=8)(np.zeros(shape, "float32"))


def test_patch_embedding_rejects_non_images():
    with pytest.raises(ValueError, match=r"\(batch, height, width, channels\)"):
        PatchEmbedding(patch_size=4, hidden_dim=8)(np.zeros((2, 16, 16), "float32"))
