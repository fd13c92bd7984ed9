import keras
import numpy as np
import pytest
from keras import ops

from keras_tfm.layers import MultiHeadAttention, kv_cache
from tests.checks import assert_close, to_numpy


def numpy_attention(layer, query, value, mask=None):
    """softmax(Q K^T / sqrt(d)) V per head, merged by W_o, in plain NumPy from the layer's weights."""

    def project(dense, x):
        kernel, bias = [to_numpy(w) for w in dense.weights]
        return x @ kernel + bias

    h, d, dv = layer.num_heads, layer.key_dim, layer.value_dim
    q = project(layer.query_dense, query).reshape(*query.shape[:2], h, d)
    k = project(layer.key_dense, value).reshape(*value.shape[:2], h, d)
    v = project(layer.value_dense, value).reshape(*value.shape[:2], h, dv)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    if mask is not None:
        logits = np.where(mask, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    merged = np.einsum("bhqk,bkhd->bqhd", weights, v).reshape(*query.shape[:2], h * dv)
    return project(layer.output_dense, merged), weights


@pytest.fixture
def x(rng):
    return rng.normal(size=(2, 7, 16)).astype("float32")


def test_matches_numpy_formula_both_paths(x):
    layer = MultiHeadAttention(num_heads=4, key_dim=8)
    fused = layer(x)
    explicit, weights = layer(x, return_attention_weights=True)
    expected, expected_weights = numpy_attention(layer, x, x)
    assert_close(fused, expected, atol=1e-5)
    assert_close(explicit, expected, atol=1e-5)
    assert_close(weights, expected_weights, atol=1e-6)


def test_cross_attention_matches_numpy(rng, x):
    source = rng.normal(size=(2, 5, 12)).astype("float32")
    layer = MultiHeadAttention(num_heads=2, key_dim=8, value_dim=6)
    output = layer(x, source)
    expected, _ = numpy_attention(layer, x, source)
    assert tuple(output.shape) == (2, 7, 16)
    assert_close(output, expected, atol=1e-5)


def test_weights_are_distributions_with_masked_entries_exactly_zero(x):
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    padding = np.array([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]], bool)
    _, weights = layer(x, value_mask=padding, use_causal_mask=True, return_attention_weights=True)
    weights = to_numpy(weights)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    visible = np.tril(np.ones((7, 7), bool))[None, None] & padding[:, None, None, :]
    assert np.all(weights[~np.broadcast_to(visible, weights.shape)] == 0.0)
    assert np.all(weights[np.broadcast_to(visible, weights.shape)] > 0.0)


def test_causal_outputs_ignore_the_future(rng, x):
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    changed = x.copy()
    changed[:, 4:] = rng.normal(size=changed[:, 4:].shape)
    before, after = to_numpy(layer(x, use_causal_mask=True)), to_numpy(layer(changed, use_causal_mask=True))
    np.testing.assert_allclose(before[:, :4], after[:, :4], atol=1e-6)
    assert not np.allclose(before[:, 4:], after[:, 4:], atol=1e-3)


def test_padding_mask_hides_pad_tokens(rng, x):
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    padding = np.array([[1] * 5 + [0] * 2, [1] * 7], bool)
    changed = x.copy()
    changed[0, 5:] = rng.normal(size=(2, 16))
    before = to_numpy(layer(x, value_mask=padding))
    after = to_numpy(layer(changed, value_mask=padding))
    np.testing.assert_allclose(before[0, :5], after[0, :5], atol=1e-6)
    np.testing.assert_allclose(before[1], after[1], atol=1e-6)
    unmasked = to_numpy(layer(changed))
    assert not np.allclose(before[0, :5], unmasked[0, :5], atol=1e-4)


def test_masks_combine_with_and(rng, x):
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    padding = np.array([[1] * 6 + [0], [1] * 4 + [0] * 3], bool)
    custom = rng.random((2, 7, 7)) > 0.3
    custom[:, :, 0] = True  # every query sees at least one key
    _, weights = layer(
        x, value_mask=padding, attention_mask=custom, use_causal_mask=True, return_attention_weights=True
    )
    allowed = padding[:, None, :] & custom & np.tril(np.ones((7, 7), bool))[None]
    out = layer(x, value_mask=padding, attention_mask=custom, use_causal_mask=True)
    expected, expected_weights = numpy_attention(layer, x, x, allowed[:, None])
    assert_close(weights, expected_weights, atol=1e-6)
    assert_close(out, expected, atol=1e-5)


def test_keras_mask_of_inputs_is_used(x):
    from keras_tfm.layers import TokenEmbedding

    ids = np.array([[3, 4, 5, 0, 0], [1, 2, 3, 4, 5]])
    embedding = TokenEmbedding(10, 16, mask_zero=True)
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    implicit = layer(embedding(ids))
    explicit = layer(embedding(ids), value_mask=ids != 0)
    assert_close(implicit, explicit, atol=1e-6)


def test_fully_masked_row_is_uniform_not_nan(x):
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    mask = np.ones((2, 7, 7), bool)
    mask[0, 3] = False
    _, weights = layer(x, attention_mask=mask, return_attention_weights=True)
    out = layer(x, attention_mask=mask)
    assert np.all(np.isfinite(to_numpy(out)))
    np.testing.assert_allclose(to_numpy(weights)[0, :, 3], 1 / 7, atol=1e-6)


def test_kv_cache_equals_full_attention(x):
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = np.zeros((2, 2, 2, 10, 8), "float32")  # (batch, k/v, heads, length, dim): room for more steps
    out, cache = layer(x[:, :3], use_causal_mask=True, cache=cache, cache_update_index=0)
    steps = [to_numpy(out)]
    for t in range(3, 7):
        out, cache = layer(x[:, t : t + 1], use_causal_mask=True, cache=cache, cache_update_index=t)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_precomputed_cross_attention_cache(rng, x):
    source = rng.normal(size=(2, 5, 16)).astype("float32")
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    expected = layer(x, source)
    cache = layer.precompute_key_value(source)
    out, same_cache = layer(x, cache=cache)
    assert_close(out, expected, atol=1e-6)
    assert_close(same_cache, cache)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"value_mask": np.ones((2, 6), bool)}, "value_mask"),
        ({"value_mask": np.ones((2, 7, 1), bool)}, "value_mask"),
        ({"attention_mask": np.ones((2, 7, 6), bool)}, "attention_mask"),
        ({"attention_mask": np.ones((2, 3, 7, 7), bool)}, "attention_mask"),
        ({"attention_mask": np.ones((7, 7), bool)}, "attention_mask"),
    ],
)
def test_mismatched_mask_shapes_raise(x, kwargs, message):
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    with pytest.raises(ValueError, match=message) as error:
        layer(x, **kwargs)
    assert "received shape" in str(error.value)


def test_cache_needs_equal_key_and_value_dims(x):
    layer = MultiHeadAttention(num_heads=2, key_dim=8, value_dim=4)
    with pytest.raises(ValueError, match="value_dim"):
        layer(x, cache=np.zeros((2, 2, 2, 7, 8), "float32"), cache_update_index=0)


def test_cache_of_the_wrong_layout_is_refused(x):
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    with pytest.raises(ValueError, match=r"cache.*\(batch, 2, 2, cache_length, 8\).*\(2, 2, 10, 2, 8\)"):
        layer(x[:, :1], cache=np.zeros((2, 2, 10, 2, 8), "float32"), cache_update_index=0)  # length before heads


def test_keys_and_values_of_other_lengths_or_batches_are_refused(x):
    """PyTorch broadcast a length-1 value over the keys and returned numbers."""
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    with pytest.raises(
        ValueError, match=r"`key` and `value` must have the same batch and length; .*\(2, 5, 16\) and \(2, 1, 16\)"
    ):
        layer(x, x[:, :1], key=x[:, :5])
    with pytest.raises(
        ValueError, match=r"`value` must have shape \(batch, length, features\) with the query's batch 2"
    ):
        layer(x, x[:1])


def test_a_cache_write_beyond_the_cache_is_refused(x):
    """The write was clamped into the cache: the step's keys overwrote the last positions silently."""
    from keras_tfm.layers import DecoderBlock

    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    cache = np.zeros((2, 2, 2, 4, 8), "float32")
    layer(x[:, :1], use_causal_mask=True, cache=cache, cache_update_index=3)  # the last position: fine
    for index, new in ((4, 1), (3, 2), (-1, 1)):
        with pytest.raises(
            ValueError, match=rf"`cache_update_index` must leave room .* in \[0, {4 - new}\]; received {index}"
        ):
            layer(x[:, :new], use_causal_mask=True, cache=cache, cache_update_index=index)
    block = DecoderBlock(num_heads=2, intermediate_dim=32)
    with pytest.raises(ValueError, match="`cache_update_index` must leave room for the 1 new positions"):
        block(x[:, :1], self_attention_cache=cache, cache_update_index=4)
    with pytest.raises(ValueError, match="`cache_update_index` must leave room"):
        block.update_cache(x[:, :2], cache, 3)


def test_dropout_on_weights_only_in_training(x):
    layer = MultiHeadAttention(num_heads=2, key_dim=8, dropout=0.5)
    inference = to_numpy(layer(x))
    assert_close(layer(x, training=False), inference, atol=1e-6)
    assert not np.allclose(to_numpy(layer(x, training=True)), inference, atol=1e-4)
    assert np.all(np.isfinite(to_numpy(ops.convert_to_tensor(inference))))


def test_compiled_training_and_prediction_with_unknown_lengths(rng):
    # `keras.Input((None, 16))` and Keras' `fit` leave length and batch unknown where TensorFlow
    # traces; dropout in training takes the unfused path, which builds the causal mask itself.
    layer = MultiHeadAttention(num_heads=2, key_dim=8, dropout=0.1)
    tokens, padding = keras.Input((None, 16)), keras.Input((None,), dtype="bool")
    model = keras.Model([tokens, padding], [layer(tokens, use_causal_mask=True), layer(tokens, value_mask=padding)])
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    for length in (7, 5):
        x = rng.normal(size=(4, length, 16)).astype("float32")
        mask = np.arange(length)[None] < np.array([[length], [length - 1], [3], [2]])
        history = model.fit([x, mask], [x, x], batch_size=3, verbose=0)
        assert np.isfinite(history.history["loss"][0])
        for predicted, called in zip(model.predict([x, mask], batch_size=4, verbose=0), model([x, mask])):
            assert_close(predicted, called, atol=1e-5)


def test_a_cache_update_makes_a_new_cache_unless_a_decoding_loop_writes_in_place(x):
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    cache, index = ops.zeros((2, 2, 2, 10, 8)), ops.convert_to_tensor(2, "int32")
    _, updated = layer(x[:, :3], use_causal_mask=True, cache=cache, cache_update_index=index)
    assert not np.any(to_numpy(cache))  # the layer's own call leaves its input as it was
    assert np.all(np.any(to_numpy(updated)[:, :, :, 2:5] != 0, axis=-1)) and not np.any(to_numpy(updated)[:, :, :, 5:])
    if keras.backend.backend() == "torch":  # the traced decoding loops write in place: the same values
        from keras_tfm.generation import compiled

        with kv_cache.cache_writer(compiled._write_in_place):
            _, in_place = layer(x[:, :3], use_causal_mask=True, cache=cache, cache_update_index=index)
        assert in_place is cache
        np.testing.assert_array_equal(to_numpy(in_place), to_numpy(updated))
