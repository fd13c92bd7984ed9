"""The activations Keras has not, as the checkpoints that use them compute them."""

import keras
import numpy as np
import pytest

from keras_tfm.layers import FeedForward
from keras_tfm.layers.feed_forward import get_activation
from tests.checks import assert_close, to_numpy

torch = pytest.importorskip("torch")
activations = pytest.importorskip("transformers.activations")


@pytest.mark.parametrize(
    "name, reference", [("quick_gelu", "QuickGELUActivation"), ("gelu_approximate", "NewGELUActivation")]
)
def test_own_activations_are_transformers(rng, name, reference):
    x = (4 * rng.normal(size=(3, 9))).astype("float32")
    expected = getattr(activations, reference)()(torch.tensor(x)).numpy()
    assert_close(to_numpy(get_activation(name)(keras.ops.convert_to_tensor(x))), expected, atol=1e-5)
    layer = FeedForward(8, activation=name)
    assert FeedForward.from_config(layer.get_config()).activation == name
    assert np.isfinite(to_numpy(layer(x[None]))).all()
