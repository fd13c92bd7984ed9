"""`ImageProcessor` against transformers' own processors (ViT, DeiT, DINOv2's BiT, CLIP, SigLIP) on real photos
of odd sizes (matplotlib's sample photographs, cropped to odd shapes, grayscale, a palette image, transparency),
and what it does with bad input."""

import json
import os

import numpy as np
import pytest

from keras_tfm.data import DataError, ImageProcessor
from keras_tfm.errors import InputError

PIL = pytest.importorskip("PIL.Image")
transformers = pytest.importorskip("transformers")
matplotlib = pytest.importorskip("matplotlib")

SAMPLES = os.path.join(matplotlib.get_data_path(), "sample_data")
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225], do_convert_rgb=True)
SQUARE = {"height": 224, "width": 224}


def photos() -> list:
    """Real photographs and drawings of odd sizes, in several PIL modes."""
    hopper = PIL.open(os.path.join(SAMPLES, "grace_hopper.jpg"))
    hopper.load()
    drawings = [PIL.open(os.path.join(SAMPLES, name)) for name in ("Minduka_Present_Blue_Pack.png", "logo2.png")]
    cut = [hopper.crop((10, 20, 47, 111)), hopper.crop((0, 0, 300, 17)), hopper.crop((5, 5, 100, 60)).convert("P")]
    return [hopper, *drawings, *cut, hopper.convert("L")]


def processors() -> dict:
    """Each family's processor as its published checkpoints configure it."""
    return {
        "ViT": transformers.ViTImageProcessor(size=SQUARE, do_convert_rgb=True),
        "DeiT": transformers.DeiTImageProcessor(
            size={"height": 256, "width": 256}, crop_size=SQUARE, resample=3, do_center_crop=True, **IMAGENET
        ),  # fmt: skip
        "DINOv2": transformers.BitImageProcessor(
            size={"shortest_edge": 256}, crop_size=SQUARE, resample=3, do_center_crop=True, **IMAGENET
        ),  # fmt: skip
        "CLIP": transformers.CLIPImageProcessor(size={"shortest_edge": 224}, crop_size=SQUARE),
        "SigLIP": transformers.SiglipImageProcessor(size=SQUARE),
        "small crop": transformers.DeiTImageProcessor(
            size={"height": 40, "width": 60},
            crop_size={"height": 48, "width": 50},
            do_center_crop=True,
            do_convert_rgb=True,
        ),  # fmt: skip
    }


@pytest.mark.backend_independent
@pytest.mark.parametrize("family", list(processors()))
def test_the_batch_is_transformers_processors_for_its_preprocessor_config(family, tmp_path):
    theirs = processors()[family]
    theirs.save_pretrained(tmp_path)
    ours = ImageProcessor.from_huggingface(str(tmp_path))
    for index, image in enumerate(photos()):
        expected = theirs(image, return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)
        got = ours(image)[0]
        assert got.shape == expected.shape and got.dtype == np.float32, (index, image.size)
        assert np.abs(got - expected).mean() <= 2e-3, (family, index, image.size, image.mode)
    written = ours.save(str(tmp_path / "again"))
    assert ImageProcessor.from_config(json.load(open(written))) == ours  # written back as read
    reloaded = type(theirs).from_pretrained(os.path.dirname(written))
    np.testing.assert_allclose(reloaded(photos()[0], return_tensors="np")["pixel_values"][0].transpose(1, 2, 0),
                               ours(photos()[0])[0], atol=1e-6)  # fmt: skip


@pytest.mark.backend_independent
def test_files_arrays_and_odd_pixels_give_what_their_pil_images_give(tmp_path):
    """A path, a PIL image and its uint8 array are one image (a file turned upright by its EXIF orientation);
    16-bit pixels are scaled to 8 bits (Pillow alone
    would clip them); a batch of mixed sizes comes out as one batch."""
    processor = ImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 56, "width": 56}, do_center_crop=True)
    hopper = photos()[0]
    path = tmp_path / "hopper.png"
    hopper.save(path)
    batch = processor([str(path), hopper, np.asarray(hopper), np.asarray(hopper.crop((0, 0, 30, 90)))])
    assert batch.shape == (4, 56, 56, 3)
    np.testing.assert_array_equal(batch[0], batch[1])
    np.testing.assert_array_equal(batch[1], batch[2])
    turned = tmp_path / "turned.jpg"  # a camera's photo, stored sideways with an EXIF orientation
    exif = PIL.Exif()
    exif[0x0112] = 6
    hopper.save(turned, exif=exif)
    upright = PIL.open(turned)
    upright = upright.transpose(PIL.Transpose.ROTATE_270)
    np.testing.assert_array_equal(processor(str(turned)), processor(upright))  # as transformers' load_image
    gray = np.asarray(hopper.convert("L"))
    deep = gray.astype("uint16") * 257  # the same picture in 16 bits
    np.testing.assert_array_equal(processor(deep), processor(gray))
    deep_file = tmp_path / "deep.png"
    PIL.fromarray(deep).save(deep_file)
    assert PIL.open(deep_file).mode.startswith("I")
    np.testing.assert_array_equal(processor(str(deep_file)), processor(gray))


@pytest.mark.backend_independent
def test_bad_images_and_configs_are_refused_by_name(tmp_path):
    processor = ImageProcessor()
    hopper = photos()[0]
    hopper.save(tmp_path / "whole.jpg")
    data = (tmp_path / "whole.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.png").write_text("not an image")
    for name in ("cut.jpg", "text.png", "missing.png"):
        with pytest.raises(DataError, match=rf"^images: images\[1\] \('.*{name}'\) is not a readable image"):
            processor([str(tmp_path / "whole.jpg"), str(tmp_path / name)])
    for bad, said in ((np.zeros((4, 4, 3), "float32"), "expected uint8 or uint16 pixels; received float32"),
                      (np.zeros((4, 4, 2), "uint8"), r"expected an image \(height, width"),
                      (3, "expected a file path, a PIL image or a uint8 array; received a int")):  # fmt: skip
        with pytest.raises(DataError, match=rf"images\[0\]: {said}"):
            processor(bad)
    keeps_aspect = ImageProcessor(size={"shortest_edge": 32}, do_center_crop=False)
    with pytest.raises(DataError, match="several sizes"):
        keeps_aspect([np.zeros((40, 40, 3), "uint8"), np.zeros((40, 80, 3), "uint8")])
    for config, argument in (({"size": {"width": 3}}, "size"), ({"resample": 9}, "resample"),
                             ({"image_std": [1, 0, 1]}, "image_std"), ({"do_center_crop": True}, "crop_size")):  # fmt: skip
        with pytest.raises(InputError, match=rf"^{argument}: ImageProcessor: expected"):
            ImageProcessor.from_config(config)
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(DataError, match="preprocessor_config.json' is not readable JSON"):
        ImageProcessor.from_huggingface(str(tmp_path))
    old = ImageProcessor.from_config({"image_processor_type": "CLIPImageProcessor", "size": 224, "crop_size": 224})
    assert old.size == {"shortest_edge": 224} and old.crop_size == SQUARE  # an old config's one number
