import numpy as np
import pytest

from keras_tfm.layers import DecoderBlock, EncoderBlock
from tests.checks import assert_close, to_numpy


@pytest.fixture
def x(rng):
    return rng.normal(size=(2, 6, 16)).astype("float32")


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_stack_without_positions_is_permutation_equivariant(rng, x, norm_first):
    blocks = [EncoderBlock(num_heads=4, intermediate_dim=32, norm_first=norm_first) for _ in range(2)]

    def stack(h):
        for block in blocks:
            h = block(h)
        return to_numpy(h)

    permutation = rng.permutation(6)
    np.testing.assert_allclose(stack(x[:, permutation]), stack(x)[:, permutation], atol=1e-5)


def test_pre_norm_block_follows_its_equation(x):
    block = EncoderBlock(num_heads=4, intermediate_dim=32, norm_first=True)
    out = block(x)
    y = x + to_numpy(block.self_attention(block.self_attention_norm(x)))
    expected = y + to_numpy(block.feed_forward(block.feed_forward_norm(y)))
    assert_close(out, expected, atol=1e-5)


def test_post_norm_block_follows_its_equation(x):
    block = EncoderBlock(num_heads=4, intermediate_dim=32, norm_first=False)
    out = block(x)
    z = to_numpy(block.self_attention_norm(x + to_numpy(block.self_attention(x))))
    expected = block.feed_forward_norm(z + to_numpy(block.feed_forward(z)))
    assert_close(out, expected, atol=1e-5)


def test_decoder_block_with_cross_attention_follows_its_equation(rng, x):
    source = rng.normal(size=(2, 4, 16)).astype("float32")
    block = DecoderBlock(num_heads=4, intermediate_dim=32, use_cross_attention=True, norm_first=False)
    out = block(x, source)
    z = to_numpy(block.self_attention_norm(x + to_numpy(block.self_attention(x, use_causal_mask=True))))
    c = to_numpy(block.cross_attention_norm(z + to_numpy(block.cross_attention(z, source))))
    expected = block.feed_forward_norm(c + to_numpy(block.feed_forward(c)))
    assert_close(out, expected, atol=1e-5)


def test_encoder_padding_invariance(rng, x):
    block = EncoderBlock(num_heads=4, intermediate_dim=32)
    padding = np.array([[1, 1, 1, 1, 0, 0], [1] * 6], bool)
    changed = x.copy()
    changed[0, 4:] = rng.normal(size=(2, 16))
    before, after = to_numpy(block(x, padding_mask=padding)), to_numpy(block(changed, padding_mask=padding))
    np.testing.assert_allclose(before[0, :4], after[0, :4], atol=1e-5)
    np.testing.assert_allclose(before[1], after[1], atol=1e-5)


@pytest.mark.parametrize("use_cross_attention", [False, True])
def test_decoder_is_causal(rng, x, use_cross_attention):
    source = rng.normal(size=(2, 4, 16)).astype("float32") if use_cross_attention else None
    block = DecoderBlock(num_heads=4, intermediate_dim=32, use_cross_attention=use_cross_attention)
    changed = x.copy()
    changed[:, 3:] = rng.normal(size=(2, 3, 16))
    before, after = to_numpy(block(x, source)), to_numpy(block(changed, source))
    np.testing.assert_allclose(before[:, :3], after[:, :3], atol=1e-5)
    assert not np.allclose(before[:, 3:], after[:, 3:], atol=1e-3)


def test_cross_attention_ignores_padded_source(rng, x):
    source = rng.normal(size=(2, 5, 16)).astype("float32")
    source_padding = np.array([[1, 1, 1, 0, 0], [1] * 5], bool)
    changed = source.copy()
    changed[0, 3:] = rng.normal(size=(2, 16))
    block = DecoderBlock(num_heads=4, intermediate_dim=32, use_cross_attention=True)
    before = block(x, source, encoder_padding_mask=source_padding)
    after = block(x, changed, encoder_padding_mask=source_padding)
    assert_close(before, after, atol=1e-5)


def test_decoder_cache_equals_full_pass(rng, x):
    source = rng.normal(size=(2, 4, 16)).astype("float32")
    block = DecoderBlock(num_heads=4, intermediate_dim=32, use_cross_attention=True)
    full = to_numpy(block(x, source))
    self_cache = np.zeros((2, 2, 4, 8, 4), "float32")
    cross_cache = block.cross_attention.precompute_key_value(source)
    out, self_cache, cross_cache = block(
        x[:, :2], self_attention_cache=self_cache, cache_update_index=0, cross_attention_cache=cross_cache
    )
    outputs = [to_numpy(out)]
    for t in range(2, 6):
        out, self_cache, cross_cache = block(
            x[:, t : t + 1],
            self_attention_cache=self_cache,
            cache_update_index=t,
            cross_attention_cache=cross_cache,
        )
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)


@pytest.mark.parametrize("norm_first", [True, False])
def test_update_cache_gives_the_cache_of_a_full_call(rng, x, norm_first):
    source = rng.normal(size=(2, 4, 16)).astype("float32")
    block = DecoderBlock(num_heads=4, intermediate_dim=32, use_cross_attention=True, norm_first=norm_first)
    block(x, source)  # builds the weights
    cross_cache = block.cross_attention.precompute_key_value(source)
    cache = rng.normal(size=(2, 2, 4, 8, 4)).astype("float32")  # earlier entries must survive
    _, expected, _ = block(
        x[:, :3], self_attention_cache=cache, cache_update_index=2, cross_attention_cache=cross_cache
    )
    updated = block.update_cache(x[:, :3], cache, 2)
    assert tuple(updated.shape) == (2, 2, 4, 8, 4)
    assert_close(updated, expected, atol=1e-6)
    assert not np.allclose(to_numpy(updated)[:, :, :, 2:5], cache[:, :, :, 2:5])


def test_blocks_return_attention_weights(rng, x):
    source = rng.normal(size=(2, 4, 16)).astype("float32")
    _, weights = EncoderBlock(num_heads=4, intermediate_dim=32)(x, return_attention_weights=True)
    assert tuple(weights.shape) == (2, 4, 6, 6)
    block = DecoderBlock(num_heads=4, intermediate_dim=32, use_cross_attention=True)
    out, self_weights, cross_weights = block(x, source, return_attention_weights=True)
    assert tuple(self_weights.shape) == (2, 4, 6, 6) and tuple(cross_weights.shape) == (2, 4, 6, 4)
    assert np.all(np.triu(to_numpy(self_weights)[0, 0], k=1) == 0)
    assert_close(out, block(x, source), atol=1e-5)


def test_hidden_dim_must_divide_by_heads(x):
    with pytest.raises(ValueError, match="hidden_dim=16, num_heads=3"):
        EncoderBlock(num_heads=3, intermediate_dim=32)(x)
    assert EncoderBlock(num_heads=3, intermediate_dim=32, key_dim=8)(x).shape == x.shape


def test_decoder_block_cross_attention_arguments_checked(x):
    with pytest.raises(ValueError, match="needs `encoder_sequence`"):
        DecoderBlock(num_heads=4, intermediate_dim=32, use_cross_attention=True)(x)
    with pytest.raises(ValueError, match="use_cross_attention=False"):
        DecoderBlock(num_heads=4, intermediate_dim=32)(x, x)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("first_value", [0.5, np.nan])
def test_training_without_dropout_gives_the_inference_output(rng, x, norm_first, first_value):
    # In training the residual stream goes through a conditional (computed once under XLA); both of its
    # branches, taken on a finite or a non-finite first element, must return the stream unchanged.
    x = x.copy()
    x[0, 0, 0] = first_value
    encoder = EncoderBlock(num_heads=4, intermediate_dim=32, norm_first=norm_first)
    decoder = DecoderBlock(num_heads=4, intermediate_dim=32, norm_first=norm_first, use_cross_attention=True)
    source = rng.normal(size=(2, 5, 16)).astype("float32")
    np.testing.assert_array_equal(to_numpy(encoder(x, training=True)), to_numpy(encoder(x, training=False)))
    np.testing.assert_array_equal(
        to_numpy(decoder(x, source, training=True)), to_numpy(decoder(x, source, training=False))
    )
    assert np.isfinite(to_numpy(encoder(x, training=True))[1]).all()


@pytest.mark.parametrize("norm_first", [True, False])
def test_output_positions_give_the_full_output_at_those_positions(rng, x, norm_first):
    block = EncoderBlock(num_heads=4, intermediate_dim=32, norm_first=norm_first)
    padding = np.array([[1, 1, 1, 1, 0, 0], [1] * 6], bool)
    attention = rng.random((2, 6, 6)) < 0.7
    attention[:, np.arange(6), np.arange(6)] = True
    positions = np.array([[3, 0, 1], [5, 2, 2]])
    for training in (False, True):  # no dropout: training differs only by the residual conditional
        full = to_numpy(block(x, padding_mask=padding, attention_mask=attention, training=training))
        selected = block(
            x, padding_mask=padding, attention_mask=attention, output_positions=positions, training=training
        )
        assert tuple(selected.shape) == (2, 3, 16)
        assert_close(selected, np.take_along_axis(full, positions[..., None], axis=1), atol=1e-5)


def test_output_positions_gather_the_keras_mask_and_are_checked(rng, x):
    import keras

    from keras_tfm.layers import TokenEmbedding

    ids = np.array([[5, 6, 7, 0, 0, 0], [1, 2, 3, 4, 5, 6]])
    h = TokenEmbedding(10, 16, mask_zero=True)(ids)
    block = EncoderBlock(num_heads=4, intermediate_dim=32)
    y = block(h, output_positions=np.array([[0, 4], [1, 5]]))
    mask = keras.src.backend.get_keras_mask(y)
    np.testing.assert_array_equal(to_numpy(mask), [[True, False], [True, True]])
    with pytest.raises(ValueError, match=r"`output_positions` must have shape \(batch, num_positions\)"):
        block(x, output_positions=np.zeros((3, 2), "int32"))
    rotating = EncoderBlock(num_heads=4, intermediate_dim=32, rotary_embedding={"max_wavelength": 100.0})
    with pytest.raises(ValueError, match=r"output_positions: EncoderBlock: .*rotary_embedding"):
        rotating(x, output_positions=np.zeros((x.shape[0], 2), "int32"))
