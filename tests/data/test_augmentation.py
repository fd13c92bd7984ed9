import keras
import numpy as np

from keras_tfm.data import augment, augmentation_layers, flip_averaged_probabilities


def _one_hot(labels, num_classes=10):
    return np.eye(num_classes, dtype="float32")[labels]


def _dots(count=64, side=28):
    """Black images with one white pixel in the middle, so a shift shows as the pixel's move."""
    images = np.zeros((count, side, side, 1), "float32")
    images[:, side // 2, side // 2] = 255.0
    return images, _one_hot(np.arange(count) % 10)


def test_no_options_is_no_layers_and_leaves_the_batch_alone():
    images, labels = _dots(8)
    assert augmentation_layers() == []
    out_images, out_labels = augment(images, labels, [], [0, 0, 0])
    np.testing.assert_array_equal(out_images, images)
    np.testing.assert_array_equal(out_labels, labels)


def test_same_seed_parts_give_the_same_batch_and_others_differ():
    images, labels = _dots()
    layers = augmentation_layers(shift=0.2, flip=True, erasing=1.0, mixup=0.2, cutmix=1.0)
    first = augment(images, labels, layers, [0, 1, 2])
    again = augment(images, labels, layers, [0, 1, 2])
    other = augment(images, labels, layers, [0, 1, 3])
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])


def test_shifts_move_rows_and_columns_independently():
    images, labels = _dots()
    shifted, _ = augment(images, labels, augmentation_layers(shift=0.2), [0, 0, 0])
    moves = []
    for image in shifted[..., 0]:
        row, col = np.unravel_index(np.argmax(image), image.shape)
        moves.append((row - 14, col - 14))
    moves = np.array(moves)
    assert np.abs(moves).max() >= 2, "nothing moved"
    # With an int seed Keras draws the same number for both axes: every move would lie on the diagonal.
    assert (moves[:, 0] != moves[:, 1]).mean() > 0.5


def test_erasing_erases_boxes_in_some_images_and_keeps_labels():
    images = np.full((64, 28, 28, 1), 128.0, "float32")
    labels = _one_hot(np.arange(64) % 10)
    erased, same_labels = augment(images, labels, augmentation_layers(erasing=1.0), [0, 0, 0])
    changed = (erased != images).reshape(64, -1).any(axis=1)
    assert 0.1 < changed.mean() < 0.9  # each image's chance is drawn from [0, 1]
    np.testing.assert_array_equal(same_labels, labels)


def test_mixup_and_cutmix_mix_the_labels_as_they_mix_the_images():
    # Image k is filled with the value k and has class k.
    images = np.repeat(np.arange(64, dtype="float32")[:, None, None, None], 28, axis=1).repeat(28, axis=2)
    labels = _one_hot(np.arange(64), num_classes=64)

    mixed, mixed_labels = augment(images, labels, augmentation_layers(mixup=0.4), [0, 0, 0])
    np.testing.assert_allclose(mixed_labels.sum(axis=1), 1.0, rtol=1e-5)
    assert (mixed_labels.max(axis=1) < 0.99).mean() > 0.5
    # A MixUp image is the blend its labels say: its value is its labels' mean class.
    np.testing.assert_allclose(mixed[:, 0, 0, 0], mixed_labels @ np.arange(64), atol=1e-3)

    cut, cut_labels = augment(images, labels, augmentation_layers(cutmix=1.0), [0, 0, 0])
    np.testing.assert_allclose(cut_labels.sum(axis=1), 1.0, rtol=1e-5)
    own_pixels = (cut == images).mean(axis=(1, 2, 3))
    assert ((own_pixels > 0.01) & (own_pixels < 0.99)).any()
    # A CutMix image keeps the share of its own pixels that its own label keeps. Keras weighs the labels
    # by the box's real-valued area and cuts whole pixels: they may differ by a row and a column (7% at 28).
    np.testing.assert_allclose(own_pixels, cut_labels[np.arange(64), np.arange(64)], atol=2 / 28 + 1e-3)


def test_flip_averaged_probabilities_average_the_image_and_its_mirror():
    rng = np.random.default_rng(0)
    height, width, channels, classes = 3, 5, 2, 4
    images = rng.random((7, height, width, channels)).astype("float32")
    model = keras.Sequential(
        [keras.Input((height, width, channels)), keras.layers.Flatten(), keras.layers.Dense(classes, use_bias=False)]
    )
    kernel = rng.normal(size=(height * width * channels, classes)).astype("float32")
    model.set_weights([kernel])
    # A linear model sees a mirrored image as the image seen through a mirrored kernel.
    mirrored = kernel.reshape(height, width, channels, classes)[:, ::-1].reshape(-1, classes)

    def softmax(logits):
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    flat = images.reshape(len(images), -1)
    expected = (softmax(flat @ kernel) + softmax(flat @ mirrored)) / 2
    np.testing.assert_allclose(flip_averaged_probabilities(model, images, batch_size=3), expected, atol=1e-5)
