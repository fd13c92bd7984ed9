import keras
import numpy as np
import pytest

from keras_tfm.layers import LearnedPositionEmbedding, SinusoidalPositionEncoding, SinusoidalPositionEncoding2D
from tests.checks import check_config_round_trip, check_saved_model_round_trip, to_numpy


def closed_form(length, dim, start=0, wavelength=10000.0):
    pe = np.zeros((length, dim))
    for p in range(length):
        for i in range(dim // 2):
            angle = (p + start) / wavelength ** (2 * i / dim)
            pe[p, 2 * i], pe[p, 2 * i + 1] = np.sin(angle), np.cos(angle)
    return pe


def test_sinusoids_match_closed_form():
    x = np.zeros((2, 12, 10), "float32")
    np.testing.assert_allclose(to_numpy(SinusoidalPositionEncoding()(x))[1], closed_form(12, 10), atol=1e-5)
    shifted = to_numpy(SinusoidalPositionEncoding()(x[:, :3], start_index=9))[0]
    np.testing.assert_allclose(shifted, closed_form(12, 10)[9:], atol=1e-5)
    each = to_numpy(SinusoidalPositionEncoding()(x[:, :2], start_index=keras.ops.convert_to_tensor([3, 7])))
    np.testing.assert_allclose(each, closed_form(12, 10)[[[3, 4], [7, 8]]], atol=1e-5)  # each row its own


def test_concatenated_layout_is_sines_then_cosines():
    x = np.zeros((1, 6, 8), "float32")
    pe = closed_form(6, 8)
    out = to_numpy(SinusoidalPositionEncoding(interleave=False)(x))[0]
    np.testing.assert_allclose(out, np.concatenate([pe[:, 0::2], pe[:, 1::2]], -1), atol=1e-5)


def test_sinusoids_2d_encode_row_then_column():
    rows, cols, dim = 3, 4, 16
    tokens = np.zeros((2, rows * cols, dim), "float32")
    out = to_numpy(SinusoidalPositionEncoding2D()(tokens, grid_shape=(rows, cols)))[0]
    row_pe, col_pe = closed_form(rows, dim // 2), closed_form(cols, dim // 2)
    as_halves = lambda pe: np.concatenate([pe[:, 0::2], pe[:, 1::2]], -1)  # noqa: E731
    for r in range(rows):
        for c in range(cols):
            expected = np.concatenate([as_halves(row_pe)[r], as_halves(col_pe)[c]])
            np.testing.assert_allclose(out[r * cols + c], expected, atol=1e-5)
    grid = to_numpy(SinusoidalPositionEncoding2D()(np.zeros((1, rows, cols, dim), "float32")))[0]
    np.testing.assert_allclose(grid.reshape(rows * cols, dim), out, atol=1e-6)


def test_sinusoids_2d_errors():
    layer = SinusoidalPositionEncoding2D()
    with pytest.raises(ValueError, match="grid_shape"):
        layer(np.zeros((1, 12, 8), "float32"))
    with pytest.raises(ValueError, match=r"`grid_shape`=\(3, 3\) has 9 cells but `inputs` has 12"):
        layer(np.zeros((1, 12, 8), "float32"), grid_shape=(3, 3))
    with pytest.raises(ValueError, match="divisible by 4"):
        layer(np.zeros((1, 12, 6), "float32"), grid_shape=(3, 4))


def test_learned_positions_slice_the_table():
    layer = LearnedPositionEmbedding(max_length=10)
    x = np.zeros((2, 4, 6), "float32")
    out = to_numpy(layer(x))
    table = to_numpy(layer.embeddings)
    np.testing.assert_allclose(out[1], table[:4])
    np.testing.assert_allclose(to_numpy(layer(x[:, :2], start_index=5))[0], table[5:7])


def test_learned_positions_reject_long_sequences():
    layer = LearnedPositionEmbedding(max_length=10)
    with pytest.raises(ValueError, match=r"sequence length 11 .* exceeds max_length=10"):
        layer(np.zeros((1, 11, 6), "float32"))
    with pytest.raises(ValueError, match=r"length 3 starting at position 8 exceeds max_length=10"):
        layer(np.zeros((1, 3, 6), "float32"), start_index=8)


def test_odd_hidden_dim_rejected():
    with pytest.raises(ValueError, match="even hidden_dim"):
        SinusoidalPositionEncoding()(np.zeros((1, 3, 5), "float32"))


@pytest.mark.parametrize(
    "make, kwargs",
    [
        (lambda: SinusoidalPositionEncoding(max_wavelength=500.0, interleave=False), {}),
        (lambda: SinusoidalPositionEncoding2D(max_wavelength=100.0), {"grid_shape": (2, 4)}),
        (lambda: LearnedPositionEmbedding(max_length=12), {}),
    ],
)
def test_position_layers_round_trip(make, kwargs, tmp_path, rng):
    x = rng.normal(size=(2, 8, 12)).astype("float32")
    check_config_round_trip(make(), (x,), kwargs)
    check_saved_model_round_trip(make(), (x,), kwargs, tmp_path)


def test_position_layers_pass_mask_through():
    from keras_tfm.layers import TokenEmbedding

    ids = np.array([[5, 6, 0]])
    x = TokenEmbedding(10, 8, mask_zero=True)(ids)
    for layer in (SinusoidalPositionEncoding(), LearnedPositionEmbedding(4)):
        out = layer(x)
        np.testing.assert_array_equal(to_numpy(keras.src.backend.get_keras_mask(out)), ids != 0)
