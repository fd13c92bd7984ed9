"""keras_tfm ViT vs Hugging Face ViT built from small random configurations (no network)."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
CONFIG = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    image_size=16,
    patch_size=4,
    num_labels=5,
)


def hf_vit(head=True, **config):
    torch.manual_seed(0)
    config = transformers.ViTConfig(**{**CONFIG, **config})
    model = transformers.ViTForImageClassification(config) if head else transformers.ViTModel(config)
    return model.eval()


def run_hf(hf, images, **kwargs):
    with torch.no_grad():
        out = hf(torch.tensor(images).permute(0, 3, 1, 2), **kwargs)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


def test_logits_and_parameter_count_match(rng):
    hf = hf_vit()
    model = keras_tfm.from_huggingface(hf)
    images = rng.random((2, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(images)), run_hf(hf, images), atol=1e-4, rtol=0)
    assert model.count_params() == sum(p.numel() for p in hf.parameters())


def test_interpolated_positions_match_hugging_face(rng):
    hf = hf_vit()
    model = keras_tfm.from_huggingface(hf)
    images = rng.random((2, 24, 32, 3)).astype("float32")
    expected = run_hf(hf, images, interpolate_pos_encoding=True)
    np.testing.assert_allclose(to_numpy(model(images)), expected, atol=1e-4, rtol=0)


def test_vit_model_gives_features(rng):
    hf = hf_vit(head=False)
    model = keras_tfm.from_huggingface(hf)
    assert not model.include_top
    images = rng.random((1, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(images)), run_hf(hf, images), atol=1e-4, rtol=0)


def test_checkpoint_with_pre_v5_weight_names(rng, tmp_path):
    """Checkpoints saved before transformers 5 name the layers encoder.layer.N.attention.attention.query..."""
    from safetensors.numpy import save_file

    hf = hf_vit()
    renames = [
        ("vit.layers.", "vit.encoder.layer."),
        (".attention.q_proj.", ".attention.attention.query."),
        (".attention.k_proj.", ".attention.attention.key."),
        (".attention.v_proj.", ".attention.attention.value."),
        (".attention.o_proj.", ".attention.output.dense."),
        (".mlp.fc1.", ".intermediate.dense."),
        (".mlp.fc2.", ".output.dense."),
    ]
    old = {}
    for name, value in hf.state_dict().items():
        for new, previous in renames:
            name = name.replace(new, previous)
        old[name] = value.numpy()
    assert "vit.encoder.layer.0.attention.attention.query.weight" in old
    save_file(old, str(tmp_path / "model.safetensors"))
    hf.config.to_json_file(str(tmp_path / "config.json"))
    model = keras_tfm.from_huggingface(str(tmp_path))
    images = rng.random((1, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(images)), run_hf(hf, images), atol=1e-4, rtol=0)


@pytest.mark.parametrize("head", [True, False])
def test_num_classes_gives_a_new_head_on_the_checkpoints_encoder(rng, head):
    """Fine-tuning: the checkpoint's encoder, a fresh head of `num_classes` (ViTForImageClassification's own
    head is replaced; ViTModel gets one)."""
    hf = hf_vit(head=head)
    model = keras_tfm.from_huggingface(hf, num_classes=3)
    assert model.include_top and model.num_classes == 3
    images = rng.random((2, 16, 16, 3)).astype("float32")
    hf_encoder = hf.vit if head else hf
    class_token = run_hf(hf_encoder, images)[:, 0]  # after the final LayerNorm, what the head reads
    kernel, bias = (to_numpy(w) for w in model.head.weights)
    np.testing.assert_allclose(to_numpy(model(images)), class_token @ kernel + bias, atol=1e-4, rtol=0)
    assert np.abs(kernel).max() > 0  # initialised, not left at zero
    with torch.device("meta"):
        hf_three = transformers.ViTForImageClassification(transformers.ViTConfig(**{**CONFIG, "num_labels": 3}))
    assert model.count_params() == sum(p.numel() for p in hf_three.parameters())


def test_dropout_rates_come_from_the_config(rng):
    hf = hf_vit(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.1)
    model = keras_tfm.from_huggingface(hf)
    assert (model.dropout, model.attention_dropout) == (0.2, 0.1)  # were 0.0 whatever the checkpoint said
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(images)), run_hf(hf, images), atol=1e-4, rtol=0)
    assert not np.allclose(to_numpy(model(images, training=True)), to_numpy(model(images)), atol=1e-5)


def test_checkpoints_it_cannot_compute_are_refused_by_name():
    with pytest.raises(ValueError, match="ViT checkpoints with qkv_bias=False are not supported"):
        keras_tfm.from_huggingface(hf_vit(qkv_bias=False))  # was a KeyError naming one missing bias
    with pytest.raises(ValueError, match=r"ViT checkpoints with a non-square image_size=\[16, 12\] are not supported"):
        keras_tfm.from_huggingface(hf_vit(image_size=[16, 12]))


def test_num_classes_is_refused_where_it_means_nothing():
    with pytest.raises(ValueError, match="num_classes applies to ViT and BERT checkpoints; this is a GPT-2"):
        keras_tfm.from_huggingface(
            transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2)), num_classes=2
        )
    for wrong in (0, 2.5, True):
        with pytest.raises(ValueError, match=f"num_classes must be a positive integer or None; received {wrong!r}"):
            keras_tfm.from_huggingface(hf_vit(), num_classes=wrong)


@pytest.mark.parametrize("processor_class, crop", [("ViTImageProcessor", None), ("DeiTImageProcessor", 16)])
def test_image_preprocessing_gives_the_image_processors_pixels(rng, tmp_path, processor_class, crop):
    # DeiT's processor resizes to `size` and then crops the center `crop_size`.
    side = 20 if crop else 16
    options = dict(crop_size={"height": crop, "width": crop}) if crop else {}
    processor = getattr(transformers, processor_class)(
        size={"height": side, "width": side}, image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.25, 0.3], **options
    )
    processor.save_pretrained(str(tmp_path))
    resized_to, layers = keras_tfm.convert.image_preprocessing(str(tmp_path))
    assert resized_to == side
    images = rng.integers(0, 256, (2, side, side, 3)).astype("uint8")  # already `side`: no resampling differences
    expected = processor(list(images), return_tensors="np")["pixel_values"].transpose(0, 2, 3, 1)
    ours = images.astype("float32")
    for layer in layers:
        ours = layer(ours)
    assert expected.shape == (2, crop or side, crop or side, 3)
    np.testing.assert_allclose(to_numpy(ours), expected, atol=1e-5, rtol=0)
    if crop:
        (tmp_path / "preprocessor_config.json").write_text(
            '{"do_center_crop": true, "size": {"height": 20, "width": 20}, "crop_size": {"height": 24, "width": 24}}'
        )
        with pytest.raises(ValueError, match="'crop_size' 24 is larger than the resized images \\('size' 20\\)"):
            keras_tfm.convert.image_preprocessing(str(tmp_path))
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="preprocessor_config.json' is not valid JSON"):
        keras_tfm.convert.image_preprocessing(str(tmp_path))


def test_a_loaded_classifier_classifies_files_as_the_pipeline_and_keeps_its_processor(tmp_path):
    """A checkpoint with its processor (bicubic, resized from photos of odd sizes) and class names: `classify`
    gives the image-classification pipeline's labels and scores; `embed_images` the class token;
    `.keras` files and `save_huggingface` keep the processor and the names."""
    import matplotlib
    from PIL import Image

    labels = {0: "tabby", 1: "tiger", 2: "lynx", 3: "ocelot", 4: "puma"}
    hf = hf_vit(id2label=labels, label2id={v: k for k, v in labels.items()})
    hf.save_pretrained(tmp_path / "checkpoint")
    processor = transformers.ViTImageProcessor(size={"height": 16, "width": 16}, resample=3, do_convert_rgb=True)
    processor.save_pretrained(tmp_path / "checkpoint")
    photo = Image.open(f"{matplotlib.get_data_path()}/sample_data/grace_hopper.jpg")
    photos = [photo, photo.crop((10, 30, 210, 90)), str(tmp_path / "drawing.png")]
    Image.open(f"{matplotlib.get_data_path()}/sample_data/logo2.png").save(photos[2])
    model = keras_tfm.from_huggingface(str(tmp_path / "checkpoint"))
    assert model.class_names == list(labels.values()) and model.image_processor.resample == 3
    pipeline = transformers.pipeline("image-classification", model=str(tmp_path / "checkpoint"), device="cpu")
    for answer, image in zip(model.classify(photos, top_k=3), photos):
        expected = pipeline(image, top_k=3)  # a file: read as load_image reads it, orientation and all
        assert [a["label"] for a in answer] == [e["label"] for e in expected]
        np.testing.assert_allclose([a["score"] for a in answer], [e["score"] for e in expected], atol=1e-5)
    assert model.classify(photo, top_k=1)[0]["label"] == model.classify(photos)[0][0]["label"]  # one image
    pixels = processor(photo, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        class_token = hf.vit(pixels).last_hidden_state[0, 0].numpy()
    np.testing.assert_allclose(model.embed_images(photo), class_token, atol=1e-4)
    assert model.embed_images(photos, pooling="patches").shape == (3, 16, 32)
    model.save(tmp_path / "vit.keras")
    loaded = keras_tfm.load_model(tmp_path / "vit.keras")
    assert loaded.image_processor == model.image_processor and loaded.class_names == model.class_names
    keras_tfm.save_huggingface(loaded, tmp_path / "again")
    assert transformers.AutoImageProcessor.from_pretrained(tmp_path / "again").resample == 3
    assert transformers.AutoConfig.from_pretrained(tmp_path / "again").id2label == labels
    bare = keras_tfm.from_huggingface(hf)  # in memory: no processor to read files with
    with pytest.raises(ValueError, match="images: ViT: this model has no image processor"):
        bare.classify(photo)
    with pytest.raises(ValueError, match=r"top_k: classify: expected an integer in \[1, 5\]"):
        model.classify(photo, top_k=6)
