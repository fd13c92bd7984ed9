"""keras_tfm models written as Hugging Face checkpoints (`save_huggingface`), loaded by transformers (no network)."""

import json

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.convert.huggingface import save_huggingface
from keras_tfm.errors import InputError
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
# The writer reads the weights through NumPy, the same on every backend; TensorFlow and PyTorch run these
# (on JAX every eager model call compiles its operations one by one: four times their time here).
pytestmark = pytest.mark.skipif(keras.backend.backend() == "jax", reason="the writer's backends: TensorFlow, PyTorch")
transformers = pytest.importorskip("transformers")

MODELS = {
    "gpt": lambda: keras_tfm.GPT(vocabulary_size=50, max_length=20, num_layers=2, num_heads=2, hidden_dim=16),
    "gpt-untied-relu": lambda: keras_tfm.GPT(
        vocabulary_size=50,
        max_length=20,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=24,
        tie_embeddings=False,
        activation="relu",
    ),
    "bert_mlm": lambda: keras_tfm.bert_tiny(vocabulary_size=30, max_length=16, num_layers=2),
    "bert_classifier": lambda: keras_tfm.bert_tiny(
        head="classifier", num_classes=3, vocabulary_size=30, max_length=16, num_layers=1, num_segments=3
    ),
    "bert": lambda: keras_tfm.bert_tiny(head=None, vocabulary_size=30, max_length=16, num_layers=1),
    "vit": lambda: keras_tfm.ViT(
        image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, num_classes=3, num_channels=2
    ),
    "vit-features": lambda: keras_tfm.ViT(
        image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, include_top=False
    ),
    "translator": lambda: keras_tfm.transformer_small(
        source_vocabulary_size=30,
        target_vocabulary_size=20,
        num_encoder_layers=2,
        num_decoder_layers=1,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
        use_output_bias=True,
        tie_embeddings=False,
        activation="gelu",
    ),
    "translator-shared": lambda: keras_tfm.transformer_small(
        source_vocabulary_size=30,
        share_embeddings=True,
        scale_embeddings=False,
        num_encoder_layers=1,
        num_decoder_layers=1,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
    ),
}


def inputs(name, model, rng):
    """(our inputs, transformers' keyword arguments): the same random inputs, token id 0 (padding) left out."""
    if name.startswith("vit"):
        images = rng.random((2, 16, 16, model.num_channels)).astype("float32")
        return images, dict(pixel_values=torch.tensor(images.transpose(0, 3, 1, 2)))
    if name.startswith("translator"):
        source, target = rng.integers(3, 20, (2, 7)), rng.integers(3, 20, (2, 5))
        return (
            {"source_ids": source, "target_ids": target},
            dict(input_ids=torch.tensor(source), decoder_input_ids=torch.tensor(target)),
        )
    ids = rng.integers(1, 30, (2, 9))
    if name.startswith("bert"):
        segments = rng.integers(0, (model if name == "bert" else model.encoder).num_segments, (2, 9))
        return {"token_ids": ids, "segment_ids": segments}, dict(
            input_ids=torch.tensor(ids), token_type_ids=torch.tensor(segments)
        )
    return ids, dict(input_ids=torch.tensor(ids))


def hf_output(hf, arguments):
    with torch.no_grad():
        output = hf(**arguments)
    return (output.logits if hasattr(output, "logits") else output.last_hidden_state).numpy()


@pytest.mark.parametrize("name", MODELS)
def test_transformers_loads_every_weight_and_computes_the_same_outputs(tmp_path, rng, name):
    model = MODELS[name]()
    model.build()
    for variable in model.weights:  # LayerNorm scales and biases too: none left at 1 or 0
        variable.assign(rng.normal(0.0, 0.3, variable.shape).astype("float32"))
    save_huggingface(model, tmp_path)

    config = json.loads((tmp_path / "config.json").read_text())
    hf_class = getattr(transformers, config["architectures"][0])
    hf, loading = hf_class.from_pretrained(tmp_path, output_loading_info=True)
    hf.eval()
    assert not loading["unexpected_keys"]
    missing = sorted(loading["missing_keys"])
    # keras_tfm.Bert and a ViT without its top return token vectors; BertModel and ViTModel add a
    # pooler, newly initialised
    pooled = name in ("bert", "vit-features")
    assert missing == (["pooler.dense.bias", "pooler.dense.weight"] if pooled else [])
    # Marian keeps its sinusoids as (frozen) parameters, and its logits bias as a buffer
    positions = sum(p.numel() for key, p in hf.named_parameters() if "embed_positions" in key)
    output_bias = model.target_vocabulary_size if name == "translator" else 0
    assert model.count_params() - output_bias == sum(p.numel() for p in hf.parameters()) - positions - (
        model.hidden_dim * (model.hidden_dim + 1) if pooled else 0
    )
    ours, theirs = inputs(name, model, rng)
    expected = to_numpy(model(ours))
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(hf_output(hf, theirs), expected, atol=1e-4, rtol=0)

    back = keras_tfm.from_huggingface(str(tmp_path))
    assert type(back) is type(model)
    np.testing.assert_allclose(to_numpy(back(ours)), expected, atol=1e-6, rtol=0)


def test_a_lora_model_is_written_with_its_pairs_merged(tmp_path, rng):
    model = MODELS["gpt"]()
    model.enable_lora(rank=2)
    for layer in keras_tfm.models.lora.lora_layers(model).values():
        layer.lora_kernel_b.assign(rng.normal(0.0, 0.5, layer.lora_kernel_b.shape).astype("float32"))
    save_huggingface(model, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ours, theirs = inputs("gpt", model, rng)
    np.testing.assert_allclose(hf_output(hf, theirs), to_numpy(model(ours)), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: keras_tfm.transformer_small(
                source_vocabulary_size=30,
                num_encoder_layers=1,
                num_decoder_layers=1,
                hidden_dim=16,
                num_heads=2,
                norm_first=True,
            ),
            "Marian is the post-norm Transformer .* received norm_first=True",
        ),
        (
            lambda: keras_tfm.ViT(
                image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, pooling="mean"
            ),
            "Hugging Face ViTs have learned positions and classify from the class token; received "
            "positions='learned', pooling='mean'",
        ),
        (
            lambda: keras_tfm.bert_tiny(vocabulary_size=30, num_layers=1, head_activation="relu"),
            "BertForMaskedLM's head has activation='gelu'; received activation='relu'",
        ),
        (
            lambda: keras_tfm.GPT(
                vocabulary_size=30, max_length=8, num_layers=1, num_heads=2, hidden_dim=8, activation="tanh"
            ),
            "GPT-2 has no activation for 'tanh'",
        ),
    ],
)
def test_what_transformers_cannot_compute_is_refused_by_name(tmp_path, make, message):
    with pytest.raises(ValueError, match=f"save_huggingface: {message}"):
        save_huggingface(make(), tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


def test_a_second_save_with_overwrite_replaces_the_first(tmp_path, rng):
    model = MODELS["gpt"]()
    save_huggingface(model, tmp_path)  # a second save (a resumed recipe run) replaces the first
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.3, variable.shape).astype("float32"))
    save_huggingface(model, tmp_path, overwrite=True)
    ours, theirs = inputs("gpt", model, rng)
    np.testing.assert_allclose(
        hf_output(transformers.GPT2LMHeadModel.from_pretrained(tmp_path), theirs),
        to_numpy(model(ours)),
        atol=1e-4,
        rtol=0,
    )
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(InputError, match="pytorch_model.bin' is a file; expected a directory"):
        save_huggingface(model, tmp_path / "pytorch_model.bin")


def test_a_directory_holding_a_checkpoint_is_replaced_only_with_overwrite(tmp_path, monkeypatch):
    """Another checkpoint's tokenizer left beside new weights would pair a 50-id model with its ids."""
    from keras_tfm.data import CharacterTokenizer

    big = MODELS["gpt"]()
    big.tokenizer = CharacterTokenizer.fit("".join(chr(33 + i) for i in range(50)))
    save_huggingface(big, tmp_path / "out")
    small = keras_tfm.GPT(vocabulary_size=20, max_length=20, num_layers=1, num_heads=2, hidden_dim=16)
    before = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert "tokenizer.json" in before
    with pytest.raises(InputError, match=r"already holds files \(config.json, .*Give `overwrite=True`") as info:
        save_huggingface(small, tmp_path / "out")
    assert info.value.argument == "directory"
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == before  # untouched
    (tmp_path / "out" / "pytorch_model.bin").write_bytes(b"")  # weights transformers would read first
    save_huggingface(small, tmp_path / "out", overwrite=True)
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]
    assert transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").config.vocab_size == 20
    assert [path.name for path in tmp_path.iterdir()] == ["out"]  # nothing staged is left beside it
    # what is not a checkpoint's is never deleted: a project folder given as "." stays as it was
    (tmp_path / "out" / "notes.txt").write_text("mine")
    (tmp_path / "out" / "data").mkdir()
    monkeypatch.chdir(tmp_path / "out")
    with pytest.raises(InputError, match=r"holds what is not a checkpoint's \(data, notes.txt\)"):
        save_huggingface(big, ".", overwrite=True)
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [
        "config.json",
        "data",
        "model.safetensors",
        "notes.txt",
    ]
    (tmp_path / "out" / "notes.txt").unlink()
    (tmp_path / "out" / "data").rmdir()
    save_huggingface(big, ".", overwrite=True)
    assert transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").config.vocab_size == 50
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


def test_class_names_become_id2label(tmp_path):
    save_huggingface(MODELS["bert_classifier"](), tmp_path, labels=["neg", "neutral", "pos"])
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert config.id2label == {0: "neg", 1: "neutral", 2: "pos"} and config.label2id["pos"] == 2
    with pytest.raises(ValueError, match="save_huggingface: labels: expected 3 class names; received 2"):
        save_huggingface(MODELS["vit"](), tmp_path / "vit", labels=["cat", "dog"])
    with pytest.raises(ValueError, match="labels: expected no labels: not a classifier; received 2"):
        save_huggingface(MODELS["gpt"](), tmp_path / "gpt", labels=["cat", "dog"])


def test_quantized_models_and_other_models_are_refused(tmp_path):
    model = MODELS["gpt"]()
    model.quantize("int8")  # unbuilt: it builds first, as for Keras' other methods that read weights
    with pytest.raises(ValueError, match="save_huggingface: 'gpt' is quantized \\(int8\\)"):
        save_huggingface(model, tmp_path)
    with pytest.raises(InputError, match="save_huggingface: expected a keras_tfm model .*; received a Sequential"):
        save_huggingface(keras.Sequential([keras.layers.Dense(2)]), tmp_path)


def _normalization(mean, std):
    return keras.layers.Normalization(mean=mean, variance=np.square(std))


# (model, resized side, layers after resizing) as the ViT recipe trains them: the model sees images
# at `image_size`, or at the crop's or the resized side (fine-tuned at another size)
IMAGE_PREPROCESSING = {
    "grayscale": (dict(image_size=12, num_channels=1), 12, lambda: [keras.layers.Rescaling(1 / 255)]),
    "offset-and-normalization": (
        dict(image_size=12),
        12,
        lambda: [keras.layers.Rescaling(1 / 127.5, offset=-1.0), _normalization([0.1, -0.2, 0.3], [0.5, 0.8, 1.5])],
    ),
    "center-crop": (
        dict(image_size=12),
        16,
        lambda: [
            keras.layers.CenterCrop(12, 12),
            keras.layers.Rescaling(1 / 255),
            _normalization([0.4, 0.5, 0.6], [0.2, 0.25, 0.3]),
        ],
    ),
    "fine-tuned-at-another-size": (
        dict(image_size=8),
        16,
        lambda: [keras.layers.Rescaling(1 / 255), _normalization([0.5], [0.5])],
    ),
}


@pytest.mark.parametrize("case", IMAGE_PREPROCESSING)
def test_a_vits_image_preprocessing_becomes_its_image_processor(tmp_path, rng, case):
    """transformers' processor and model on raw pixels give the logits of our preprocessing and model,
    without `interpolate_pos_encoding` for a model used at another size than its position table's."""
    options, side, make_layers = IMAGE_PREPROCESSING[case]
    model = keras_tfm.ViT(patch_size=4, num_layers=1, num_heads=2, hidden_dim=16, num_classes=3, **options)
    model.build()
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.3, variable.shape).astype("float32"))
    save_huggingface(model, tmp_path, image_preprocessing=(side, make_layers()), labels=["a", "b", "c"])

    images = rng.integers(0, 256, (3, side, side, model.num_channels)).astype("uint8")  # no resampling needed
    ours = images.astype("float32")
    for layer in make_layers():
        ours = layer(ours)
    expected = to_numpy(model(ours))
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    hf = transformers.AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    pixels = processor(list(images), return_tensors="pt")["pixel_values"]
    np.testing.assert_allclose(pixels.numpy().transpose(0, 2, 3, 1), to_numpy(ours), atol=1e-5, rtol=0)
    assert hf.config.image_size == ours.shape[1] and hf.config.id2label[2] == "c"
    np.testing.assert_allclose(hf_output(hf, dict(pixel_values=pixels)), expected, atol=1e-4, rtol=0)

    resized_to, layers = keras_tfm.convert.image_preprocessing(str(tmp_path))  # and back
    back = images.astype("float32")
    for layer in layers:
        back = layer(back)
    assert resized_to == side
    np.testing.assert_allclose(to_numpy(back), to_numpy(ours), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "model, side, layers, message",
    [
        (MODELS["gpt"], 16, lambda: [], "image_preprocessing is for ViT models; received a GPT"),
        (
            MODELS["vit"],
            16,
            lambda: [keras.layers.Resizing(8, 8)],
            "image_preprocessing: expected a CenterCrop, a Rescaling and a Normalization, each at most once and in that order; received \\['Resizing'\\]",
        ),
        (
            MODELS["vit"],
            16,
            lambda: [_normalization([0.5], [0.5]), keras.layers.Rescaling(1 / 255)],
            "image_preprocessing: expected .* in that order",
        ),
        (
            MODELS["vit"],
            16,
            lambda: [_normalization([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])],
            "image_preprocessing: the mean has 3 values; the model takes 2-channel images",
        ),
        (
            MODELS["vit"],
            16,
            lambda: [keras.layers.CenterCrop(8, 12)],
            "image_preprocessing: the center crop must be square and at most 16 pixels; received 8x12",
        ),
        (
            MODELS["vit"],
            18,
            lambda: [],
            "image_preprocessing gives the model 18x18 images, which its 4-pixel patches do not divide",
        ),
    ],
)
def test_image_preprocessing_transformers_cannot_do_is_refused(tmp_path, model, side, layers, message):
    with pytest.raises(ValueError, match=f"save_huggingface: {message}"):
        save_huggingface(model(), tmp_path, image_preprocessing=(side, layers()))
    assert not (tmp_path / "model.safetensors").exists()
