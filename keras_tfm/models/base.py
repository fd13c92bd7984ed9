"""What every model of the zoo shares: weights made on first use, and built on demand where Keras needs them."""

from __future__ import annotations

import inspect
import json
import os
import warnings

import keras

from keras_tfm.compat import BuildBeforeQuantizeCheck, int8_products_are_fast, sublayers
from keras_tfm.errors import InputError
from keras_tfm.export import formats
from keras_tfm.layers.blocks import DecoderBlock, EncoderBlock
from keras_tfm.layers.quantization import QuantizationConfigMixin, one_garbage_collection
from keras_tfm.models import lora
from keras_tfm.models.inputs import check_data, check_ids, check_not_empty, check_weights_file


class ZooModel(BuildBeforeQuantizeCheck, QuantizationConfigMixin, keras.Model):
    """A `keras.Model` whose weights are created on first use, so that even `gpt2_xl()` is
    constructed for free: the first call, `fit`, `generate` or `build()` creates them.

    Keras' methods that read a model's weights would refuse an unbuilt model (`count_params`,
    `load_weights`, `export`, `quantize`) or see no weights in it (`summary`, `get_weights`); here
    they build it first, as a functional model already is. A model quantized with `quantize("int8")` keeps
    its quantized layers in its config, so that its `.keras` file loads again. `remat = True`
    makes every block recompute its activations in the backward pass (`keras_tfm.layers.remat`).
    `enable_lora(rank)` freezes it for LoRA fine-tuning (`keras_tfm.models.lora`).

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

    def default_metrics(self) -> list:
        """The metrics `compile()` gives with the default loss: accuracy, unless the model says otherwise."""
        return [keras.metrics.SparseCategoricalAccuracy("accuracy")]

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
            metrics = self.default_metrics() if default_loss and loss else None
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
        attribute of its name (every model keeps its arguments as attributes). An argument that is a layer
        or model (an encoder, a tower, a head) is its serialized config, nested: a model of towers is
        configuration."""
        config = super().get_config()
        for name in self._constructor_arguments():
            value = self._config_value(name)
            config[name] = (
                keras.saving.serialize_keras_object(value) if isinstance(value, keras.layers.Layer) else value
            )
        return config

    @classmethod
    def from_config(cls, config: dict):
        """The model of `config`, its nested layers and models (as `get_config` writes them) made first."""
        made = {name: _unbuilt(config[name]) for name in cls._layer_arguments(config)}
        return super().from_config({**config, **made})

    @classmethod
    def _layer_arguments(cls, config: dict) -> list[str]:
        """The constructor arguments of `config` that hold a serialized layer or model."""
        names = set(cls._constructor_arguments())
        return [name for name, value in config.items() if name in names and _is_serialized_layer(value)]

    def _config_value(self, name: str):
        return getattr(self, name)

    @classmethod
    def _constructor_arguments(cls) -> list[str]:
        """The named arguments of `__init__` of this class and its bases up to `ZooModel` (those a subclass
        passes on through `**kwargs` included), in order."""
        names = []
        for klass in cls.__mro__[: cls.__mro__.index(ZooModel)]:
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
        if hasattr(self, "_generate_functions"):  # they hold the float kernels: free them now
            self._generate_functions.of(self)
        if mode == "int8" and keras.backend.backend() == "torch" and not int8_products_are_fast():
            warnings.warn(
                "this CPU has no VNNI instructions (avx512_vnni, avx_vnni): on PyTorch its int8 products are "
                "slower than float32 ones (0.4-0.5x measured decoding on AVX2 Intel and AMD CPUs). int8 saves "
                "memory here, not time.",
                stacklevel=2,
            )

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

    def _label_range(self) -> tuple[int, str] | None:
        """How many classes the model's logits score, and that setting's name: the bound of the
        integer labels a sparse cross-entropy reads. None where the model outputs no logits."""
        return None

    def __call__(self, *args, **kwargs):
        # a training step's batch was checked by `fit` (reading it here would wait for the device each step)
        if not kwargs.get("training"):
            check_ids(self, args, kwargs)
        return super().__call__(*args, **kwargs)

    def fit(self, x=None, *args, **kwargs):
        check_data(self, "fit", x, args, kwargs)
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        check_data(self, "evaluate", x, args, kwargs)
        return super().evaluate(x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        check_not_empty(self, x, "predict")
        check_ids(self, (x,), {})
        return super().predict(x, *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        check_data(self, "train_on_batch", x, args, kwargs)
        return super().train_on_batch(x, *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        check_data(self, "test_on_batch", x, args, kwargs)
        return super().test_on_batch(x, *args, **kwargs)

    def predict_on_batch(self, x):
        check_not_empty(self, x, "predict_on_batch")
        check_ids(self, (x,), {})
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

    _image_processor = None

    @property
    def image_processor(self):
        """How images are prepared for this model (`keras_tfm.data.ImageProcessor`: the checkpoint's own,
        from its `preprocessor_config.json`), or None. A `.keras` file keeps it."""
        return self._image_processor

    @image_processor.setter
    def image_processor(self, processor) -> None:
        from keras_tfm.data.image_processing import ImageProcessor

        if processor is not None and not isinstance(processor, ImageProcessor):
            raise InputError(f"expected a keras_tfm.data.ImageProcessor or None; received a "
                             f"{type(processor).__name__}.", "image_processor", type(self).__name__)  # fmt: skip
        self._image_processor = processor

    # A checkpoint's generation settings (transformers' `generation_config.json`: `eos_token_id`, one id or
    # several, and `pad_token_id`), which `generate` uses where not told otherwise; or None.
    generation_config = None

    def save_assets(self, dir_path: str) -> None:
        """Keras' saving calls this: the tokenizer, the generation settings and the image processor go into
        the `.keras` file beside the weights."""
        if self.tokenizer is not None:
            from keras_tfm.data.tokenizers import save_tokenizer

            save_tokenizer(self.tokenizer, dir_path)
        if self.generation_config:
            with open(os.path.join(dir_path, "generation_config.json"), "w") as file:
                json.dump(self.generation_config, file)
        if self.image_processor is not None:
            self.image_processor.save(dir_path)

    def load_assets(self, dir_path: str) -> None:
        """Keras' loading calls this: a tokenizer (and settings, an image processor) saved with the model
        comes back with it."""
        if dir_path is None:  # a part of a model (a backbone) that saved nothing of its own
            return
        path = os.path.join(dir_path, "tokenizer.json")
        if os.path.isfile(path):
            from keras_tfm.data.tokenizers import load_tokenizer

            self.tokenizer = load_tokenizer(path)
        path = os.path.join(dir_path, "generation_config.json")
        if os.path.isfile(path):
            with open(path) as file:
                self.generation_config = json.load(file)
        from keras_tfm.data.image_processing import ImageProcessor

        self.image_processor = ImageProcessor.from_huggingface(dir_path)

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
            check_weights_file(self, str(filepath))
        return super().load_weights(filepath, *args, **kwargs)

    def export(self, filepath, format: str = "tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """Keras' `export`: a TensorFlow SavedModel (default), `format="litert"` (a `.tflite` file) or
        `format="onnx"`, serving `input_signature`, by default the model's own inputs of any batch
        size and length (`_export_signature`): int32 ids, or a ViT's float images. A backend that cannot
        write a format is refused by name before anything is traced (`export.formats.CANNOT`);
        LiteRT and ONNX are written from TensorFlow, SavedModels from TensorFlow or JAX (the Deploy
        guide shows each artifact run in its runtime)."""
        self._write_export(filepath, format, verbose, input_signature, (), **kwargs)

    def _write_export(self, filepath, format: str, verbose, input_signature, endpoints: tuple, **kwargs) -> None:
        """`export.formats.write` of this model, built, serving `input_signature` (None: its own) and
        `endpoints` (a SavedModel's more functions)."""
        formats.check_format(format, f"{type(self).__name__}.export")
        self._build_on_demand()
        own = input_signature is None
        shapes = self._export_shapes() if own and hasattr(self, "_export_shapes") else None
        signature = self._export_signature() if own else input_signature
        formats.write(self, filepath, format, verbose, signature, endpoints, shapes, **kwargs)

    @property
    def _default_save_signature(self):
        # TensorFlow's SavedModel writer would trace a signature of the first call's shapes in Keras'
        # float32 `input_dtype`, which the id checks refuse; `export` writes the model's own instead.
        return None

    def _export_signature(self) -> list:
        """What `export` serves when given no signature: int32 token ids of any batch and length (both
        of a translator's id inputs). Keras would infer float32 inputs, which the id checks refuse."""
        names = list(self._id_inputs())
        if names[:2] == ["source_ids", "target_ids"]:
            return [{name: keras.InputSpec(shape=(None, None), dtype="int32", name=name) for name in names[:2]}]
        return [keras.InputSpec(shape=(None, None), dtype="int32", name=names[0] if names else "token_ids")]


def _unbuilt(serialized: dict) -> keras.layers.Layer:
    """The layer of `serialized`, left for the model that holds it to build: built inside the model, its sub-layers'
    paths are those a quantized model's dtype policy map names them by."""
    return keras.saving.deserialize_keras_object({k: v for k, v in serialized.items() if k != "build_config"})


def _is_serialized_layer(value) -> bool:
    """Whether `value` is a layer or model as `keras.saving.serialize_keras_object` writes one."""
    if not isinstance(value, dict) or not {"class_name", "config", "module"} <= set(value):
        return False
    made = keras.saving.get_registered_object(value.get("registered_name") or value["class_name"])
    module = value["module"] or ""
    return (isinstance(made, type) and issubclass(made, keras.layers.Layer)) or module.startswith("keras.layers")
