import threading

import numpy as np
import pytest

import keras_tfm
from keras_tfm.layers import attention, rotary, shared_positions
from tests.checks import assert_close, to_numpy


def test_a_value_is_computed_once_per_key_and_inputs_inside_the_block_only():
    computed = []

    def compute(name):
        computed.append(name)
        return np.array([len(computed)])

    tensor, other = np.zeros(2), np.zeros(2)
    with shared_positions.computed_once():
        first = shared_positions.shared(("angles", 64), (4, tensor), lambda: compute("a"))
        assert shared_positions.shared(("angles", 64), (4, tensor), lambda: compute("b")) is first
        assert shared_positions.shared(("angles", 64), (5, tensor), lambda: compute("c")) is not first
        assert shared_positions.shared(("angles", 64), (4, other), lambda: compute("d")) is not first  # by identity
        assert shared_positions.shared(("mask", 64), (4, tensor), lambda: compute("e")) is not first
        with shared_positions.computed_once():  # inside another: the outer's values
            assert shared_positions.shared(("angles", 64), (4, tensor), lambda: compute("f")) is first
    shared_positions.shared(("angles", 64), (4, tensor), lambda: compute("g"))
    shared_positions.shared(("angles", 64), (4, tensor), lambda: compute("h"))
    assert computed == ["a", "c", "d", "e", "g", "h"]


def test_each_thread_has_its_own_block():
    seen = {}

    def other_thread():
        seen["outside"] = shared_positions.shared(("k",), (), lambda: "other")

    with shared_positions.computed_once():
        shared_positions.shared(("k",), (), lambda: "main")
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert seen["outside"] == "other"


@pytest.mark.parametrize("name", ["decoder_lm", "gpt"])
def test_a_decoding_call_computes_one_rotation_and_one_mask_for_all_its_layers(rng, monkeypatch, name):
    make = {
        "decoder_lm": lambda: keras_tfm.DecoderLM(
            vocabulary_size=40, num_layers=3, num_heads=4, num_key_value_heads=2, hidden_dim=32,
            intermediate_dim=48, max_length=16,
        ),
        "gpt": lambda: keras_tfm.GPT(vocabulary_size=40, num_layers=3, num_heads=4, hidden_dim=32, max_length=16),
    }[name]  # fmt: skip
    model = make()
    ids = rng.integers(1, 40, (2, 5)).astype("int32")
    expected = model(ids)
    calls = {"angles": 0, "mask": 0}

    def counted(function, kind):
        def call(*args, **kwargs):
            calls[kind] += 1
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(rotary.RotaryEmbedding, "cos_sin", counted(rotary.RotaryEmbedding.cos_sin, "angles"))
    monkeypatch.setattr(attention, "position_mask", counted(attention.position_mask, "mask"))
    cache, _ = model.decoding_cache(2, 8)
    logits, cache = model.call_with_cache(ids, cache, 0)
    assert calls == {"angles": int(name == "decoder_lm"), "mask": 1}
    assert_close(logits, expected, atol=1e-5)
    step, _ = model.call_with_cache(ids[:, :1], cache, 5)  # another call: computed again, once
    assert calls == {"angles": 2 * int(name == "decoder_lm"), "mask": 2}
    assert_close(step[:, 0], model(np.concatenate([ids, ids[:, :1]], axis=1))[:, 5], atol=1e-5)


def test_layers_that_rotate_differently_do_not_share_their_angles(rng):
    """Two attentions of one call whose rotations differ (say, local and global layers' wavelengths)."""
    layers = [
        attention.MultiHeadAttention(num_heads=2, key_dim=8, rotary_embedding={"max_wavelength": wavelength})
        for wavelength in (10000.0, 500.0)
    ]
    x = rng.normal(size=(1, 3, 16)).astype("float32")
    cache = np.zeros((1, 2, 2, 6, 8), "float32")
    layers[0](x, cache=cache, cache_update_index=2)
    layers[1](x, cache=cache, cache_update_index=2)
    layers[1].set_weights(layers[0].get_weights())
    alone = [layer(x, cache=cache, cache_update_index=2)[0] for layer in layers]
    with shared_positions.computed_once():
        together = [layer(x, cache=cache, cache_update_index=2)[0] for layer in layers]
    assert np.abs(to_numpy(alone[0]) - to_numpy(alone[1])).max() > 1e-3
    for one, other in zip(alone, together):
        assert_close(one, other, atol=1e-6)
