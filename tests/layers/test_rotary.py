"""Rotary positions, grouped-query attention, sliding windows and QK-norm, against their definitions and
transformers' own frequency functions."""

import numpy as np
import pytest

from keras_tfm import layers
from tests.checks import assert_close, check_config_round_trip, to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HEAD_DIM = 16


def hf_inverse_frequencies(rope_parameters: dict, max_position_embeddings: int = 64, seq_len=None):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=4 * HEAD_DIM,
        num_attention_heads=4,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope_parameters,
    )
    rope_type = rope_parameters["rope_type"]
    if rope_type == "default":
        inv_freq, scale = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(
            config
        )
    else:
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
    return inv_freq.numpy(), scale


SCALINGS = {
    "default": ({"rope_type": "default", "rope_theta": 10000.0}, dict(max_wavelength=10000.0)),
    "linear": (
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        dict(scaling="linear", scaling_factor=4.0),
    ),
    "llama3": (
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        dict(max_wavelength=500000.0, scaling="llama3", scaling_factor=8.0, original_max_length=16),
    ),
    "yarn": (
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16},
        dict(scaling="yarn", scaling_factor=4.0, original_max_length=16),
    ),
}


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_frequencies_and_scale_are_transformers(name):
    hf_parameters, ours = SCALINGS[name]
    expected, expected_scale = hf_inverse_frequencies(hf_parameters)
    inv_freq, scale = layers.RotaryEmbedding(**ours).inverse_frequencies(HEAD_DIM)
    np.testing.assert_allclose(inv_freq, expected, rtol=1e-6)
    assert scale == pytest.approx(expected_scale)


@pytest.mark.parametrize("length", [40, 100])
def test_dynamic_scaling_grows_the_base_past_the_trained_length_as_transformers(length):
    rope = layers.RotaryEmbedding(scaling="dynamic", scaling_factor=2.0, original_max_length=64)
    expected, _ = hf_inverse_frequencies({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, seq_len=length)
    cos, sin = rope.cos_sin(length, HEAD_DIM)
    angles = np.arange(length, dtype="float32")[:, None] * expected[None, :]
    np.testing.assert_allclose(to_numpy(cos)[:, : HEAD_DIM // 2], np.cos(angles), atol=2e-5)
    np.testing.assert_allclose(to_numpy(sin)[:, HEAD_DIM // 2 :], np.sin(angles), atol=2e-5)


def test_rotation_is_transformers_rotate_half_and_scores_depend_on_distance_only(rng):
    rope = layers.RotaryEmbedding(max_wavelength=100.0)
    x = rng.normal(size=(1, 6, 2, HEAD_DIM)).astype("float32")
    rotated = to_numpy(rope(x, start_index=3))
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inv_freq = 1.0 / (100.0 ** (np.arange(0, HEAD_DIM, 2, dtype="float32") / HEAD_DIM))
    angles = np.arange(3, 9, dtype="float32")[:, None] * inv_freq
    emb = torch.tensor(np.concatenate([angles, angles], -1))[None]
    q = torch.tensor(x).transpose(1, 2)
    expected, _ = apply_rotary_pos_emb(q, q, emb.cos(), emb.sin())
    np.testing.assert_allclose(rotated, expected.transpose(1, 2).numpy(), atol=1e-5)
    # the same query and key at positions (m, n) and (m + 5, n + 5) give the same score
    q, k = rng.normal(size=(2, 1, 1, 1, HEAD_DIM)).astype("float32")

    def score(m, n):
        return float(np.sum(to_numpy(rope(q, start_index=m)) * to_numpy(rope(k, start_index=n))))

    assert score(7, 2) == pytest.approx(score(12, 7), abs=1e-4)
    assert score(7, 2) != pytest.approx(score(7, 3), abs=1e-3)


def test_partial_rotation_leaves_the_other_features_and_round_trips(rng):
    rope = layers.RotaryEmbedding(rotary_fraction=0.5)
    x = rng.normal(size=(2, 5, 3, HEAD_DIM)).astype("float32")
    y = to_numpy(rope(x, start_index=2))
    np.testing.assert_array_equal(y[..., HEAD_DIM // 2 :], x[..., HEAD_DIM // 2 :])
    assert not np.allclose(y[..., : HEAD_DIM // 2], x[..., : HEAD_DIM // 2])
    check_config_round_trip(rope, (x,))


def test_bad_rotary_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="original_max_length"):
        layers.RotaryEmbedding(scaling="llama3", scaling_factor=8.0)
    with pytest.raises(ValueError, match="even number"):
        layers.RotaryEmbedding(rotary_fraction=0.3)(np.zeros((1, 2, 1, 10), "float32"))
    with pytest.raises(ValueError, match="num_key_value_heads"):
        layers.MultiHeadAttention(num_heads=4, key_dim=8, num_key_value_heads=3)


def test_grouped_query_attention_is_attention_with_shared_key_value_heads(rng):
    x = rng.normal(size=(2, 7, 32)).astype("float32")
    grouped = layers.MultiHeadAttention(4, 8, num_key_value_heads=2, rotary_embedding={"max_wavelength": 50.0})
    full = layers.MultiHeadAttention(4, 8, rotary_embedding={"max_wavelength": 50.0})
    grouped(x), full(x)
    q, q_bias, k, k_bias, v, v_bias, o, o_bias = grouped.get_weights()
    repeat = lambda w: np.repeat(w.reshape(*w.shape[:-1], 2, 8), 2, axis=-2).reshape(*w.shape[:-1], 32)  # noqa: E731
    full.set_weights([q, q_bias, repeat(k), repeat(k_bias), repeat(v), repeat(v_bias), o, o_bias])
    padding = np.arange(7)[None, :] < np.array([[7], [4]])
    per_head = rng.random(size=(2, 4, 7, 7)) < 0.7
    per_head[..., 0] = True
    for kwargs in (
        dict(use_causal_mask=True),
        dict(return_attention_weights=True),
        dict(value_mask=padding),  # the query heads of a group become extra rows of one fused attention
        dict(value_mask=padding, use_causal_mask=True),
        dict(attention_mask=per_head),  # a mask per query head: the key/value heads repeated instead
    ):
        ours, expected = grouped(x, **kwargs), full(x, **kwargs)
        for a, b in zip(
            ours if isinstance(ours, tuple) else [ours], expected if isinstance(expected, tuple) else [expected]
        ):
            assert_close(a, b, atol=1e-5)
    # the cache holds the two key/value heads only
    cache = np.zeros((2, 2, 2, 7, 8), "float32")
    out, cache = grouped(x, use_causal_mask=True, cache=cache, cache_update_index=0)
    assert_close(out, full(x, use_causal_mask=True), atol=1e-5)
    full_cache = np.repeat(to_numpy(cache), 2, axis=2)
    step, _ = grouped(x[:, 3:5], use_causal_mask=True, cache=cache, cache_update_index=3)
    expected, _ = full(x[:, 3:5], use_causal_mask=True, cache=full_cache, cache_update_index=3)
    assert_close(step, expected, atol=1e-5)


def test_a_sliding_window_hides_what_lies_before_it(rng):
    attention = layers.MultiHeadAttention(2, 8, sliding_window=3, query_key_norm_epsilon=1e-6)
    x = rng.normal(size=(1, 9, 16)).astype("float32")
    _, weights = attention(x, use_causal_mask=True, return_attention_weights=True)
    visible = to_numpy(weights)[0, 0] > 0
    expected = np.array([[0 <= i - j < 3 for j in range(9)] for i in range(9)])
    np.testing.assert_array_equal(visible, expected)
    changed = x.copy()
    changed[:, :4] += 1.0  # outside the windows of positions 6, 7, 8
    assert_close(
        to_numpy(attention(changed, use_causal_mask=True))[:, 6:], to_numpy(attention(x, use_causal_mask=True))[:, 6:]
    )
    check_config_round_trip(attention, (x,), {"use_causal_mask": True})
