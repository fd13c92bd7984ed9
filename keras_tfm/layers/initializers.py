"""One initializer per weight. Keras 3 fixes an unseeded initializer's seed when the initializer is made,
so one instance handed to several weights gives them all the same values (every layer's query, key and
value kernels alike, and every layer like the first)."""

from __future__ import annotations

import keras


def own_initializer(initializer) -> keras.initializers.Initializer:
    """A copy of `initializer` (an instance, a name or a config) for one weight: made from its config, an
    unseeded one draws a seed of its own; a seeded one keeps its seed, as Keras' own layers clone it.

    Example:
    >>> shared = keras.initializers.RandomNormal(stddev=0.02)
    >>> a, b = own_initializer(shared)((2, 2)), own_initializer(shared)((2, 2))
    >>> bool(keras.ops.all(a == b))
    False
    """
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
