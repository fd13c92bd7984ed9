"""Run as a script with KERAS_BACKEND set: one training step of a small GPT on one device and under
`--distribute MODE` over 4 virtual CPU devices; prints the largest differences of loss and weights."""

import json
import sys

mode = sys.argv[1]
JIT = sys.argv[2] == "jit" if len(sys.argv) > 2 else True

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_tfm.training import distribution_scope, use_cpu_devices  # noqa: E402

use_cpu_devices(4)

import keras_tfm  # noqa: E402


def build():
    keras.utils.set_random_seed(1)
    model = keras_tfm.gpt_shakespeare_char_cpu(
        vocabulary_size=32, max_length=16, num_layers=1, num_heads=4, hidden_dim=32
    )
    return model


def step(model, x, y):
    model.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=JIT,
    )
    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return history.history["loss"][-1], [keras.ops.convert_to_numpy(w) for w in model.weights]


rng = np.random.default_rng(0)
x = rng.integers(0, 32, size=(16, 16)).astype("int32")
y = rng.integers(0, 32, size=(16, 16)).astype("int32")
single = build()
single(x[:1])
initial = single.get_weights()
single_loss, single_weights = step(single, x, y)

with distribution_scope(mode, model_parallel=2 if mode == "model" else None, log=lambda m: None):
    distributed = build()
    distributed(x[:1])
    distributed.set_weights(initial)
    distributed_loss, distributed_weights = step(distributed, x, y)

if keras.backend.backend() == "jax":
    devices = keras.distribution.list_devices()
else:
    import tensorflow as tf

    devices = tf.config.list_logical_devices("CPU")
print(
    json.dumps(
        {
            "devices": len(devices),
            "loss": [float(single_loss), float(distributed_loss)],
            "weights_changed": float(max(np.abs(a - b).max() for a, b in zip(initial, single_weights))),
            "max_weight_difference": float(
                max(np.abs(a - b).max() for a, b in zip(single_weights, distributed_weights))
            ),
        }
    )
)
