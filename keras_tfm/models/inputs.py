"""The checks of what a model is given: ids inside their tables, labels inside the logits, no empty
batch, weights files of this model. Compiled code cannot check ids (an XLA gather reads an id outside its
table silently), so the model's entry points check NumPy inputs, lists and eager tensors before Keras runs."""

from __future__ import annotations

import math
import os

import keras
import numpy as np

from keras_tfm.compat import concrete_values, in_symbolic_scope
from keras_tfm.errors import CheckpointError, InputError


def check_ids(model, args: tuple, kwargs: dict) -> None:
    """Refuses inputs that hold an id outside its table: NumPy arrays, lists and eager backend
    tensors, with the same message on every backend. Compiled code cannot check (inside `fit`'s
    steps, `jax.jit` or `tf.function` the ids are symbolic): there an XLA gather reads such an id
    silently (NaN on JAX, the nearest row on TensorFlow) and PyTorch raises an IndexError that names
    nothing, so `fit`, `evaluate` and `predict` check their NumPy data before they start."""
    id_inputs = model._id_inputs()
    names = list(id_inputs)
    if not names:
        return
    given = dict(kwargs)
    if args and isinstance(args[0], dict):  # `fit` and `predict` pass one structure
        given.update(args[0])
    elif (
        len(args) == 1
        and isinstance(args[0], (tuple, list))
        and len(args[0]) > 1
        and all(isinstance(value, np.ndarray) for value in args[0])
    ):
        given.update(zip(names, args[0]))  # a (source_ids, target_ids) pair
    else:
        given.update(zip(names, args))
    batches = {}
    for name, spec in id_inputs.items():
        value = given.get(name)
        shape = _static_shape(value)
        if spec is None or shape is None:
            continue
        limit, setting = spec
        if len(shape) not in getattr(model, "id_ranks", (2,)):
            shown = " or ".join(("(batch, length)", "(batch, k, length)")[: len(getattr(model, "id_ranks", (2,)))])
            raise InputError(
                f"`{name}` must have shape {shown}; received shape {shape}.",
                name,
                caller=type(model).__name__,
            )
        if shape[-1] == 0 and setting != "length":
            raise InputError(
                f"`{name}` must hold at least one id per row; received shape {shape}.",
                name,
                caller=type(model).__name__,
            )
        if shape[0] is not None:
            batches[name] = shape[0]
        if len(set(batches.values())) > 1:
            raise InputError(
                "every input must have the same batch size; received "
                + ", ".join(f"`{key}` {size}" for key, size in batches.items())
                + ".",
                name,
                caller=type(model).__name__,
            )
        if isinstance(limit, str):  # positions in another input's sequence
            bound = _static_shape(given.get(limit))
            if bound is None or bound[-1] is None:
                continue
            limit = bound[-1]
        # placeholders of shape inference may be float: TensorFlow's distributed build averages the ids
        kind = None if in_symbolic_scope() else _dtype_name(value)
        if kind is not None and not kind.startswith(("int", "uint")):  # a cast would truncate 1.9 to 1
            raise InputError(
                f"`{name}` must hold integer ids; received {kind} values.", name, caller=type(model).__name__
            )
        ids = _numbers(value, "iu")
        if ids is None:
            continue
        lowest, highest = ids.min(), ids.max()  # one pass each over what may be a whole dataset
        if lowest < 0 or highest >= limit:
            wrong = lowest if lowest < 0 else highest
            raise InputError(
                f"`{name}` must hold {'positions' if setting == 'length' else 'ids'} in "
                f"[0, {setting}={limit}); received {wrong}.",
                name,
                caller=type(model).__name__,
            )


def check_labels(model, y) -> None:
    """Refuses NumPy (or list) labels outside the logits' classes when the compiled loss is a
    sparse cross-entropy. Compiled code cannot: XLA reads such a label silently (a finite, wrong
    loss on JAX, NaN on TensorFlow), and PyTorch raises an IndexError that names nothing.
    A label equal to the loss's `ignore_class` is allowed."""
    label_range = model._label_range()
    labels = _numbers(y, "iuf") if label_range is not None else None
    if labels is None:
        return
    loss = getattr(model, "loss", None)
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:
            return
    if isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
        ignored = loss.ignore_class
    elif loss is keras.losses.sparse_categorical_crossentropy:
        ignored = None
    else:  # other losses read their targets otherwise
        return
    limit, setting = label_range
    if labels.min() >= 0 and labels.max() < limit:
        return
    outside = labels[(labels < 0) | (labels >= limit)]
    if ignored is not None:
        outside = outside[outside != ignored]
    if outside.size:
        allowed = "" if ignored is None else f" (or ignore_class={ignored})"
        raise InputError(
            f"labels (`y`) must be ids in [0, {setting}={limit}){allowed} "
            f"for a sparse cross-entropy loss; received {outside.flat[0]}.",
            caller=type(model).__name__,
        )


def check_not_empty(model, x, method: str) -> None:
    """Refuses NumPy (or list) inputs without a row: Keras' JAX trainer loses the model's weights
    when `fit`, `evaluate` or `predict` sees no batch at all."""
    values = x.values() if isinstance(x, dict) else x if isinstance(x, tuple) else [x]  # tuple: (source, target)
    for value in values:
        if isinstance(value, (np.ndarray, list)) and len(value) == 0:
            raise InputError(f"{type(model).__name__}.{method}: `x` has no rows (an empty batch); give at least one.")


def check_data(model, method: str, x, args: tuple, kwargs: dict) -> None:
    """The inputs `x`, the labels `y` (the first of `args`, or a keyword) and the
    `validation_data` of a call to `fit`, `evaluate` or `*_on_batch`."""
    check_not_empty(model, x, method)
    check_rows(model, method, x)
    check_ids(model, (x,), {})
    check_labels(model, args[0] if args else kwargs.get("y"))
    targets = getattr(model, "check_targets", None)  # a model whose targets are not one label per output
    y = args[0] if args else kwargs.get("y")
    if targets is not None and y is not None:  # None: the targets come inside `x` (a dataset, a generator)
        targets(y, "y")
    validation_data = kwargs.get("validation_data")
    if isinstance(validation_data, (tuple, list)) and len(validation_data) in (2, 3):
        check_ids(model, (validation_data[0],), {})
        check_labels(model, validation_data[1])
        if targets is not None:
            targets(validation_data[1], "validation_data")


def check_rows(model, method: str, x) -> None:
    """Refuses a dict of inputs whose arrays hold different numbers of examples (CLIP's images and texts): Keras
    fails while writing its own message for a dict."""
    if not isinstance(x, dict):
        return
    counts = {name: len(value) for name, value in x.items() if isinstance(value, np.ndarray) and value.ndim}
    if len(set(counts.values())) > 1:
        raise InputError(f"every input must hold one row per example, as many as the others; received {counts}.",
                         "x", caller=f"{type(model).__name__}.{method}")  # fmt: skip


def check_weights_file(model, path: str) -> None:
    """Refuses a `.weights.h5` file that is missing, damaged or holds another model's weights:
    Keras loads what matches (the first block of a deeper model, say) without a word."""
    import h5py

    if not os.path.isfile(path):
        raise CheckpointError(f"{type(model).__name__}.load_weights: there is no file {path!r}.")
    shapes = []
    try:
        with h5py.File(path, "r") as file:
            file.visititems(
                lambda name, item: (
                    shapes.append(tuple(item.shape))
                    if isinstance(item, h5py.Dataset) and not name.startswith("optimizer/")
                    else None
                )
            )
    except (OSError, ValueError) as error:
        raise InputError(
            f"{type(model).__name__}.load_weights: {path!r} is damaged or not a Keras weights file ({error})."
        ) from None
    # LoRA pairs are not written by `save_weights` (the merged kernel is)
    expected = [tuple(weight.shape) for weight in model.weights if "lora_" not in weight.path]
    if sorted(shapes) != sorted(expected):
        raise InputError(
            f"{type(model).__name__}.load_weights: {path!r} holds the weights of another model: "
            f"{len(shapes)} arrays of {sum(math.prod(s) for s in shapes):,} numbers, where this "
            f"{type(model).__name__} has {len(expected)} of {sum(math.prod(s) for s in expected):,}."
        )


def _static_shape(value) -> tuple | None:
    """The shape of an array, list or tensor (backend or symbolic; unknown dimensions None); None for
    anything else. Reads no values."""
    if isinstance(value, list):
        try:
            return np.shape(value)
        except ValueError:  # ragged: Keras refuses it itself
            return None
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    # a dimension the trace does not know (None, a JAX symbolic dimension, a tensor) stays None
    return tuple(int(d) if isinstance(d, (int, np.integer)) else None for d in shape)


def _dtype_name(value) -> str | None:
    """The dtype of an array, list or tensor (backend or symbolic), as Keras names it; None if it has
    none (a dataset, a generator). Reads no values."""
    if isinstance(value, list):
        try:
            value = np.asarray(value)
        except ValueError:
            return None
    dtype = getattr(value, "dtype", None)
    if dtype is None or isinstance(value, keras.KerasTensor):  # a spec: Keras' distributed build makes ids float
        return None
    try:
        return keras.backend.standardize_dtype(dtype)
    except (ValueError, TypeError):
        return None


def _numbers(value, kinds: str) -> np.ndarray | None:
    """`value` as a non-empty NumPy array of one of these dtype kinds, if it is a NumPy array, a list of
    such numbers or an eager backend tensor; else None. Symbolic tensors and datasets are not read (that
    would trace or consume the data); Keras refuses ragged lists itself."""
    if not isinstance(value, (np.ndarray, list)):
        value = concrete_values(value)
        if value is None:
            return None
    try:
        array = np.asarray(value)
    except ValueError:
        return None
    return array if array.size and array.dtype.kind in kinds else None


def checked_class_names(class_names: list | None, num_classes: int, caller: str) -> list[str]:
    """The classes' names as strings (default LABEL_0, ...), one per class."""
    names = [str(name) for name in class_names] if class_names else [f"LABEL_{i}" for i in range(num_classes)]
    if len(names) != num_classes:
        raise InputError(f"expected {num_classes} names (num_classes); received {len(names)}: {class_names!r:.200}.",
                         "class_names",
                         caller=caller)  # fmt: skip
    return names
