"""Layer scale and stochastic depth: the common checks, what each computes, and a block that uses both."""

import numpy as np
import pytest
from keras import ops

from keras_tfm.layers import DropPath, EncoderBlock, LayerScale
from tests.checks import run_layer_checks, to_numpy


def test_both_pass_the_common_checks(tmp_path, rng):
    x = rng.normal(size=(4, 3, 8)).astype("float32")
    run_layer_checks(lambda **kw: LayerScale(0.5, **kw), (x,), tmp_path=tmp_path)
    run_layer_checks(
        lambda **kw: DropPath(0.25, seed=1, **kw), (x,), tmp_path=tmp_path, mixed_precision=False, fit=False
    )


def test_drop_path_drops_whole_examples_and_keeps_the_mean(rng):
    x = np.ones((4000, 2, 3), "float32")
    dropped = to_numpy(DropPath(0.25, seed=3)(x, training=True))
    per_example = dropped.reshape(4000, -1)
    np.testing.assert_allclose(np.unique(per_example), [0.0, 4 / 3], rtol=1e-6)  # dropped whole, the rest scaled
    assert (per_example.min(1) == per_example.max(1)).all()
    assert abs(per_example[:, 0].mean() - 1.0) < 0.05 and abs((per_example[:, 0] == 0).mean() - 0.25) < 0.03
    np.testing.assert_array_equal(to_numpy(DropPath(0.25)(x)), x)  # inference: the identity


@pytest.mark.backend_independent  # the formula; tests/convert/test_dinov2.py holds it against DINOv2 on every backend
def test_a_block_scales_each_branch_before_its_residual(rng):
    """Pre-norm with layer scale: y = x + g1 * attention(norm(x)); out = y + g2 * mlp(norm(y))."""
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    block = EncoderBlock(2, 16, layer_scale_init=0.5)
    block(x)
    block.feed_forward_scale.gamma.assign(np.linspace(-1, 1, 8))
    y = x + 0.5 * to_numpy(block.self_attention(block.self_attention_norm(x), None))
    expected = y + np.linspace(-1, 1, 8) * to_numpy(block.feed_forward(block.feed_forward_norm(y)))
    np.testing.assert_allclose(to_numpy(block(x)), expected, atol=1e-5)
    assert tuple(ops.shape(block.self_attention_scale.gamma)) == (8,)
