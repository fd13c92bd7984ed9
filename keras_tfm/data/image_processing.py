"""A checkpoint's image processor: images in (files, PIL images, uint8 arrays of any sizes), the model's
channels-last float32 batch out, as transformers' image processors make it (ViT, DeiT, DINOv2's
`BitImageProcessor`, CLIP, SigLIP): RGB conversion (transparency composited onto white), a resize to a
size or by the shortest edge with the checkpoint's resampling filter, a center crop, rescale, normalize.

Pillow resizes: its filters are the ones the checkpoints were trained with, and they antialias when they
shrink (Keras' `Resizing` does not, which moves predictions). NumPy does the rest. Written here because
transformers' processors are PyTorch's side and channels-first, and Keras has no processor that reads
`preprocessor_config.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from keras_tfm.data.errors import DataError
from keras_tfm.errors import InputError

# Pillow's filters by transformers' `resample` numbers (PIL.Image.Resampling's values)
FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
CONFIG_FILE = "preprocessor_config.json"
SHORTEST_EDGE_KINDS = ("BitImageProcessor", "CLIPImageProcessor", "ConvNextImageProcessor")  # an int size: the edge
KEYS = ("do_resize", "size", "resample", "do_center_crop", "crop_size", "do_rescale", "rescale_factor",
        "do_normalize", "image_mean", "image_std", "do_convert_rgb", "keep_aspect_ratio", "ensure_multiple_of")  # fmt: skip
DPT_KEYS = {"keep_aspect_ratio": False, "ensure_multiple_of": 1}  # written where they differ from these


@dataclasses.dataclass(frozen=True)
class ImageProcessor:
    """How a checkpoint prepares images (transformers' names and meanings).

    Args:
        size: `{"height", "width"}` (resized to that), or `{"shortest_edge"}` (the shorter side to that, the
            aspect kept, the longer side rounded down).
        resample: the filter, as transformers numbers it: 0 nearest, 1 lanczos, 2 bilinear, 3 bicubic.
        crop_size: `{"height", "width"}` of the center crop (with `do_center_crop`; a smaller image is
            padded with zeros).
        rescale_factor: multiplies the pixels (with `do_rescale`), 1/255 for 0-1.
        image_mean, image_std: per channel, after rescaling (with `do_normalize`).
        do_convert_rgb: grayscale, palette and transparent images become RGB (transparency onto white).
        keep_aspect_ratio, ensure_multiple_of: DPT's and Depth Anything's resize to a `{"height", "width"}` size:
            both sides scaled by the factor nearer 1 (the aspect kept), each rounded to a multiple.
        processor_type: the transformers class that `save_huggingface` names (`image_processor_type`).

    Example:
    >>> processor = ImageProcessor(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224},
    ...                            do_center_crop=True, image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))
    >>> processor([np.zeros((300, 400, 3), "uint8")]).shape
    (1, 224, 224, 3)
    """

    size: dict = dataclasses.field(default_factory=lambda: {"height": 224, "width": 224})
    resample: int = 2
    do_resize: bool = True
    do_center_crop: bool = False
    crop_size: dict | None = None
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
    do_convert_rgb: bool = True
    keep_aspect_ratio: bool = False
    ensure_multiple_of: int = 1
    processor_type: str = "ViTImageProcessor"

    def __post_init__(self):
        object.__setattr__(self, "image_mean", _per_channel(self.image_mean, "image_mean"))
        object.__setattr__(self, "image_std", _per_channel(self.image_std, "image_std"))
        if self.do_resize:
            _check_size(self.size, "size", ("height", "width"), ("shortest_edge",), ("shortest_edge", "longest_edge"))
        if self.do_center_crop:
            _check_size(self.crop_size, "crop_size", ("height", "width"))
        if self.resample not in FILTERS:
            raise InputError(f"expected one of {sorted(FILTERS)} (transformers' filters); received "
                             f"{self.resample!r}.", "resample", "ImageProcessor")  # fmt: skip
        if not (isinstance(self.ensure_multiple_of, int) and self.ensure_multiple_of >= 1):
            raise InputError(f"expected an integer >= 1; received {self.ensure_multiple_of!r}.", "ensure_multiple_of",
                             "ImageProcessor")  # fmt: skip
        if any(s <= 0 for s in self.image_std):
            raise InputError(f"expected positive values; received {self.image_std}.", "image_std", "ImageProcessor")

    @classmethod
    def from_config(cls, config: dict) -> ImageProcessor:
        """The processor of a `preprocessor_config.json`'s dict (transformers' defaults where it is silent:
        its `ViTImageProcessor`'s)."""
        if not isinstance(config, dict):
            raise InputError(f"expected a dict; received {type(config).__name__}.", "config", "ImageProcessor")
        known = {key: config[key] for key in KEYS if config.get(key) is not None}
        kind = (config.get("image_processor_type") or "ViTImageProcessor").removesuffix("Fast").removesuffix("Pil")
        if isinstance(known.get("size"), int):  # an old config's one number: a square, or the shortest edge
            square = config.get("default_to_square", kind not in SHORTEST_EDGE_KINDS)
            side = known["size"]
            known["size"] = {"height": side, "width": side} if square else {"shortest_edge": side}
        if kind == "DPTImageProcessor" and config.get("do_pad"):
            raise InputError("DPT's padding to a size_divisor (do_pad) is not supported; give images whose sides "
                             "the patch size divides, or a config with do_pad false.", "config", "ImageProcessor")  # fmt: skip
        if isinstance(known.get("crop_size"), int):
            known["crop_size"] = {"height": known["crop_size"], "width": known["crop_size"]}
        return cls(**known, processor_type=kind)

    @classmethod
    def from_huggingface(cls, directory: str) -> ImageProcessor | None:
        """The processor of a checkpoint directory's `preprocessor_config.json`; None where it has none."""
        path = os.path.join(directory, CONFIG_FILE)
        if not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as file:
                config = json.load(file)
        except (OSError, ValueError) as error:
            raise DataError(f"{path!r} is not readable JSON ({error}).", argument="directory") from None
        try:
            return cls.from_config(config)
        except InputError as error:
            raise DataError(f"{path!r}: {error}", argument="directory") from None

    def config(self) -> dict:
        """The processor as transformers writes `preprocessor_config.json`."""
        values = {key: getattr(self, key) for key in KEYS if key not in DPT_KEYS or getattr(self, key) != DPT_KEYS[key]}
        values.update(image_mean=list(self.image_mean), image_std=list(self.image_std))
        return {"image_processor_type": self.processor_type, **values}

    def save(self, directory: str) -> str:
        """Writes `preprocessor_config.json` into `directory`; returns its path."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, CONFIG_FILE)
        with open(path, "w", encoding="utf-8") as file:
            json.dump(self.config(), file, indent=2)
        return path

    def __call__(self, images) -> np.ndarray:
        """`images` (a file path, a PIL image or a uint8 / uint16 array `(height, width[, channels])`, or a
        list of them, of any sizes) -> `(batch, height, width, 3)` float32."""
        many = isinstance(images, (list, tuple)) or (isinstance(images, np.ndarray) and images.ndim == 4)
        batch = [self.one(image, index) for index, image in enumerate(images if many else [images])]
        shapes = {image.shape for image in batch}
        if len(shapes) > 1:
            raise DataError(
                f"the processed images have several sizes {sorted(shapes)}: this processor keeps each image's "
                "aspect (a shortest edge without a center crop); give images of one aspect, or one at a time.",
                argument="images",
            )
        return np.stack(batch)

    def one(self, image, index: int = 0) -> np.ndarray:
        """One image -> `(height, width, 3)` float32 (`index`: where it stood in a batch, for errors)."""
        picture = _as_pil(image, index, self.do_convert_rgb)
        if self.do_resize:
            picture = picture.resize(self._resized_size(picture.size)[::-1], resample=_pil_filter(self.resample))
        pixels = np.asarray(picture)
        if pixels.ndim == 2:
            pixels = pixels[..., None]
        if self.do_center_crop:
            pixels = _center_crop(pixels, self.crop_size["height"], self.crop_size["width"])
        pixels = pixels.astype("float32")
        if self.do_rescale:
            pixels = (pixels.astype("float64") * self.rescale_factor).astype("float32")
        if self.do_normalize:
            pixels = (pixels - np.asarray(self.image_mean, "float32")) / np.asarray(self.image_std, "float32")
        return pixels

    def output_size(self) -> tuple[int, int] | None:
        """`(height, width)` of every image this processor gives; None where it keeps each image's aspect or size."""
        if self.do_center_crop:
            return self.crop_size["height"], self.crop_size["width"]
        if self.do_resize and "shortest_edge" not in self.size and not self.keep_aspect_ratio:
            return self._resized_size((self.size["width"], self.size["height"]))
        return None

    def describe(self) -> str:
        """Its steps in order, in words: "resize to 20x20 (bilinear), center crop 16x16, rescale, normalize"."""
        steps = []
        if self.do_resize:
            target = "x".join(str(self.size[k]) for k in ("height", "width")) if "height" in self.size else (
                f"a shortest edge of {self.size['shortest_edge']}")  # fmt: skip
            kept = ", aspect kept" * self.keep_aspect_ratio + f", multiples of {self.ensure_multiple_of}" * (
                self.ensure_multiple_of > 1)  # fmt: skip
            steps.append(f"resize to {target} ({FILTERS[self.resample]}{kept})")
        if self.do_center_crop:
            steps.append(f"center crop {self.crop_size['height']}x{self.crop_size['width']}")
        steps += ["rescale"] * self.do_rescale + ["normalize"] * self.do_normalize
        return ", ".join(steps) or "none"

    def _resized_size(self, width_height: tuple[int, int]) -> tuple[int, int]:
        """`(height, width)` after the resize (transformers' `get_resize_output_image_size`)."""
        if "shortest_edge" not in self.size:
            if self.keep_aspect_ratio or self.ensure_multiple_of > 1:
                return _dpt_size(width_height, self.size, self.keep_aspect_ratio, self.ensure_multiple_of)
            return self.size["height"], self.size["width"]
        if "longest_edge" in self.size:
            return _detection_size(width_height, self.size, self.processor_type == "YolosImageProcessor")
        width, height = width_height
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.size["shortest_edge"], int(self.size["shortest_edge"] * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)


def _detection_size(width_height: tuple[int, int], size: dict, yolos: bool) -> tuple[int, int]:
    """`(height, width)` with the shorter side at `shortest_edge` unless the longer would pass `longest_edge`
    (DETR's `get_size_with_aspect_ratio`); YOLOS's tests the sides in another order and rounds both down to
    multiples of 16."""
    width, height = width_height
    short, long = float(min(width, height)), float(max(width, height))
    target, raw = size["shortest_edge"], None
    if long / short * target > size["longest_edge"]:
        raw = size["longest_edge"] * short / long
        target = int(round(raw))
    scale = target if raw is None else raw
    unchanged = (height <= width and height == target) or (width <= height and width == target)
    if unchanged and not (yolos and width < height):
        new_height, new_width = height, width
    elif width < height:
        new_height, new_width = int(scale * height / width), target
    else:
        new_height, new_width = target, int(scale * width / height)
    if yolos:
        new_height, new_width = new_height - new_height % 16, new_width - new_width % 16
    return new_height, new_width


def _dpt_size(width_height: tuple[int, int], size: dict, keep_aspect_ratio: bool, multiple: int) -> tuple[int, int]:
    """`(height, width)` as DPT's `get_resize_output_image_size`: with `keep_aspect_ratio` both sides scaled by the
    factor nearer 1, each side rounded to the nearest multiple (Python's rounding, half to even)."""
    width, height = width_height
    scale_height, scale_width = size["height"] / height, size["width"] / width
    if keep_aspect_ratio:
        if abs(1 - scale_width) < abs(1 - scale_height):
            scale_height = scale_width
        else:
            scale_width = scale_height
    return tuple(max(round(value / multiple) * multiple, multiple)
                 for value in (scale_height * height, scale_width * width))  # fmt: skip


def _per_channel(values, name: str) -> tuple:
    values = (values,) * 3 if isinstance(values, (int, float)) else tuple(values)
    if len(values) not in (1, 3) or not all(isinstance(v, (int, float)) and np.isfinite(v) for v in values):
        raise InputError(f"expected 1 or 3 finite numbers; received {values!r}.", name, "ImageProcessor")
    return tuple(float(v) for v in values) * (3 // len(values))


def _check_size(size, name: str, *forms: tuple[str, ...]) -> None:
    if not (isinstance(size, dict) and tuple(sorted(size)) in [tuple(sorted(form)) for form in forms]
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size.values())):  # fmt: skip
        expected = " or ".join("{" + ", ".join(f'"{key}": N' for key in form) + "}" for form in forms)
        raise InputError(f"expected {expected} of positive integers; received {size!r}.", name, "ImageProcessor")


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise InputError("reading and resizing images needs Pillow: pip install pillow (or 'keras_tfm[hub]').",
                         "images", "ImageProcessor") from None  # fmt: skip
    return Image


def _pil_filter(resample: int):
    return getattr(_pillow().Resampling, FILTERS[resample].upper())


def _as_pil(image, index: int, convert_rgb: bool):
    """`image` as a PIL image: a file read whole as transformers' `load_image` reads one (a broken or cut one
    refused, by name; EXIF orientation applied, then RGB), an array taken as 8-bit (16-bit scaled to 8), RGB
    where `convert_rgb` (a PIL image's or an array's transparency composited onto white, as the processors do)."""
    Image = _pillow()
    from PIL import ImageOps

    where = f"images[{index}]"
    if isinstance(image, (str, os.PathLike)):
        where = f"{where} ({os.fspath(image)!r})"
        try:
            with Image.open(image) as opened:
                opened.load()  # a truncated file fails here, not later
                image = ImageOps.exif_transpose(opened)  # a camera's orientation, as transformers' load_image
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            raise DataError(f"{where} is not a readable image ({error}).", argument="images") from None
        if convert_rgb and not image.mode.startswith("I"):  # a file's pixels as load_image gives them: RGB
            return image.convert("RGB")
    elif isinstance(image, np.ndarray):
        image = Image.fromarray(_eight_bits(image, where))
    elif not isinstance(image, Image.Image):
        raise DataError(f"{where}: expected a file path, a PIL image or a uint8 array; received a "
                        f"{type(image).__name__}.", argument="images")  # fmt: skip
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit grayscale: Pillow would clip it to 255
        image = Image.fromarray(_eight_bits(np.asarray(image), where))
    if not convert_rgb:
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def _eight_bits(array: np.ndarray, where: str) -> np.ndarray:
    """An image array as uint8: 16-bit values scaled (x / 257), 8-bit kept; others refused by name."""
    shaped = array.ndim == 2 or (array.ndim == 3 and array.shape[-1] in (1, 3, 4))
    if not shaped or min(array.shape[:2]) < 1:
        raise DataError(f"{where}: expected an image (height, width[, 1, 3 or 4 channels]); received shape "
                        f"{array.shape}.", argument="images")  # fmt: skip
    if array.dtype == np.uint16 or (array.dtype.kind in "iu" and array.dtype != np.uint8 and array.max() > 255):
        array = np.round(array.astype("float64") / 257).astype("uint8")
    elif array.dtype != np.uint8:
        raise DataError(f"{where}: expected uint8 or uint16 pixels; received {array.dtype} (float pixels are "
                        "ambiguous: scale them to 0-255 uint8).", argument="images")  # fmt: skip
    return array[..., 0] if array.ndim == 3 and array.shape[-1] == 1 else array


def _center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """The center `height` x `width` of `pixels` `(h, w, c)`, padded with zeros where it is smaller
    (transformers' `center_crop`)."""
    rows, cols = pixels.shape[:2]
    if height > rows or width > cols:
        top, left = max(height - rows, 0) // 2, max(width - cols, 0) // 2
        padded = np.zeros((max(rows, height), max(cols, width), pixels.shape[2]), pixels.dtype)
        padded[top : top + rows, left : left + cols] = pixels
        pixels, rows, cols = padded, *padded.shape[:2]
    top, left = (rows - height) // 2, (cols - width) // 2
    return pixels[top : top + height, left : left + width]
