"""Pictures of what a transformer does: attention maps, attention rollout, learning curves (PNG).

Needs matplotlib (`pip install keras_tfm[dev]` or `pip install matplotlib`).
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_tfm.errors import InputError


def attention_rollout(attention_weights, residual_weight: float = 0.5) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020): how much each output token draws on each input token
    through all layers. Each layer's head-averaged attention is mixed with the identity (for the
    residual connection), rows are renormalized, and the layers are multiplied in order.

    Args:
        attention_weights: list of `(batch, num_heads, tokens, tokens)` arrays, first layer first
            (e.g. from `ViT(...)(images, return_attention_weights=True)`).
        residual_weight: weight of the identity in each layer's mix.

    Returns:
        `(batch, tokens, tokens)`; each row sums to 1.
    """
    rollout = None
    for weights in attention_weights:
        layer = np.asarray(ops.convert_to_numpy(ops.cast(weights, "float32"))).mean(axis=1)
        layer = residual_weight * np.eye(layer.shape[-1])[None] + (1.0 - residual_weight) * layer
        layer = layer / layer.sum(axis=-1, keepdims=True)
        rollout = layer if rollout is None else layer @ rollout
    return rollout


def plot_attention_maps(image, attention_weights, path: str, layer: int = -1, class_token: bool = True) -> str:
    """Saves a PNG: the image, the class token's attention of each head in `layer`, and the rollout.

    Args:
        image: `(height, width, channels)` (or `(height, width)`), values in [0, 1] or [0, 255].
        attention_weights: the list returned with `return_attention_weights=True`, for a batch
            whose first element is `image`.
        path: where to write the PNG.
        layer: which layer's heads to draw.
        class_token: the first token is a class token (ViT); False draws the mean attention.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    image = np.asarray(image, "float32")
    if image.max() > 1.0:
        image = image / 255.0
    weights = np.asarray(ops.convert_to_numpy(ops.cast(attention_weights[layer], "float32")))[0]  # (heads, T, T)
    num_heads, tokens = weights.shape[0], weights.shape[-1]
    patches = tokens - 1 if class_token else tokens
    height, width = image.shape[:2]
    rows = max(1, int(round((patches * height / width) ** 0.5)))  # the grid has the image's aspect ratio
    cols = patches // rows
    if rows * cols != patches:
        raise InputError(
            f"{patches} patch tokens do not tile a {height}x{width} image as a grid of its aspect ratio.",
            caller="plot_attention_maps",
        )
    source = 0 if class_token else slice(None)
    offset = 1 if class_token else 0

    def to_grid(row):
        row = row[..., offset:] if class_token else row.mean(axis=0)
        return _grid_to_pixels(row.reshape(rows, cols), height, width)

    rollout = attention_rollout([w[:1] for w in attention_weights])[0]
    layer_number = layer % len(attention_weights)
    panels = [("image", None)] + [
        (f"layer {layer_number} head {h}", to_grid(weights[h, source])) for h in range(num_heads)
    ]
    panels.append(("rollout", to_grid(rollout[source])))
    figure, axes = plt.subplots(1, len(panels), figsize=(2.2 * len(panels), 2.4))
    for axis, (title, heat) in zip(np.atleast_1d(axes), panels):
        axis.imshow(image, cmap=None if image.ndim == 3 else "gray")
        if heat is not None:
            axis.imshow(heat, cmap="inferno", alpha=0.6)
        axis.set_title(title, fontsize=8)
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _grid_to_pixels(grid: np.ndarray, height: int, width: int) -> np.ndarray:
    """`(rows, cols)` patch values -> `(height, width)`, each pixel taking its patch's value (also when
    the image was resized for the model, so that the sides are not multiples of the grid)."""
    rows, cols = grid.shape
    return grid[(np.arange(height) * rows) // height][:, (np.arange(width) * cols) // width]


def plot_learning_curves(history, path: str, title: str = "") -> str:
    """Saves a PNG with one panel per metric of `history` (what `model.fit` returns, or its
    `.history` dict), training and validation (`val_*`) curves together."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = getattr(history, "history", history)  # a keras.callbacks.History
    metrics = [name for name in history if not name.startswith("val_")]
    if not metrics:
        raise InputError(
            f"`history` holds no training metric to plot; received the keys {sorted(history)}.",
            caller="plot_learning_curves",
        )
    figure, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3), squeeze=False)
    for axis, name in zip(axes[0], metrics):
        for label, values in (("train", history[name]), ("validation", history.get(f"val_{name}"))):
            if values is not None:  # epochs counted from 1, as the console counts them
                axis.plot(range(1, len(values) + 1), values, label=label)
        axis.set_xlabel("epoch")
        axis.set_title(name)
        axis.legend()
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_patch_features(images, patch_features, path: str) -> str:
    """Saves a PNG: each image beside its patch features drawn as colours, their first three principal
    components (over all the images' patches) mapped to red, green and blue, as the DINOv2 paper draws
    them: patches of one kind of part come out in one colour across images.

    Args:
        images: `(count, height, width[, channels])`, values in [0, 1] or [0, 255].
        patch_features: `(count, patches, dim)` (`model.embed_images(images, pooling="patches")`), the patches
            of a square grid in row order.
        path: where to write the PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    features = np.asarray(patch_features, "float64")
    if features.ndim != 3 or int(round(features.shape[1] ** 0.5)) ** 2 != features.shape[1]:
        raise InputError(f"expected (count, patches, dim) of a square grid; received shape {features.shape}.",
                         "patch_features", "plot_patch_features")  # fmt: skip
    count, patches, dim = features.shape
    flat = features.reshape(-1, dim) - features.reshape(-1, dim).mean(0)
    _, _, components = np.linalg.svd(flat, full_matrices=False)  # principal directions, largest first
    projected = flat @ components[:3].T
    low, high = projected.min(0), projected.max(0)
    colours = ((projected - low) / np.maximum(high - low, 1e-12)).reshape(count, int(patches**0.5), -1, 3)
    figure, axes = plt.subplots(2, count, figsize=(2 * count, 4), squeeze=False)
    for index in range(count):
        image = np.asarray(images[index], "float64")
        axes[0, index].imshow(image / 255.0 if image.max() > 1.0 else image, cmap="gray")
        axes[1, index].imshow(colours[index], interpolation="nearest")
        for axis in axes[:, index]:
            axis.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_detections(images, found: list, truth: list, class_names: list, path: str) -> str:
    """Saves a PNG: each image with its true boxes (dashed) and the detected ones (solid, with class and score).

    Args:
        images: uint8 `(count, height, width, 3)`.
        found: per image, `detection.detections`' dict (`scores`, `labels`, corner `boxes` in pixels).
        truth: per image, `{"labels", "boxes"}` with corner boxes in pixels.
        class_names: the labels' names.
        path: where to write the PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(images), figsize=(2.6 * len(images), 2.9), squeeze=False)
    colors = plt.get_cmap("tab10")
    for axis, image, detected, expected in zip(axes[0], images, found, truth):
        axis.imshow(image)
        axis.axis("off")
        for boxes, labels, scores, style in ((expected["boxes"], expected["labels"], None, "--"),
                                             (detected["boxes"], detected["labels"], detected["scores"], "-")):  # fmt: skip
            for index, (box, label) in enumerate(zip(boxes, labels)):
                x0, y0, x1, y1 = box
                axis.add_patch(plt.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, linestyle=style, linewidth=1.5,
                                             edgecolor=colors(int(label) % 10)))  # fmt: skip
                if scores is not None:
                    axis.text(x0, y0, f"{class_names[int(label)]} {scores[index]:.2f}", fontsize=7, va="bottom",
                              color="white", backgroundcolor=colors(int(label) % 10))  # fmt: skip
    figure.suptitle("detections (solid) and the true boxes (dashed)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_segmentation(images, true_maps, predicted_maps, class_names: list, path: str) -> str:
    """Saves a PNG: each image above its true label map and the predicted one, each class in its color.

    Args:
        images: uint8 `(count, height, width, 3)`.
        true_maps, predicted_maps: int `(count, height, width)`, class ids.
        class_names: the ids' names, for the legend.
        path: where to write the PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colors = plt.get_cmap("tab10")
    palette = np.asarray([colors(i % 10)[:3] for i in range(len(class_names))])
    figure, axes = plt.subplots(3, len(images), figsize=(1.9 * len(images), 6), squeeze=False)
    for column, (image, truth, predicted) in enumerate(zip(images, true_maps, predicted_maps)):
        for row, (picture, title) in enumerate(((image, "picture"), (palette[truth], "true"),
                                                (palette[predicted], "predicted"))):  # fmt: skip
            axes[row, column].imshow(picture)
            axes[row, column].axis("off")
            axes[row, column].set_title(title, fontsize=8)
    handles = [Patch(color=palette[i], label=name) for i, name in enumerate(class_names)]
    figure.legend(handles=handles, loc="lower center", ncol=len(class_names), fontsize=8)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_query_attention(images, weights, questions: list, path: str) -> str:
    """Saves a PNG: each image with its question, and one query's attention over the image's patches per head.

    Args:
        images: uint8 `(count, height, width, 3)`.
        weights: `(count, heads, patches)`, one query's attention weights over a square grid of patches.
        questions: each image's question, its title.
        path: where to write the PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weights = np.asarray(weights)
    count, heads, patches = weights.shape
    grid = int(round(np.sqrt(patches)))
    figure, axes = plt.subplots(count, heads + 1, figsize=(1.8 * (heads + 1), 1.9 * count), squeeze=False)
    for row, (image, rows, question) in enumerate(zip(images, weights, questions)):
        axes[row, 0].imshow(image)
        axes[row, 0].set_title(question, fontsize=7)
        for head, values in enumerate(rows, 1):
            axes[row, head].imshow(image)
            overlay = _grid_to_pixels(values.reshape(grid, grid), *image.shape[:2])
            axes[row, head].imshow(overlay, cmap="inferno", alpha=0.6)
            axes[row, head].set_title(f"head {head}", fontsize=7)
    for axis in axes.ravel():
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
