"""What every model of the zoo shares: weights made on first use, and built on demand where Keras needs them."""

from __future__ import annotations

import inspect
import json
import math
import os
import warnings

import keras
import numpy as np

from keras_tfm.compat import BuildBeforeQuantizeCheck, concrete_values, in_symbolic_scope, sublayers
from keras_tfm.errors import CheckpointError, InputError
from keras_tfm.layers import lora
from keras_tfm.layers.blocks import DecoderBlock, EncoderBlock
from keras_tfm.layers.quantization import QuantizationConfigMixin, one_garbage_collection


class Model(BuildBeforeQuantizeCheck, QuantizationConfigMixin, keras.Model):
    """A `keras.Model` whose weights are created on first use, so that even `gpt2_xl()` is
    constructed for free: the first call, `fit`, `generate` or `build()` creates them.

    Keras' methods that read a model's weights would refuse an unbuilt model (`count_params`,
    `load_weights`, `export`, `quantize`) or see no weights in it (`summary`, `get_weights`); here
    they build it first, as a functional model already is. A model quantized with `quantize("int8")` keeps
    its quantized layers in its config, so that its `.keras` file loads again. `remat = True`
    makes every block recompute its activations in the backward pass (`keras_tfm.layers.remat`).
    `enable_lora(rank)` freezes it for LoRA fine-tuning (`keras_tfm.layers.lora`).

    Example:
    >>> keras_tfm.gpt2_small().count_params()
    124439808
    """

    # Layers that a LoRA fine-tuning trains whole by default: a task head made new for the task.
    lora_trainable_layer_names: tuple = ()
    # The learning rate of the AdamW that `compile()` gives by default.
    default_learning_rate: float = 1e-3

    def default_loss(self) -> keras.losses.Loss | None:
        """The loss `compile()` gives by default: the model's natural loss (None: no default)."""
        return None

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs) -> None:
        """Keras' `compile`, with this model's defaults for each argument left `"auto"`: AdamW at
        `default_learning_rate`, `default_loss()` and, with that loss, accuracy. Every model with a task
        comes compiled so, so that `model.fit(x, y)` works at once; an explicit `compile(...)` replaces
        the defaults.

        Example:
        >>> vit = keras_tfm.vit_tiny(num_classes=10, image_size=32, patch_size=8)
        >>> vit.compile(optimizer=keras.optimizers.AdamW(1e-4))  # the default loss and metric stay
        """
        if isinstance(optimizer, str) and optimizer == "auto":
            optimizer = keras.optimizers.AdamW(self.default_learning_rate)
        default_loss = isinstance(loss, str) and loss == "auto"
        if default_loss:
            loss = self.default_loss()
        if isinstance(metrics, str) and metrics == "auto":  # accuracy goes with the default loss only
            metrics = [keras.metrics.SparseCategoricalAccuracy("accuracy")] if default_loss and loss else None
        # Keras keeps the metrics of an earlier compile when given None: [] replaces them with none.
        super().compile(optimizer=optimizer, loss=loss, metrics=[] if metrics is None else metrics, **kwargs)

    def get_compile_config(self) -> dict:
        config = super().get_compile_config()
        if config:  # whether there is optimizer state in the file to load (a model compiled, never trained: none)
            config["optimizer_built"] = bool(getattr(self.optimizer, "built", False))
        return config

    def compile_from_config(self, config: dict) -> None:
        # Keras skips a custom `compile` when loading a `.keras` file; this one does what Keras' does.
        config = dict(config)
        optimizer_built = config.pop("optimizer_built", True)
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built and optimizer_built:
            self.optimizer.build(self.trainable_variables)  # so that the saved optimizer state loads

    def _compile_defaults(self) -> None:
        """Compiles with the defaults at the end of construction (a subclass's `__init__` calls it)."""
        if self.default_loss() is not None:
            self.compile()

    @staticmethod
    def _check_heads(model: str, hidden_dim: int, num_heads: int) -> None:
        """Refuses at construction a width the attention heads cannot split, which the blocks would
        only find when the weights are made (at the first call, possibly deep inside `fit`)."""
        if num_heads < 1 or hidden_dim % num_heads:
            raise InputError(
                f"{model}: hidden_dim must be a multiple of num_heads; received hidden_dim={hidden_dim}, "
                f"num_heads={num_heads}."
            )

    def get_config(self) -> dict:
        """Keras' config and every constructor argument of the model's class, each read from the
        attribute of its name (every model keeps its arguments as attributes)."""
        config = super().get_config()
        config.update({name: self._config_value(name) for name in self._constructor_arguments()})
        return config

    def _config_value(self, name: str):
        return getattr(self, name)

    @classmethod
    def _constructor_arguments(cls) -> list[str]:
        """The named arguments of `__init__` of this class and its bases up to `Model` (those a subclass
        passes on through `**kwargs` included), in order."""
        names = []
        for klass in cls.__mro__[: cls.__mro__.index(Model)]:
            if "__init__" in vars(klass):
                for parameter in inspect.signature(klass.__init__).parameters.values():
                    named = parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
                    if named and parameter.name not in ("self", "default_name", *names):
                        names.append(parameter.name)
        return names

    @property
    def remat(self) -> bool:
        """Whether the blocks recompute their activations in training's backward pass instead of
        storing them: less memory for one more forward pass of each block, the same gradients. Also a
        constructor argument; set it before `compile` (a compiled training step keeps its form)."""
        blocks = self._blocks()
        return bool(blocks) and all(block.remat for block in blocks)

    @remat.setter
    def remat(self, value: bool) -> None:
        for block in self._blocks():
            block.remat = bool(value)

    def _blocks(self) -> list:
        return [layer for layer in sublayers(self) if isinstance(layer, (EncoderBlock, DecoderBlock))]

    def quantize(self, mode=None, **kwargs) -> None:
        # Keras warns once for every layer without a quantized form (each LayerNormalization, Dropout,
        # position table, ...): dozens of lines that say nothing about what was quantized.
        with warnings.catch_warnings(), one_garbage_collection():
            warnings.filterwarnings("ignore", message="Layer .* does not have a `quantize` method implemented")
            super().quantize(mode, **kwargs)

    def enable_lora(
        self,
        rank: int,
        target_layer_names=lora.DEFAULT_TARGETS,
        lora_alpha: float | None = None,
        trainable_layer_names=None,
    ) -> None:
        """Prepares the model for LoRA fine-tuning (call before `compile`): every weight is frozen
        except a rank-`rank` update `(lora_alpha / rank) * A @ B` of each `Dense` named in
        `target_layer_names` (by default every attention's query and value projections, as in the
        LoRA paper and Hugging Face `peft`) and the layers in `trainable_layer_names` (by default
        the model's task head where it has one that fine-tuning makes new: ViT's `head`,
        `BertClassifier`'s `classifier`). The model's outputs are unchanged until training moves `B`
        from zero. `save("x.keras")` then writes a plain model with the updates merged into its
        kernels; `save_lora_weights("x.npz")` writes only the small `A`, `B` pairs.

        Example:
        >>> model = keras_tfm.gpt2_small()  # or keras_tfm.from_huggingface("gpt2"), with its weights
        >>> model.enable_lora(rank=8)
        >>> sum(int(np.prod(w.shape)) for w in model.trainable_weights)  # of 124 million
        294912
        """
        self._build_on_demand()
        if trainable_layer_names is None:
            present = {layer.name for layer in sublayers(self)}
            trainable_layer_names = [name for name in self.lora_trainable_layer_names if name in present]
        lora.enable_lora(self, rank, target_layer_names, lora_alpha, trainable_layer_names)
        if self.compiled:  # Keras reads which weights train at compile: again, with a new optimizer of the same config
            self.compile_from_config({**self.get_compile_config(), "optimizer_built": False})

    def save_lora_weights(self, filepath: str) -> None:
        """Writes only the LoRA pairs to a `.npz` file (1.2 MB for GPT-2 small at rank 8: 294,912 floats)."""
        lora.save_lora_weights(self, filepath)

    def load_lora_weights(self, filepath: str) -> None:
        """Loads pairs written by `save_lora_weights` onto the same base weights, enabling LoRA with
        the file's rank and layers first if it is not enabled yet."""
        self._build_on_demand()
        lora.load_lora_weights(self, filepath)

    def _id_inputs(self) -> dict[str, tuple[int | str, str] | None]:
        """The inputs that hold ids, in the order of `call`'s arguments: name -> (how many ids its
        table has, that setting's name); or (the name of the input whose length bounds it, "length")
        for positions; or None for an input between them that holds no ids."""
        return {}

    def _check_ids(self, args: tuple, kwargs: dict) -> None:
        """Refuses inputs that hold an id outside its table: NumPy arrays, lists and eager backend
        tensors, with the same message on every backend. Compiled code cannot check (inside `fit`'s
        steps, `jax.jit` or `tf.function` the ids are symbolic): there an XLA gather reads such an id
        silently (NaN on JAX, the nearest row on TensorFlow) and PyTorch raises an IndexError that names
        nothing, so `fit`, `evaluate` and `predict` check their NumPy data before they start."""
        id_inputs = self._id_inputs()
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
            if len(shape) != 2:
                raise InputError(
                    f"`{name}` must have shape (batch, length); received shape {shape}.",
                    name,
                    caller=type(self).__name__,
                )
            if shape[1] == 0 and setting != "length":
                raise InputError(
                    f"`{name}` must hold at least one id per row; received shape {shape}.",
                    name,
                    caller=type(self).__name__,
                )
            if shape[0] is not None:
                batches[name] = shape[0]
            if len(set(batches.values())) > 1:
                raise InputError(
                    "every input must have the same batch size; received "
                    + ", ".join(f"`{key}` {size}" for key, size in batches.items())
                    + ".",
                    name,
                    caller=type(self).__name__,
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
                    f"`{name}` must hold integer ids; received {kind} values.", name, caller=type(self).__name__
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
                    caller=type(self).__name__,
                )

    def _label_range(self) -> tuple[int, str] | None:
        """How many classes the model's logits score, and that setting's name: the bound of the
        integer labels a sparse cross-entropy reads. None where the model outputs no logits."""
        return None

    def _check_labels(self, y) -> None:
        """Refuses NumPy (or list) labels outside the logits' classes when the compiled loss is a
        sparse cross-entropy. Compiled code cannot: XLA reads such a label silently (a finite, wrong
        loss on JAX, NaN on TensorFlow), and PyTorch raises an IndexError that names nothing.
        A label equal to the loss's `ignore_class` is allowed."""
        label_range = self._label_range()
        labels = _numbers(y, "iuf") if label_range is not None else None
        if labels is None:
            return
        loss = getattr(self, "loss", None)
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
                caller=type(self).__name__,
            )

    def _check_not_empty(self, x, method: str) -> None:
        """Refuses NumPy (or list) inputs without a row: Keras' JAX trainer loses the model's weights
        when `fit`, `evaluate` or `predict` sees no batch at all."""
        values = x.values() if isinstance(x, dict) else x if isinstance(x, tuple) else [x]  # tuple: (source, target)
        for value in values:
            if isinstance(value, (np.ndarray, list)) and len(value) == 0:
                raise InputError(
                    f"{type(self).__name__}.{method}: `x` has no rows (an empty batch); give at least one."
                )

    def _check_data(self, method: str, x, args: tuple, kwargs: dict) -> None:
        """The inputs `x`, the labels `y` (the first of `args`, or a keyword) and the
        `validation_data` of a call to `fit`, `evaluate` or `*_on_batch`."""
        self._check_not_empty(x, method)
        self._check_ids((x,), {})
        self._check_labels(args[0] if args else kwargs.get("y"))
        validation_data = kwargs.get("validation_data")
        if isinstance(validation_data, (tuple, list)) and len(validation_data) in (2, 3):
            self._check_ids((validation_data[0],), {})
            self._check_labels(validation_data[1])

    def __call__(self, *args, **kwargs):
        # a training step's batch was checked by `fit` (reading it here would wait for the device each step)
        if not kwargs.get("training"):
            self._check_ids(args, kwargs)
        return super().__call__(*args, **kwargs)

    def fit(self, x=None, *args, **kwargs):
        self._check_data("fit", x, args, kwargs)
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        self._check_data("evaluate", x, args, kwargs)
        return super().evaluate(x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        self._check_not_empty(x, "predict")
        self._check_ids((x,), {})
        return super().predict(x, *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        self._check_data("train_on_batch", x, args, kwargs)
        return super().train_on_batch(x, *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        self._check_data("test_on_batch", x, args, kwargs)
        return super().test_on_batch(x, *args, **kwargs)

    def predict_on_batch(self, x):
        self._check_not_empty(x, "predict_on_batch")
        self._check_ids((x,), {})
        return super().predict_on_batch(x)

    def _build_on_demand(self) -> None:
        if not self.built:
            self.build()

    _tokenizer = None

    @property
    def tokenizer(self):
        """The tokenizer that turns text into this model's ids (`keras_tfm.data`'s tokenizers), or None.
        Set by `from_huggingface` from the checkpoint's files, by the recipes, or by hand; a `.keras` file
        keeps it. One that makes more ids than the model has embeddings for is refused."""
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer) -> None:
        from keras_tfm.data.tokenizers import Tokenizer

        if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
            raise InputError(
                f"expected a keras_tfm.data tokenizer (the `Tokenizer` protocol) or None; received a "
                f"{type(tokenizer).__name__}.",
                "tokenizer",
                caller=type(self).__name__,
            )
        limit = getattr(self, "vocabulary_size", None)  # a translator's two tables: each side's tokenizer
        size = tokenizer.vocabulary_size if tokenizer is not None else None
        if isinstance(limit, int) and size is not None and size > limit:
            raise InputError(
                f"the tokenizer makes {size:,} ids, more than the model's "
                f"vocabulary_size={limit:,}: its ids from {limit} on have no embedding. Give the tokenizer the "
                "model was trained with, or a model with a larger `vocabulary_size`.",
                "tokenizer",
                caller=type(self).__name__,
            )
        self._tokenizer = tokenizer

    # A checkpoint's generation settings (transformers' `generation_config.json`: `eos_token_id`, one id or
    # several, and `pad_token_id`), which `generate` uses where not told otherwise; or None.
    generation_config = None

    def save_assets(self, dir_path: str) -> None:
        """Keras' saving calls this: the tokenizer and the generation settings go into the `.keras` file
        beside the weights."""
        if self.tokenizer is not None:
            from keras_tfm.data.tokenizers import save_tokenizer

            save_tokenizer(self.tokenizer, dir_path)
        if self.generation_config:
            with open(os.path.join(dir_path, "generation_config.json"), "w") as file:
                json.dump(self.generation_config, file)

    def load_assets(self, dir_path: str) -> None:
        """Keras' loading calls this: a tokenizer saved with the model comes back with it."""
        path = os.path.join(dir_path, "tokenizer.json")
        if os.path.isfile(path):
            from keras_tfm.data.tokenizers import load_tokenizer

            self.tokenizer = load_tokenizer(path)
        path = os.path.join(dir_path, "generation_config.json")
        if os.path.isfile(path):
            with open(path) as file:
                self.generation_config = json.load(file)

    def count_params(self) -> int:
        self._build_on_demand()
        return super().count_params()

    def summary(self, *args, **kwargs):
        self._build_on_demand()
        return super().summary(*args, **kwargs)

    def get_weights(self) -> list:
        self._build_on_demand()
        return super().get_weights()

    def set_weights(self, weights) -> None:
        self._build_on_demand()
        super().set_weights(weights)

    def save(self, filepath, *args, **kwargs):
        self._build_on_demand()
        return super().save(filepath, *args, **kwargs)

    def save_weights(self, filepath, *args, **kwargs):
        self._build_on_demand()
        return super().save_weights(filepath, *args, **kwargs)

    def load_weights(self, filepath, *args, **kwargs):
        self._build_on_demand()
        if str(filepath).endswith(".weights.h5"):
            self._check_weights_file(str(filepath))
        return super().load_weights(filepath, *args, **kwargs)

    def _check_weights_file(self, path: str) -> None:
        """Refuses a `.weights.h5` file that is missing, damaged or holds another model's weights:
        Keras loads what matches (the first block of a deeper model, say) without a word."""
        import h5py

        if not os.path.isfile(path):
            raise CheckpointError(f"{type(self).__name__}.load_weights: there is no file {path!r}.")
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
                f"{type(self).__name__}.load_weights: {path!r} is damaged or not a Keras weights file ({error})."
            ) from None
        # LoRA pairs are not written by `save_weights` (the merged kernel is)
        expected = [tuple(weight.shape) for weight in self.weights if "lora_" not in weight.path]
        if sorted(shapes) != sorted(expected):
            raise InputError(
                f"{type(self).__name__}.load_weights: {path!r} holds the weights of another model: "
                f"{len(shapes)} arrays of {sum(math.prod(s) for s in shapes):,} numbers, where this "
                f"{type(self).__name__} has {len(expected)} of {sum(math.prod(s) for s in expected):,}."
            )

    def export(self, filepath, *args, **kwargs):
        self._build_on_demand()
        return super().export(filepath, *args, **kwargs)


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
