"""Every public layer and model refuses a bad constructor argument when it is made, naming the argument.

The table is the rules of `keras_tfm.layers.arguments` plus the arguments checked in their own way; a
constructor argument that is in neither fails `test_every_constructor_argument_is_in_the_table`, so a
new argument joins the table. Nothing is built: constructing is cheap.
"""

import inspect
import math

import pytest

import keras_tfm
from keras_tfm import layers
from keras_tfm.layers.arguments import RULES
from keras_tfm.models.text_tasks import FlatArguments

# The smallest valid arguments of each public class.
CLASSES = {
    layers.MultiHeadAttention: dict(num_heads=2, key_dim=4),
    layers.FeedForward: dict(intermediate_dim=8),
    layers.AttentionPooling: dict(num_heads=2, intermediate_dim=8),
    layers.GatedFeedForward: dict(intermediate_dim=8),
    layers.RotaryEmbedding: dict(),
    layers.TokenEmbedding: dict(vocabulary_size=10, hidden_dim=4),
    layers.PatchEmbedding: dict(patch_size=2, hidden_dim=4),
    layers.LearnedPositionEmbedding: dict(max_length=8),
    layers.SinusoidalPositionEncoding: dict(),
    layers.SinusoidalPositionEncoding2D: dict(),
    layers.EncoderBlock: dict(num_heads=2, intermediate_dim=8),
    layers.DecoderBlock: dict(num_heads=2, intermediate_dim=8),
    layers.HeadTransform: dict(),
    layers.SequenceClassificationHead: dict(num_classes=2),
    layers.TokenClassificationHead: dict(num_classes=2),
    layers.SpanHead: dict(),
    layers.OverlappingPatchEmbedding: dict(patch_size=3, stride=2, hidden_dim=4),
    layers.MixTransformerBlock: dict(num_heads=2, intermediate_dim=8),
    layers.AllMLPDecoder: dict(hidden_dim=4, num_classes=2),
    layers.DetectionHead: dict(num_classes=2),
    layers.DPTNeck: dict(reassemble_widths=(4, 4), reassemble_factors=(2, 1), fusion_dim=4),
    layers.DepthHead: dict(),
    layers.ConvSegmentationHead: dict(num_classes=2),
    layers.MaskedImageDecoder: dict(
        grid_size=2, patch_dim=12, hidden_dim=4, num_layers=1, num_heads=2, intermediate_dim=8
    ),  # fmt: skip
    layers.MaskedLMHead: dict(vocabulary_size=10),
    keras_tfm.GPT: dict(vocabulary_size=10, max_length=8, num_layers=1, num_heads=2, hidden_dim=4),
    keras_tfm.DecoderLM: dict(
        vocabulary_size=10, max_length=8, num_layers=1, num_heads=2, hidden_dim=4, intermediate_dim=8
    ),
    keras_tfm.ViT: dict(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=4, num_classes=2),
    keras_tfm.Bert: dict(vocabulary_size=10, max_length=8, num_layers=1, num_heads=2, hidden_dim=4),
    keras_tfm.BertMLM: dict(vocabulary_size=10, max_length=8, num_layers=1, num_heads=2, hidden_dim=4),
    keras_tfm.BertClassifier: dict(vocabulary_size=10, max_length=8, num_layers=1, num_heads=2, hidden_dim=4),
    keras_tfm.ModernBert: dict(vocabulary_size=10, num_layers=1, num_heads=2, hidden_dim=4, intermediate_dim=8),
    keras_tfm.ModernBertClassifier: dict(vocabulary_size=10, num_layers=1, num_heads=2, hidden_dim=4),
    keras_tfm.CLIPTextEncoder: dict(vocabulary_size=10, max_length=8, num_layers=1, num_heads=2, hidden_dim=4),
    keras_tfm.SegFormer: dict(
        stage_widths=(4,),
        stage_depths=(1,),
        stage_heads=(1,),
        stage_reduction_ratios=(1,),
        stage_patch_sizes=(3,),
        stage_strides=(2,),
        stage_mlp_ratios=(2,),
    ),  # fmt: skip
    keras_tfm.ViTMAE: dict(
        encoder=keras_tfm.ViT(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=4, include_top=False)
    ),  # fmt: skip
    keras_tfm.YOLOS: dict(
        image_shape=(8, 8), patch_size=4, num_detection_tokens=2, num_layers=1, num_heads=2, hidden_dim=4
    ),
    keras_tfm.DPT: dict(
        backbone=keras_tfm.ViT(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=4, include_top=False),
        neck=layers.DPTNeck(reassemble_widths=(4, 4), reassemble_factors=(2, 1), fusion_dim=4, readout="ignore"),
        head=layers.DepthHead(),
        backbone_layers=(0, 1),
    ),  # fmt: skip
    keras_tfm.Translator: dict(
        source_vocabulary_size=10, num_encoder_layers=1, num_decoder_layers=1, num_heads=2, hidden_dim=4
    ),
}

# Bad values of each kind of rule (by what RULES expects).
BAD = {
    "an integer >= 1": [0, -1, 2.5, "4", True, None],
    "an integer >= 0": [-1, 1.0, "0", None],
    "a rate in [0, 1)": [1.0, -0.1, math.nan, "0.1", None],
    "a number > 0": [0.0, -1e-6, math.inf, math.nan, "1e-5", None],
    "True or False": [1, "yes", None],
    "a number >= 1": [0.5, math.nan, "2", None],
    "a fraction in (0, 1]": [0.0, 1.5, math.nan, None],
    "a fraction in (0, 1)": [0.0, 1.0, math.nan, "0.5", None],
    "a dict of RotaryEmbedding arguments": ["max_wavelength", 3],
    "a Keras activation (a name or a function), 'gelu_approximate' or 'quick_gelu'": ["no_such_activation", 3],
    "a Keras initializer (a name, a config or an instance)": ["no_such_initializer", 3],
}

# Arguments checked in their own way, each with a bad value and words its message must hold.
OTHER = {
    "positions": ("rotary", "positions"),
    "pooling": ("maximum", "pooling"),
    "transform": ({"units": 3}, "transform"),
    "scaling": ("ntk", "scaling"),
    "normalization": ("batch_norm", "normalization"),
    "sliding_window_layers": ([5], "sliding_window_layers"),
    "class_names": (["one name"], "class_names"),
    "position_interpolation": ("nearest", "position_interpolation"),
    "encoder": ("a ViT", "encoder"),
    "seed": ("seven", "seed"),
    "image_shape": ((8,), "image_shape"),
    "loss_settings": ({"eos": 0.1}, "loss_settings"),
    "reassemble_widths": ([4, 0], "reassemble_widths"),
    "reassemble_factors": ([2, 3.5], "reassemble_factors"),
    "readout": ("mean", "readout"),
    "fusion_upsampling": ("triple", "fusion_upsampling"),
    "depth_type": ("absolute", "depth_type"),
    "backbone": ("a ViT", "backbone"),
    "neck": ("a neck", "neck"),
    "head": ("a head", "head"),
    "backbone_layers": ([0, 9], "backbone_layers"),
    "head_resolution": ("half", "head_resolution"),
    **{
        name: ([4, 4], name)
        for name in (
            "stage_widths",
            "stage_depths",
            "stage_heads",
            "stage_reduction_ratios",
            "stage_patch_sizes",
            "stage_strides",
            "stage_mlp_ratios",
        )
    },  # fmt: skip
}


def _arguments(cls) -> dict:
    """The named constructor arguments of `cls` and of its bases that it passes `**kwargs` on to."""
    found = {}
    for klass in cls.__mro__:
        if klass.__module__.startswith("keras_tfm") and "__init__" in vars(klass):
            for parameter in inspect.signature(klass.__init__).parameters.values():
                if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                    found.setdefault(parameter.name, parameter.default)
    for name in ("self", "default_name", *(("encoder", "head") if issubclass(cls, FlatArguments) else ())):
        found.pop(name, None)  # a family's task model makes its encoder and head from flat arguments
    if cls in (keras_tfm.BertMLM, keras_tfm.BertClassifier):  # the encoder's, through **kwargs
        found = {**_arguments(keras_tfm.Bert), **found}
    if cls is keras_tfm.ModernBertClassifier:
        found = {**_arguments(keras_tfm.ModernBert), **found}
    return found


def _cases():
    for cls, valid in CLASSES.items():
        for name, default in _arguments(cls).items():
            if name in RULES:
                for value in BAD[RULES[name][0]]:
                    if value is None and default is None:
                        continue  # None is this argument's default
                    yield pytest.param(cls, valid, name, value, RULES[name][0], id=f"{cls.__name__}-{name}-{value!r}")
            elif name in OTHER:
                value, words = OTHER[name]
                yield pytest.param(cls, valid, name, value, words, id=f"{cls.__name__}-{name}-{value!r}")


@pytest.mark.backend_independent
@pytest.mark.parametrize("cls", CLASSES)
def test_every_constructor_argument_is_in_the_table(cls):
    valid = CLASSES[cls]
    assert cls(**valid) is not None
    unknown = [name for name in _arguments(cls) if name not in RULES and name not in OTHER]
    assert not unknown, f"{cls.__name__}: add {unknown} to keras_tfm.layers.arguments.RULES or to OTHER here"


@pytest.mark.backend_independent
@pytest.mark.parametrize("cls, valid, name, value, expected", list(_cases()))
def test_a_bad_argument_is_refused_by_name(cls, valid, name, value, expected):
    with pytest.raises(ValueError) as caught:
        cls(**{**valid, name: value})
    message = str(caught.value)
    assert name in message and expected in message and repr(value) in message, message


@pytest.mark.backend_independent
def test_an_error_speaks_each_front_ends_names_without_its_text_rewritten():
    """The command line shows the arguments a message names as flags, the server as request fields; the
    error's own message is left as the library wrote it."""
    from keras_tfm.errors import InputError
    from keras_tfm.serve.requests import _config

    error = InputError("expected `max_new_tokens` above `min_new_tokens`; `data` is fine.", "max_new_tokens")
    flags = {"max_new_tokens": "--max-new-tokens", "data": "--data"}.get
    assert error.words(flags, quoted=False) == "expected --max-new-tokens above `min_new_tokens`; --data is fine."
    assert error.words({"max_new_tokens": "max_tokens"}.get) == (
        "expected `max_tokens` above `min_new_tokens`; `data` is fine."
    )
    assert error.message.startswith("expected `max_new_tokens`")
    with pytest.raises(Exception, match=r"`max_tokens` must be an integer >= 1") as refused:
        _config(max_new_tokens=0)
    assert refused.value.param == "max_tokens" and "max_new_tokens" not in refused.value.message
