"""Generated pictures of shapes on textured backgrounds, with every label a dense-prediction task needs: a class per
pixel (segmentation), a box and class per shape (detection), and the count of each kind (a question over the
image). Made by NumPy from a seed in a second, so recipes and tests train offline on CPU in minutes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from keras_tfm.errors import InputError

KINDS = ("circle", "square", "triangle")


@dataclasses.dataclass(frozen=True)
class Shapes:
    """`images` uint8 `(count, size, size, 3)`; `masks` uint8 `(count, size, size)`: 0 background, `k + 1` for
    kind `k`; `labels` int32 `(count, max_shapes)`: each shape's kind, -1 after the last; `boxes` float32
    `(count, max_shapes, 4)`: `(center_x, center_y, width, height)` fractions of the image; `counts` int32
    `(count, len(KINDS))`: the shapes of each kind."""

    images: np.ndarray
    masks: np.ndarray
    labels: np.ndarray
    boxes: np.ndarray
    counts: np.ndarray

    @property
    def class_names(self) -> list[str]:
        return list(KINDS)


def make_shapes(count: int, image_size: int = 64, max_shapes: int = 3, min_shapes: int = 1, seed: int = 0) -> Shapes:
    """`count` pictures of `min_shapes` to `max_shapes` shapes each (circles, squares, triangles of random colors
    and sizes, never overlapping) on backgrounds of random stripes and noise.

    Example:
    >>> shapes = make_shapes(4, image_size=32, max_shapes=2)
    >>> shapes.images.shape, shapes.labels.shape, shapes.boxes.shape
    ((4, 32, 32, 3), (4, 2), (4, 2, 4))
    """
    for name, value, lowest in (("count", count, 1), ("image_size", image_size, 16), ("max_shapes", max_shapes, 1),
                                ("min_shapes", min_shapes, 0)):  # fmt: skip
        if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
            raise InputError(f"expected an integer >= {lowest}; received {value!r}.", name, "make_shapes")
    if min_shapes > max_shapes:
        raise InputError(f"expected at most max_shapes ({max_shapes}); received {min_shapes}.", "min_shapes",
                         "make_shapes")  # fmt: skip
    rng = np.random.default_rng(seed)
    images = np.empty((count, image_size, image_size, 3), "uint8")
    masks = np.zeros((count, image_size, image_size), "uint8")
    labels = np.full((count, max_shapes), -1, "int32")
    boxes = np.zeros((count, max_shapes, 4), "float32")
    for index in range(count):
        images[index] = _background(rng, image_size)
        placed = _place(rng, image_size, int(rng.integers(min_shapes, max_shapes + 1)))
        for slot, (kind, x0, y0, side) in enumerate(placed):
            inside = _inside(kind, image_size, x0, y0, side)
            images[index][inside] = rng.integers(0, 256, 3)
            masks[index][inside] = kind + 1
            labels[index, slot] = kind
            boxes[index, slot] = _box(inside, image_size)
    counts = np.stack([(labels == kind).sum(1) for kind in range(len(KINDS))], axis=1).astype("int32")
    return Shapes(images, masks, labels, boxes, counts)


def _background(rng, size: int) -> np.ndarray:
    """Stripes at a random angle and period, plus noise: texture the shapes must be told apart from."""
    y, x = np.mgrid[:size, :size].astype("float32")
    angle, period = rng.uniform(0, np.pi), rng.uniform(4, 16)
    stripes = np.sin((x * np.cos(angle) + y * np.sin(angle)) * 2 * np.pi / period)[..., None]
    base, contrast = rng.uniform(60, 200, 3), rng.uniform(10, 50)
    pixels = base + contrast * stripes + rng.normal(0, 12, (size, size, 3))
    return np.clip(pixels, 0, 255).astype("uint8")


def _place(rng, size: int, number: int) -> list:
    """Up to `number` squares `(kind, x0, y0, side)` that do not overlap (a few tries each)."""
    placed = []
    for _ in range(number):
        for _ in range(20):
            side = int(rng.integers(max(size // 6, 6), size // 3 + 1))
            x0, y0 = (int(v) for v in rng.integers(0, size - side + 1, 2))
            if all(x0 + side <= a or a + s <= x0 or y0 + side <= b or b + s <= y0 for _, a, b, s in placed):
                placed.append((int(rng.integers(len(KINDS))), x0, y0, side))
                break
    return placed


def _inside(kind: int, size: int, x0: int, y0: int, side: int) -> np.ndarray:
    """The pixels of a shape in its `side` square at `(x0, y0)`."""
    y, x = np.mgrid[:size, :size].astype("float32") + 0.5
    u, v = (x - x0) / side, (y - y0) / side  # 0-1 across the square
    within = (u >= 0) & (u <= 1) & (v >= 0) & (v <= 1)
    if KINDS[kind] == "circle":
        return (u - 0.5) ** 2 + (v - 0.5) ** 2 <= 0.25
    if KINDS[kind] == "square":
        return within & (u >= 0.1) & (u <= 0.9) & (v >= 0.1) & (v <= 0.9)
    return within & (v >= 0.1) & (v <= 0.95) & (np.abs(u - 0.5) <= (v - 0.1) / 0.85 / 2)  # apex up


def _box(inside: np.ndarray, size: int) -> np.ndarray:
    rows, cols = np.flatnonzero(inside.any(1)), np.flatnonzero(inside.any(0))
    x0, x1, y0, y1 = cols[0], cols[-1] + 1, rows[0], rows[-1] + 1
    return np.asarray([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], "float32") / size


def shape_splits(args, min_shapes: int = 1, log=print) -> tuple[Shapes, Shapes]:
    """A recipe's training and test pictures from its flags (`shapes_flags`): `args.train_images` from `args.seed`,
    `args.test_images` from the next seed, each of `args.image_size` pixels and up to `args.max_shapes` shapes."""
    sizes = (args.image_size, args.max_shapes)
    train = make_shapes(args.train_images, *sizes, min_shapes=min_shapes, seed=args.seed)
    test = make_shapes(args.test_images, *sizes, min_shapes=min_shapes, seed=args.seed + 1)
    log(f"Data: {args.train_images:,} training and {args.test_images:,} test pictures of {args.image_size}x"
        f"{args.image_size} pixels, {min_shapes} to {args.max_shapes} shapes each (keras_tfm.data.make_shapes).")  # fmt: skip
    return train, test
