"""Moving arrays between checkpoint names and Keras layers, both ways, and the checks every converter
makes: options keras_tfm computes differently, activations by name, weights left unused."""

from __future__ import annotations

import re
from collections.abc import Callable

import keras
import numpy as np

from keras_tfm.convert import quantized_loading, variables
from keras_tfm.errors import CheckpointError, InputError

# Hugging Face's activation names (`ACT2FN`) -> Keras'; the first name of each Keras activation is the
# one written to a checkpoint.
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_approximate",
    "gelu_pytorch_tanh": "gelu_approximate",
    "relu": "relu",
    "quick_gelu": "quick_gelu",
    "swish": "silu",
    "silu": "silu",
}


def keras_activation(model_type: str, config: dict, field: str, default: str) -> str:
    """The Keras activation of the checkpoint's `config[field]` (`default` where it has none), refused by name
    where Keras has none."""
    name = config.get(field, default)
    if name not in ACTIVATIONS:
        raise CheckpointError(f"{model_type} activation {name!r} ({field}) is not supported; supported: {sorted(ACTIVATIONS)}.",
                              caller="from_huggingface")  # fmt: skip
    return ACTIVATIONS[name]


def renamer(patterns: list[tuple[str, str]]) -> Callable[[str], str]:
    """A converter's `rename`: each weight name through the `(pattern, replacement)` regular expressions in
    order (older checkpoints' names to today's)."""
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in patterns]

    def rename(name: str) -> str:
        for pattern, replacement in compiled:
            name = pattern.sub(replacement, name)
        return name

    return rename


def class_names_of(config: dict, count: int) -> list[str]:
    """The names of a classifier's `count` classes from the checkpoint's `id2label` (LABEL_i where it has none)."""
    names = config.get("id2label") or {}
    return [names.get(str(i), names.get(i, f"LABEL_{i}")) for i in range(count)]


def hugging_face_activation(model_type: str, activation: str) -> str:
    """The checkpoint's name for a Keras activation: the first name in `ACTIVATIONS` that gives it."""
    for name, keras_name in ACTIVATIONS.items():
        if keras_name == activation:
            return name
    raise InputError(
        f"{model_type} has no activation for {activation!r}; supported: {sorted(set(ACTIVATIONS.values()))}.",
        caller="save_huggingface",
    )


# the config fields that size a model's weights, named when a weight does not fit them
_SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "max_position_embeddings",
    "n_embd",
    "n_head",
    "n_positions",
    "d_model",
)


class WeightWriter:
    """Collects a model's arrays under checkpoint names (what a converter's `WeightReader` reads) and
    the checkpoint's other files."""

    def __init__(self):
        self.weights: dict[str, np.ndarray] = {}
        self.files: dict[str, dict] = {}  # other JSON files of the checkpoint, by name (a ViT's image processor)
        self.module_weights: dict[str, WeightWriter] = {}  # weights in folders of their own (sentence-transformers')

    def __setitem__(self, name: str, value) -> None:
        array = keras.ops.convert_to_numpy(value)  # a scalar stays one (NumPy's contiguous copy is at least 1-D)
        self.weights[name] = np.ascontiguousarray(array, dtype="float32").reshape(np.shape(array))

    def linear(self, name: str, *dense_layers, transpose: bool = True) -> None:
        """Writes `dense_layers` as the linear module `name`, joined along the outputs where there
        are several (`WeightReader.linear`'s inverse). LoRA pairs are merged: `Dense.kernel` adds them."""
        kernel = np.concatenate([keras.ops.convert_to_numpy(dense.kernel) for dense in dense_layers], axis=1)
        self[name + ".weight"] = kernel.T if transpose else kernel
        if dense_layers[0].use_bias:
            self[name + ".bias"] = np.concatenate([keras.ops.convert_to_numpy(dense.bias) for dense in dense_layers])

    def layer_norm(self, name: str, norm) -> None:
        self[name + ".weight"], self[name + ".bias"] = norm.gamma, norm.beta

    def rms_norm(self, name: str, norm) -> None:
        self[name + ".weight"] = norm.scale


class WeightReader:
    """Hands out checkpoint arrays by name, so a converter can check at the end that it used them all.
    `linear` and `layer_norm` are also `WeightWriter`'s: code that names a model's modules serves both ways."""

    def __init__(self, weights: dict, prefixes: tuple[str, ...] = (), config=None, allow_nan: bool = False):
        self.weights = weights
        self.prefixes = prefixes
        self.config = config  # the checkpoint's `CheckpointConfig`, named in errors
        self.allow_nan = allow_nan
        self.used: set[str] = set()
        self.linear_layers: dict[str, list] = {}  # checkpoint module name -> the Dense layers made from it
        self.lora_pairs: dict[str, tuple] = {}  # module name -> its (lora_A, lora_B) from a peft adapter
        self.quantized_layers: set[int] = set()  # ids of the quantized layers it set

    def __call__(self, name: str) -> np.ndarray:
        for prefix in ("",) + self.prefixes:
            if prefix + name in self.weights:
                self.used.add(prefix + name)
                array = np.asarray(self.weights[prefix + name])
                if array.dtype.name not in ("float32", "bfloat16", "float16"):  # kept until a variable takes it
                    array = array.astype("float32")
                if not self.allow_nan and not all_finite(array):
                    bad = int(np.size(array) - np.isfinite(array).sum())
                    raise CheckpointError(
                        f"the checkpoint's weight {prefix + name!r} holds {bad:,} NaN or infinite "
                        f"values of {array.size:,}: the file is damaged, or was saved from a diverged run. Give "
                        "`allow_nan=True` to load it anyway.",
                        "allow_nan",
                        caller="from_huggingface",
                    )
                return array
        raise CheckpointError(
            f"the checkpoint has no weight {name!r} (prefixes tried: {self.prefixes}), which {self._where()} needs.",
            caller="from_huggingface",
        )

    def _where(self) -> str:
        return getattr(self.config, "where", "its configuration")

    def check_shape(self, name: str, stored: tuple, needed: tuple, transposed: bool = False) -> None:
        """Refuses a weight whose shape is not the one the config's sizes give, naming them."""
        if tuple(stored) == tuple(needed):
            return
        if transposed and len(needed) == 2:
            stored, needed = tuple(stored)[::-1], tuple(needed)[::-1]
        name = next((prefix + name for prefix in self.prefixes if prefix + name in self.weights), name)
        sizes = ", ".join(
            f"{key}={self.config[key]}"
            for key in _SIZE_FIELDS
            if self.config is not None and isinstance(self.config.get(key), int)
        )
        raise CheckpointError(
            f"the checkpoint's weight {name!r} has shape {tuple(stored)}, where the model that "
            f"{self._where()} describes ({sizes}) needs {tuple(needed)}: the config's sizes do not match the weights.",
            caller="from_huggingface",
        )

    def set_variable(self, variable, name: str) -> None:
        """Sets one variable (a learned token, a scale) to the checkpoint's array `name`, of its shape."""
        array = self(name)
        self.check_shape(name, np.shape(array), tuple(variable.shape))
        variable.assign(array)

    def set(self, layer, *names: str) -> None:
        """Sets `layer`'s weights to the checkpoint's arrays `names`, in the order of `layer.weights`."""
        self.assign(layer, [self(name) for name in names], names)

    def assign(self, layer, arrays: list, names, transposed: bool = False) -> None:
        """`layer.set_weights(arrays)` once each array has its variable's shape (`transposed`: the
        checkpoint stores the first array (out, in))."""
        if layer.quantization_mode:  # built quantized (`quantize=` while loading): the float layer's shapes
            self.quantized_layers.add(id(layer))
            quantized_loading.assign_quantized(layer, arrays, self._shape_check(names, transposed))
            return
        for variable, array, name in zip(layer.weights, arrays, names):
            self.check_shape(name, np.shape(array), tuple(variable.shape), transposed)
        if len(arrays) != len(layer.weights):
            raise CheckpointError(
                f"{layer.name} has {len(layer.weights)} weights; the checkpoint gives {len(arrays)} ({names}).",
                caller="from_huggingface",
            )
        for variable, array in zip(layer.weights, arrays):
            variables.assign(variable, array)

    def _shape_check(self, names, transposed: bool):
        """`check(index, array, needed shape)` refusing the checkpoint's array `names[index]` of another shape."""
        return lambda index, array, needed: self.check_shape(names[index], np.shape(array), needed, transposed)

    def __contains__(self, name: str) -> bool:
        return any(prefix + name in self.weights for prefix in ("",) + self.prefixes)

    def linear(self, name: str, *dense_layers, transpose: bool = True) -> None:
        """Sets `dense_layers` from the checkpoint's linear module `name` (`name.weight`, and
        `name.bias` where it has one), split evenly along its outputs where it feeds several (GPT-2's
        fused query/key/value). `transpose`: PyTorch `Linear` weights are (out, in), Keras kernels
        (in, out); GPT-2's `Conv1D` is stored (in, out) already. Records where the module went,
        and takes its LoRA pair where the weights include a peft adapter's."""
        kernel = self(name + ".weight")
        kernel = kernel.T if transpose else kernel
        bias = self(name + ".bias") if name + ".bias" in self else None
        splits = len(dense_layers)
        needed = (dense_layers[0].kernel.shape[0], sum(dense.kernel.shape[1] for dense in dense_layers))
        names = (name + ".weight", name + ".bias")
        self.check_shape(names[0], kernel.shape, needed, transposed=transpose)
        if bias is not None:
            self.check_shape(names[1], bias.shape, needed[1:])
        for dense, part, part_bias in zip(
            dense_layers,
            np.split(kernel, splits, axis=1),
            np.split(bias, splits) if bias is not None else [None] * splits,
        ):
            self.assign(dense, [part] if part_bias is None else [part, part_bias], names, transposed=transpose)
        self.linear_layers[name] = list(dense_layers)
        if name + ".lora_A.weight" in self:
            self.lora_pairs[name] = (self(name + ".lora_A.weight"), self(name + ".lora_B.weight"))

    def layer_norm(self, name: str, norm) -> None:
        self.set(norm, name + ".weight", name + ".bias")

    def rms_norm(self, name: str, norm) -> None:
        self.set(norm, name + ".weight")

    def unused(self, ignore: Callable[[str], bool] = lambda name: False) -> list[str]:
        return sorted(k for k in self.weights if k not in self.used and not ignore(k))

    def check_all_used(self, caller: str, model_type: str, ignore: Callable[[str], bool] = lambda name: False) -> None:
        """Refuses a checkpoint with weights the converter did not take (but those `ignore` names):
        a model made without them would compute something else."""
        leftover = self.unused(ignore)
        if leftover:
            raise InputError(f"{model_type} weights not converted: {leftover[:5]}", caller=caller)


def all_finite(array: np.ndarray, chunk: int = 1 << 22) -> bool:
    """`np.isfinite(array).all()` a slice at a time: no boolean copy of a large tensor."""
    flat = array.reshape(-1) if array.flags.c_contiguous else np.ravel(array)
    return all(np.isfinite(flat[i : i + chunk]).all() for i in range(0, flat.size, chunk))


def require_options(model_type: str, config: dict, caller: str = "from_huggingface", **computed) -> None:
    """Refuses a checkpoint whose config sets an option that changes the computation to another
    value than the one keras_tfm computes (`computed`: field -> that value, the default of
    transformers or keras-hub); loading it anyway would give other outputs without a word."""
    for field, value in computed.items():
        received = config.get(field, value)
        if received != value:
            raise InputError(
                f"{model_type} checkpoints with {field}={received!r} are not supported; "
                f"keras_tfm computes what {field}={value!r} gives.",
                caller=caller,
            )


def no_classifier(model_type: str, num_classes: int | None) -> None:
    """Refuses `num_classes` for a checkpoint that is not turned into a classifier."""
    if num_classes is not None:
        raise CheckpointError(
            f"num_classes applies to ViT and BERT checkpoints; this is a {model_type} "
            f"checkpoint (received num_classes={num_classes}).",
            caller="from_huggingface",
        )


def set_dense(dense, kernel: np.ndarray, bias: np.ndarray | None = None) -> None:
    dense.set_weights([kernel] if bias is None else [kernel, bias])


def set_layer_norm(norm, gamma: np.ndarray, beta: np.ndarray) -> None:
    norm.set_weights([gamma, beta])
