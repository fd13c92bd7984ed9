"""A folder of labelled images, read and prepared by the checkpoint's processor batch by batch, trains a model on
every backend."""

import os

import numpy as np
import pytest

import keras_tfm
from keras_tfm.data import DataError, ImageFolder, ImageProcessor
from keras_tfm.errors import InputError

Image = pytest.importorskip("PIL.Image")
PROCESSOR = ImageProcessor(size={"shortest_edge": 16}, do_center_crop=True, crop_size={"height": 16, "width": 16},
                           resample=3, image_mean=(0.5, 0.4, 0.3), image_std=(0.2, 0.3, 0.4))  # fmt: skip


def write_folder(root, rng, per_class: int = 12) -> str:
    """Photos of odd sizes, blue or red: a task a model learns in a few steps."""
    for label, name in enumerate(["blue", "red"]):
        os.makedirs(root / name)
        for i in range(per_class):
            pixels = rng.integers(0, 80, (int(rng.integers(18, 40)), int(rng.integers(18, 40)), 3)).astype("uint8")
            pixels[..., 2 - 2 * label] += 150
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    (root / "red" / "notes.txt").write_text("not an image")
    return str(root)


@pytest.mark.backend_independent  # NumPy and Pillow
def test_batches_are_the_processors_pixels_in_an_order_drawn_per_epoch(tmp_path, rng):
    root = write_folder(tmp_path, rng, per_class=5)
    folder = ImageFolder(root, PROCESSOR, batch_size=4, seed=3)
    assert folder.class_names == ["blue", "red"] and len(folder.files) == 10 and len(folder) == 3
    seen = []
    for index in range(len(folder)):
        pixels, labels = folder[index]
        seen += list(folder._order[index * 4 : index * 4 + 4])
        np.testing.assert_array_equal(pixels, PROCESSOR([folder.files[row] for row in seen[-len(labels) :]]))
        np.testing.assert_array_equal(labels, folder.labels[seen[-len(labels) :]])
    assert sorted(seen) == list(range(10))  # every image once an epoch
    first = list(folder._order)
    folder.on_epoch_end()
    assert list(folder._order) != first and sorted(folder._order) == list(range(10))
    again = ImageFolder(root, PROCESSOR, batch_size=4, seed=3)
    assert list(again._order) == first  # a rerun draws the same epochs
    test = ImageFolder(root, PROCESSOR, shuffle=False, class_names=["red", "blue"])
    assert list(test.labels[:5]) == [0] * 5 and "red" in test.files[0]


def test_a_model_learns_from_a_folder(tmp_path, rng):
    root = write_folder(tmp_path, rng)
    model = keras_tfm.ViT(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, num_classes=2)
    model.fit(ImageFolder(root, PROCESSOR, batch_size=8), epochs=6, verbose=0)
    loss, accuracy = model.evaluate(ImageFolder(root, PROCESSOR, batch_size=8, shuffle=False), verbose=0)
    assert loss < 0.1 and accuracy == 1.0  # an untrained model scores about ln 2 = 0.69


@pytest.mark.backend_independent
def test_what_cannot_be_read_is_named(tmp_path, rng):
    root = write_folder(tmp_path, rng, per_class=2)
    (tmp_path / "red" / "broken.png").write_bytes(b"\x89PNG not really")
    folder = ImageFolder(root, PROCESSOR, batch_size=8, shuffle=False)
    with pytest.raises(DataError, match="broken.png"):
        folder[0]
    with pytest.raises(DataError, match="is not a folder"):
        ImageFolder(str(tmp_path / "missing"), PROCESSOR)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no class sub-folders"):
        ImageFolder(str(tmp_path / "empty"), PROCESSOR)
    with pytest.raises(InputError, match="processor"):
        ImageFolder(root, "bicubic")
    with pytest.raises(InputError, match="batch_size"):
        ImageFolder(root, PROCESSOR, batch_size=0)


@pytest.mark.backend_independent  # NumPy and Pillow
def test_an_array_of_images_is_prepared_batch_by_batch_and_flip_averaged_as_arrays(rng):
    """`ProcessedImages` over grayscale uint8 digits: each batch is the processor's pixels of its rows, in order;
    the flip-averaged probabilities over its batches equal those over the whole prepared array."""
    from keras_tfm.data import ProcessedImages, flip_averaged_probabilities

    digits = rng.integers(0, 256, (7, 9, 9)).astype("uint8")
    labels = np.eye(3, dtype="float32")[rng.integers(0, 3, 7)]
    batches = ProcessedImages(digits, labels, PROCESSOR, batch_size=3)
    assert len(batches) == 3 and batches[2][0].shape == (1, 16, 16, 3)
    pixels = np.concatenate([batches[index][0] for index in range(3)])
    np.testing.assert_array_equal(pixels, PROCESSOR(list(digits)))
    np.testing.assert_array_equal(np.concatenate([batches[index][1] for index in range(3)]), labels)
    model = keras_tfm.vit_tiny(image_size=16, patch_size=8, num_classes=3, num_layers=1)
    np.testing.assert_allclose(
        flip_averaged_probabilities(model, batches), flip_averaged_probabilities(model, pixels), atol=1e-6
    )
    assert ProcessedImages(digits, None, PROCESSOR, batch_size=4)[1].shape == (3, 16, 16, 3)
    assert batches.digest() != ProcessedImages(digits[::-1].copy(), labels, PROCESSOR, batch_size=3).digest()
    with pytest.raises(InputError, match=r"^labels: ProcessedImages: expected one row per image \(7\); received 6"):
        ProcessedImages(digits, labels[:6], PROCESSOR)
    with pytest.raises(
        InputError, match=r"^images: ProcessedImages: expected an array of images .*; received an empty"
    ):
        ProcessedImages([], None, PROCESSOR)
