"""`keras_tfm.layers.kv_cache`: each row's new keys and values written at its own position."""

import keras
import numpy as np
import pytest

from keras_tfm.layers import kv_cache
from tests.checks import to_numpy


def expected_write(cache, positions, entries):
    written = cache.copy()
    for row, position in enumerate(positions):
        written[row, :, :, position] = entries[row, :, :, 0]
    return written


def test_each_row_is_written_at_its_own_position(rng):
    cache = rng.normal(size=(3, 2, 4, 6, 5)).astype("float32")  # (batch, keys and values, heads, length, dim)
    entries = rng.normal(size=(3, 2, 4, 1, 5)).astype("float32")
    positions = np.array([5, 0, 2], "int32")
    written = kv_cache.write(cache, keras.ops.convert_to_tensor(positions), entries)
    np.testing.assert_array_equal(to_numpy(written), expected_write(cache, positions, entries))


def test_rows_unknown_until_run_are_written_alike(rng):
    """A traced function whose batch is unknown (an export's signature) builds the indices from the shape."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("only TensorFlow traces with an unknown batch here")
    import tensorflow as tf

    cache = rng.normal(size=(2, 2, 3, 4, 5)).astype("float32")
    entries = rng.normal(size=(2, 2, 3, 1, 5)).astype("float32")
    positions = np.array([1, 3], "int32")
    unknown = [tf.TensorSpec((None, 2, 3, 4, 5)), tf.TensorSpec((None,), tf.int32), tf.TensorSpec((None, 2, 3, 1, 5))]
    write = tf.function(lambda c, p, e: kv_cache.write_rows(c, (0, 0, 0, p, 0), e), input_signature=unknown)
    np.testing.assert_array_equal(write(cache, positions, entries).numpy(), expected_write(cache, positions, entries))
