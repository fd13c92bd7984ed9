"""Image augmentation for the classifier recipes: Keras preprocessing layers applied to NumPy batches
as they are drawn, seeded per batch so that a resumed run sees the batches of the run it resumes.

Augmentation runs on the batches, not in the model: `RandomTranslation` does not compile under XLA.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np


def augmentation_layers(
    shift: float = 0.0, flip: bool = False, erasing: float = 0.0, mixup: float = 0.0, cutmix: float = 0.0
) -> list[keras.layers.Layer]:
    """The Keras preprocessing layers for the options that are on, in the order they are applied.

    Args:
        shift: random translation, as a fraction of each side (0: off).
        flip: random horizontal flips.
        erasing: random erasing; each image's chance of an erased box is drawn from `[0, erasing]`.
        mixup: MixUp with this Beta alpha (0: off).
        cutmix: CutMix with this Beta factor (0: off).

    Example:
        >>> layers = augmentation_layers(shift=0.1, flip=True)
        >>> images, one_hot_labels = np.random.rand(8, 28, 28, 1), np.eye(10)[np.arange(8)]
        >>> images, labels = augment(images, one_hot_labels, layers, seed_parts=[0, 1, 2])  # seed, epoch, step
    """
    layers = []
    if shift:
        layers.append(keras.layers.RandomTranslation(shift, shift, fill_mode="constant"))
    if flip:
        layers.append(keras.layers.RandomFlip("horizontal"))
    if erasing:
        layers.append(keras.layers.RandomErasing(erasing))
    if mixup:
        layers.append(keras.layers.MixUp(mixup))
    if cutmix:
        layers.append(keras.layers.CutMix(cutmix))
    return layers


def augment(
    images: np.ndarray, labels: np.ndarray, layers: Sequence[keras.layers.Layer], seed_parts: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Applies `layers` to a batch of images (float, `(batch, height, width, channels)`) and their
    one-hot labels, which MixUp and CutMix mix too; the same `seed_parts` give the same batch."""
    for i, layer in enumerate(layers):
        # A SeedGenerator, not an int: with an int seed every draw inside a layer repeats the same
        # numbers, so shifts and cut boxes lie on the diagonal and RandomErasing never erases.
        seed = keras.random.SeedGenerator(int(np.random.default_rng([*seed_parts, i]).integers(1 << 30)))
        transformation = layer.get_random_transformation(images, training=True, seed=seed)
        labels = keras.ops.convert_to_numpy(layer.transform_labels(labels, transformation, training=True))
        images = keras.ops.convert_to_numpy(layer.transform_images(images, transformation, training=True))
    return images, labels


def flip_averaged_probabilities(model: keras.Model, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
    """Test-time augmentation for a classifier trained with horizontal flips: the mean of its class
    probabilities on each image and on its mirror image. `model` maps images `(batch, height, width,
    channels)` to logits; `images` is such an array, or a `keras.utils.PyDataset` of image batches (or of
    `(images, labels)`); returns probabilities `(batch, num_classes)`.

    Example:
        >>> model = keras_tfm.vit_tiny(image_size=28, patch_size=7, num_channels=1, num_classes=10, num_layers=1)
        >>> test_images, test_labels = np.random.rand(8, 28, 28, 1), np.arange(8)
        >>> probabilities = flip_averaged_probabilities(model, test_images)
        >>> accuracy = np.mean(probabilities.argmax(-1) == test_labels)
    """
    if isinstance(images, keras.utils.PyDataset):  # batches prepared as drawn (`ProcessedImages`)
        batches = (images[index] for index in range(len(images)))
        return np.concatenate([flip_averaged_probabilities(model, batch[0] if isinstance(batch, tuple) else batch,
                                                           batch_size) for batch in batches])  # fmt: skip
    views = (images, images[:, :, ::-1])
    return sum(
        keras.ops.convert_to_numpy(keras.ops.softmax(model.predict(view, batch_size=batch_size, verbose=0)))
        for view in views
    ) / len(views)
