"""SigLIP (`SiglipModel`) and its image tower (`SiglipVisionModel`) from and to transformers, built from small
random configurations offline: the ViT without a class token, pooled by attention; the bidirectional text tower
pooled at its last place; the learned scale and bias."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VISION = dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2, image_size=16,
              patch_size=8)  # fmt: skip
TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, vocab_size=60,
            max_position_embeddings=6, pad_token_id=1, eos_token_id=1, bos_token_id=2)  # fmt: skip
# three texts filled to the tower's 6 places with the pad id 1, the end id (SigLIP's tokenizer pads so)
TEXTS = np.array([[5, 7, 1, 1, 1, 1], [9, 10, 11, 12, 13, 1], [3, 1, 1, 1, 1, 1]])
OUTPUTS = ("logits_per_image", "logits_per_text", "image_embeds", "text_embeds")


def randomized(hf):
    """`hf` with noise on every parameter: transformers starts the scale, the bias and the pooling's query, key
    and value biases at 0, which would not tell them apart."""
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return hf.eval()


def hf_siglip():
    torch.manual_seed(0)
    config = transformers.SiglipConfig(text_config={**TEXT, "projection_size": 24}, vision_config=VISION)
    return randomized(transformers.SiglipModel(config))


REAL = np.arange(6)[None] <= (TEXTS == 1).argmax(1)[:, None]  # the texts' tokens and their end


def run_hf(hf, images, mask=None) -> dict:
    with torch.no_grad():
        out = hf(pixel_values=torch.tensor(images).permute(0, 3, 1, 2), input_ids=torch.tensor(TEXTS),
                 attention_mask=None if mask is None else torch.tensor(mask.astype("int64")))  # fmt: skip
    return {name: getattr(out, name).numpy() for name in OUTPUTS}


def test_siglip_gives_transformers_outputs_and_round_trips(rng, tmp_path):
    hf = hf_siglip()
    model = keras_tfm.from_huggingface(hf)
    assert isinstance(model, keras_tfm.SigLIP) and model.count_params() == sum(p.numel() for p in hf.parameters())
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    expected = run_hf(hf, images)
    ours = model({"images": images, "token_ids": TEXTS})
    for name in OUTPUTS:
        np.testing.assert_allclose(to_numpy(ours[name]), expected[name], atol=1e-4, rtol=0, err_msg=name)
    masked = to_numpy(model({"images": images, "token_ids": TEXTS, "padding_mask": REAL})["logits_per_text"])
    np.testing.assert_allclose(masked, run_hf(hf, images, REAL)["logits_per_text"], atol=1e-4, rtol=0)
    assert np.abs(masked - expected["logits_per_text"]).max() > 1e-3  # the padding is read, or not
    keras_tfm.save_huggingface(model, str(tmp_path / "hf"))
    reloaded = transformers.SiglipModel.from_pretrained(tmp_path / "hf").eval()
    for name, value in run_hf(reloaded, images).items():
        np.testing.assert_allclose(value, expected[name], atol=1e-5, rtol=0, err_msg=name)


def test_the_image_tower_gives_transformers_outputs_at_any_image_size_with_or_without_its_head(rng, tmp_path):
    for use_head in (True, False):
        torch.manual_seed(0)
        hf = randomized(
            transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**VISION, vision_use_head=use_head))
        )
        model = keras_tfm.from_huggingface(hf)
        assert (model.use_class_token, model.pooling) == (False, "attention" if use_head else "mean")
        assert model.count_params() == sum(p.numel() for p in hf.parameters())
        for height, width in ((16, 16), (24, 16)):  # the trained size, and another (positions resized bicubically)
            images = rng.normal(size=(2, height, width, 3)).astype("float32")
            with torch.no_grad():
                out = hf(torch.tensor(images).permute(0, 3, 1, 2), interpolate_pos_encoding=(height, width) != (16, 16))
            np.testing.assert_allclose(to_numpy(model.features(images)), out.last_hidden_state.numpy(), atol=1e-4)
            if use_head:
                np.testing.assert_allclose(to_numpy(model.pooled_features(images)), out.pooler_output.numpy(),
                                           atol=1e-4)  # fmt: skip
                np.testing.assert_allclose(model.embed_images(images, pooling="pooled"), out.pooler_output.numpy(),
                                           atol=1e-4)  # fmt: skip
    keras_tfm.save_huggingface(model, str(tmp_path))
    reloaded = transformers.SiglipVisionModel.from_pretrained(tmp_path).eval()
    images = rng.normal(size=(1, 16, 16, 3)).astype("float32")
    with torch.no_grad():
        pixels = torch.tensor(images).permute(0, 3, 1, 2)
        np.testing.assert_allclose(reloaded(pixels).last_hidden_state.numpy(), hf(pixels).last_hidden_state.numpy(),
                                   atol=1e-5)  # fmt: skip


@pytest.mark.backend_independent  # the options' checks: plain Python
def test_towers_transformers_cannot_hold_are_refused_by_name(tmp_path):
    with pytest.raises(keras_tfm.errors.InputError, match="use_class_token.*distillation_token=True"):
        keras_tfm.ViT(image_size=16, patch_size=8, use_class_token=False, distillation_token=True, pooling="mean")
    with pytest.raises(keras_tfm.errors.InputError, match="pooling must be .*received 'token' \\(use_class_token"):
        keras_tfm.ViT(image_size=16, patch_size=8, use_class_token=False)
    tower = keras_tfm.ViT(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, include_top=False,
                          use_class_token=False, pooling="attention", layer_scale_init=1.0)  # fmt: skip
    with pytest.raises(keras_tfm.errors.InputError, match="layer_scale_init=None; received layer_scale_init=1.0"):
        keras_tfm.save_huggingface(tower, str(tmp_path))
    with pytest.raises(keras_tfm.errors.InputError, match="no class token"):
        tower.embed_images(np.zeros((1, 16, 16, 3), "float32"), pooling="token")


CAPTIONS = ["a photo of a cat", "a photo of a dog", "A drawing of the BIRD!", "this is a photo of two cats."] * 20


def write_siglip_checkpoint(directory) -> None:
    """A random SigLIP (texts of 64 places, as transformers' pipeline pads them) with a SentencePiece tokenizer
    learned on a few captions (pad and end `</s>` = 1, as SigLIP's) and SigLIP's image processor."""
    import io

    import sentencepiece

    directory.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(CAPTIONS), model_writer=model, vocab_size=40,
                                             pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False)  # fmt: skip
    (directory / "spiece.model").write_bytes(model.getvalue())
    transformers.SiglipTokenizer(str(directory / "spiece.model")).save_pretrained(directory)
    torch.manual_seed(0)
    text = {**TEXT, "vocab_size": 40, "max_position_embeddings": 64, "projection_size": 24}
    randomized(
        transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=VISION))
    ).save_pretrained(directory)
    transformers.SiglipImageProcessor(size={"height": 16, "width": 16}).save_pretrained(directory)


@pytest.mark.backend_independent  # the tokenizer and the pipeline's NumPy; the model's outputs: every backend above
def test_the_tokenizer_and_zero_shot_classification_are_transformers(tmp_path):
    import matplotlib

    write_siglip_checkpoint(tmp_path)
    model = keras_tfm.from_huggingface(str(tmp_path))
    assert isinstance(model.tokenizer, keras_tfm.data.SiglipTokenizer)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    texts = ["A photo of a CAT.", "two   dogs, and a bird!", " ".join(["a photo of a cat"] * 30)]
    expected = theirs(texts, truncation=True, max_length=64)["input_ids"]
    assert [ids.tolist() for ids in model.tokenizer.encode_batch(texts, max_length=64)] == expected
    photos = [f"{matplotlib.get_data_path()}/sample_data/{name}" for name in ("grace_hopper.jpg", "logo2.png")]
    labels = ["cat", "dog", "bird"]
    pipeline = transformers.pipeline("zero-shot-image-classification", model=str(tmp_path), device="cpu")
    expected = pipeline(photos, candidate_labels=labels, hypothesis_template="This is a photo of {}.")
    got = model.zero_shot_classify(photos, labels, templates="This is a photo of {}.")
    for ours, theirs in zip(got, expected):  # each label's own sigmoid, not a softmax over them
        assert [answer["label"] for answer in ours] == [answer["label"] for answer in theirs]
        np.testing.assert_allclose([a["score"] for a in ours], [a["score"] for a in theirs], atol=1e-4)
    one = pipeline(photos[0], candidate_labels=["cat"], hypothesis_template="This is a photo of {}.")
    got = model.zero_shot_classify(photos[0], ["cat"], templates="This is a photo of {}.")  # one label: its sigmoid
    assert got[0]["label"] == "cat" and abs(got[0]["score"] - one[0]["score"]) < 1e-4 and got[0]["score"] < 0.999
    keras_tfm.save_huggingface(model, str(tmp_path / "again"))  # the tokenizer writes itself for transformers
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "again")
    assert again(texts)["input_ids"] == transformers.AutoTokenizer.from_pretrained(tmp_path)(texts)["input_ids"]


def test_the_text_tower_alone_gives_transformers_outputs_and_round_trips(tmp_path):
    """`SiglipTextModel` (the tower and its head) as a SigLIP of the text tower alone: unit vectors of its
    `pooler_output`; written back; images refused by name."""
    torch.manual_seed(0)
    hf = randomized(transformers.SiglipTextModel(transformers.SiglipTextConfig(**TEXT, projection_size=24)))
    model = keras_tfm.from_huggingface(hf)
    assert model.vision_encoder is None and model.count_params() == sum(p.numel() for p in hf.parameters())
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor(TEXTS)).pooler_output.numpy()
    expected /= np.linalg.norm(expected, axis=-1, keepdims=True)
    np.testing.assert_allclose(to_numpy(model(token_ids=TEXTS)["text_embeds"]), expected, atol=1e-4, rtol=0)
    keras_tfm.save_huggingface(model, str(tmp_path))
    with torch.no_grad():
        again = transformers.SiglipTextModel.from_pretrained(tmp_path).eval()(input_ids=torch.tensor(TEXTS))
        before = hf(input_ids=torch.tensor(TEXTS)).pooler_output.numpy()
    np.testing.assert_allclose(again.pooler_output.numpy(), before, atol=1e-5)
    with pytest.raises(keras_tfm.errors.InputError, match="images: SigLIP.*no image tower"):
        model(images=np.zeros((1, 16, 16, 3), "float32"))


def patchified(images: np.ndarray, patch: int):
    """SigLIP 2's inputs for images of one size: each patch's pixels flattened (row, column, channel), every patch
    real, and the grid."""
    batch, height, width, channels = images.shape
    rows, cols = height // patch, width // patch
    patches = images.reshape(batch, rows, patch, cols, patch, channels).transpose(0, 1, 3, 2, 4, 5)
    return dict(pixel_values=torch.tensor(patches.reshape(batch, rows * cols, -1)),
                pixel_attention_mask=torch.ones(batch, rows * cols, dtype=torch.long),
                spatial_shapes=torch.tensor([[rows, cols]] * batch))  # fmt: skip


def test_siglip2_gives_transformers_outputs_at_its_grid_and_others_and_round_trips(rng, tmp_path):
    """`Siglip2Model` read at one resolution per batch: the linear patch projection as the ViT's convolution, the
    position table resized bilinearly with antialiasing (`position_interpolation="bilinear"`) to each grid."""
    torch.manual_seed(0)
    vision = {k: v for k, v in VISION.items() if k != "image_size"} | {"num_patches": 4}  # a 2 x 2 table
    config = transformers.Siglip2Config(text_config={**TEXT, "projection_size": 24}, vision_config=vision)
    hf = randomized(transformers.Siglip2Model(config))
    model = keras_tfm.from_huggingface(hf)
    assert model.vision_encoder.position_interpolation == "bilinear" and model.vision_encoder.image_size == 16
    assert model.count_params() == sum(p.numel() for p in hf.parameters())
    for height, width in ((16, 16), (24, 16), (8, 8)):  # the table's grid, a larger one, a smaller one
        images = rng.normal(size=(2, height, width, 3)).astype("float32")
        with torch.no_grad():
            out = hf(input_ids=torch.tensor(TEXTS), **patchified(images, 8))
        ours = model({"images": images, "token_ids": TEXTS})
        for name in OUTPUTS:
            np.testing.assert_allclose(to_numpy(ours[name]), getattr(out, name).numpy(), atol=1e-4, err_msg=name)
    keras_tfm.save_huggingface(model, str(tmp_path))
    reloaded = transformers.Siglip2Model.from_pretrained(tmp_path).eval()
    images = rng.normal(size=(1, 16, 16, 3)).astype("float32")
    with torch.no_grad():
        inputs = dict(input_ids=torch.tensor(TEXTS), **patchified(images, 8))
        np.testing.assert_allclose(reloaded(**inputs).logits_per_text.numpy(), hf(**inputs).logits_per_text.numpy(),
                                   atol=1e-5)  # fmt: skip
