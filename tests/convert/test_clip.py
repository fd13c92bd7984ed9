"""CLIP's vision tower (`CLIPVisionModel`) from and to transformers, built from a small random configuration
offline: the ViT with a patch embedding without bias, a LayerNorm before the blocks and `quick_gelu`."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_clip_vision():
    torch.manual_seed(0)
    config = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                           num_attention_heads=4, image_size=24, patch_size=8)  # fmt: skip
    return transformers.CLIPVisionModel(config).eval()


def run_hf(hf, images):
    with torch.no_grad():
        out = hf(torch.tensor(images).permute(0, 3, 1, 2), interpolate_pos_encoding=images.shape[1:3] != (24, 24))
    return out.pooler_output.numpy(), out.last_hidden_state.numpy()


def test_the_tower_gives_transformers_outputs_at_any_image_size_and_writes_its_checkpoint(rng, tmp_path):
    hf = hf_clip_vision()
    model = keras_tfm.from_huggingface(hf)
    assert (model.norm_before_blocks, model.patch_bias, model.activation) == (True, False, "quick_gelu")
    assert model.count_params() == sum(p.numel() for p in hf.parameters())
    for height, width in ((24, 24), (32, 16)):  # the trained size, and another (positions resized bicubically)
        images = rng.normal(size=(2, height, width, 3)).astype("float32")
        pooled, last = run_hf(hf, images)
        np.testing.assert_allclose(to_numpy(model.features(images))[:, 0], pooled, atol=1e-4, rtol=0)
        np.testing.assert_allclose(to_numpy(model.hidden_states(images, [2])[2]), last, atol=1e-4, rtol=0)
    keras_tfm.save_huggingface(model, str(tmp_path))
    reloaded = transformers.CLIPVisionModel.from_pretrained(tmp_path).eval()
    images = rng.normal(size=(2, 24, 24, 3)).astype("float32")
    np.testing.assert_allclose(run_hf(reloaded, images)[0], run_hf(hf, images)[0], atol=1e-5, rtol=0)


@pytest.mark.backend_independent  # the options' checks: plain Python
def test_a_tower_transformers_cannot_hold_is_refused_by_name(tmp_path):
    model = keras_tfm.ViT(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, include_top=False,
                          norm_before_blocks=True)  # fmt: skip
    with pytest.raises(keras_tfm.errors.InputError, match="patch_bias=True"):
        keras_tfm.save_huggingface(model, str(tmp_path))


def hf_clip(eos_token_id: int = 59):
    torch.manual_seed(0)
    text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, vocab_size=60,
                max_position_embeddings=12, eos_token_id=eos_token_id, pad_token_id=0, bos_token_id=58)  # fmt: skip
    vision = dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2, image_size=16,
                  patch_size=8)  # fmt: skip
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)
    return transformers.CLIPModel(config).eval()


OUTPUTS = ("logits_per_image", "logits_per_text", "image_embeds", "text_embeds")
# three texts of 2, 4 and 1 words between the start (58) and end (59) tokens, padded with 0
TEXTS = np.array([[58, 5, 7, 59, 0, 0], [58, 9, 10, 11, 12, 59], [58, 3, 59, 0, 0, 0]])
PADDING = np.arange(6)[None] <= (TEXTS == 59).argmax(1)[:, None]


def run_hf_clip(hf, images):
    with torch.no_grad():
        out = hf(pixel_values=torch.tensor(images).permute(0, 3, 1, 2), input_ids=torch.tensor(TEXTS),
                 attention_mask=torch.tensor(PADDING.astype("int64")))  # fmt: skip
    return {name: getattr(out, name).numpy() for name in OUTPUTS}


def test_clip_gives_transformers_outputs_and_round_trips(rng, tmp_path, eos_token_id=59):
    hf = hf_clip(eos_token_id)
    model = keras_tfm.from_huggingface(hf)
    assert isinstance(model, keras_tfm.CLIP) and model.count_params() == sum(p.numel() for p in hf.parameters())
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    expected = run_hf_clip(hf, images)
    ours = model({"images": images, "token_ids": TEXTS, "padding_mask": PADDING})
    for name in OUTPUTS:
        np.testing.assert_allclose(to_numpy(ours[name]), expected[name], atol=1e-4, rtol=0, err_msg=name)
    model.save(tmp_path / "clip.keras")  # two towers nested in one config
    loaded = keras_tfm.load(str(tmp_path / "clip.keras"))
    np.testing.assert_allclose(to_numpy(loaded(images=images, token_ids=TEXTS)["logits_per_image"]),
                               to_numpy(model(images=images, token_ids=TEXTS)["logits_per_image"]), atol=1e-6)  # fmt: skip
    keras_tfm.save_huggingface(model, str(tmp_path / "hf"))
    reloaded = transformers.CLIPModel.from_pretrained(tmp_path / "hf").eval()
    for name, value in run_hf_clip(reloaded, images).items():
        np.testing.assert_allclose(value, expected[name], atol=1e-5, rtol=0, err_msg=name)


def write_clip_checkpoint(directory) -> None:
    """The random CLIP with a word-level tokenizer (start 58, end 59, padding 0) and CLIP's image processor."""
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<pad>", "<unk>", "this", "is", "a", "photo", "of", "cat", "dog", "bird", ".", "drawing", "the"]
    vocabulary = {**{word: i for i, word in enumerate(words)}, "<|startoftext|>": 58, "<|endoftext|>": 59}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.normalizer = tokenizers.normalizers.Lowercase()
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", 58), ("<|endoftext|>", 59)]
    )
    hf_clip().save_pretrained(directory)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|startoftext|>",
                                         eos_token="<|endoftext|>", pad_token="<pad>", unk_token="<unk>",
                                         model_max_length=12).save_pretrained(directory)  # fmt: skip
    transformers.CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(
        directory
    )


@pytest.mark.backend_independent  # the pipeline's NumPy around the model; the model's outputs: every backend above
def test_zero_shot_classification_is_the_pipelines(tmp_path):
    import matplotlib

    write_clip_checkpoint(tmp_path)
    model = keras_tfm.from_huggingface(str(tmp_path))
    photos = [f"{matplotlib.get_data_path()}/sample_data/{name}" for name in ("grace_hopper.jpg", "logo2.png")]
    labels = ["cat", "dog", "bird"]
    pipeline = transformers.pipeline("zero-shot-image-classification", model=str(tmp_path), device="cpu")
    expected = pipeline(photos, candidate_labels=labels, hypothesis_template="This is a photo of {}.")
    got = model.zero_shot_classify(photos, labels, templates="This is a photo of {}.")
    for ours, theirs in zip(got, expected):
        assert [answer["label"] for answer in ours] == [answer["label"] for answer in theirs]
        np.testing.assert_allclose([a["score"] for a in ours], [a["score"] for a in theirs], atol=1e-4)
    # two templates: each label's prompts averaged as unit vectors (open_clip's ensembling)
    templates = ["a photo of a {}.", "a drawing of the {}."]
    prompts = model.embed_texts([template.format(label) for label in labels for template in templates])
    classes = prompts.reshape(3, 2, -1).mean(1)
    classes /= np.linalg.norm(classes, axis=-1, keepdims=True)
    logits = np.exp(to_numpy(model.logit_scale)) * model.embed_images(photos[0]) @ classes.T
    expected = np.exp(logits) / np.exp(logits).sum()
    got = model.zero_shot_classify(photos[0], labels, templates=templates)
    np.testing.assert_allclose([expected[labels.index(a["label"])] for a in got], [a["score"] for a in got], atol=1e-5)
    assert model.similarity(photos, ["a photo of a cat."]).shape == (2, 1)
    # a text longer than the text tower's 12 positions: cut as CLIP's tokenizer cuts it, the end token kept
    long = " ".join(["a photo of a cat ."] * 4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ids = tokenizer([long], truncation=True, max_length=12, return_tensors="pt")["input_ids"]
    assert ids.shape == (1, 12) and int(ids[0, -1]) == 59
    with torch.no_grad():
        expected = transformers.CLIPModel.from_pretrained(tmp_path).get_text_features(input_ids=ids)
    expected = getattr(expected, "pooler_output", expected).numpy()[0]
    np.testing.assert_allclose(model.embed_texts(long), expected / np.linalg.norm(expected), atol=1e-5)
    one = pipeline(photos[0], candidate_labels=["cat"], hypothesis_template="This is a photo of {}.")
    assert (
        model.zero_shot_classify(photos[0], ["cat"])
        == [{"label": "cat", "score": one[0]["score"]}]
        == [
            {"label": "cat", "score": 1.0}  # one label: a softmax over it alone, as the pipeline's
        ]
    )
    with pytest.raises(keras_tfm.errors.InputError, match="labels"):
        model.zero_shot_classify(photos, [])
    with pytest.raises(keras_tfm.errors.InputError, match="templates"):
        model.zero_shot_classify(photos, labels, templates=["a photo"])


def test_one_tower_checkpoints_give_transformers_outputs_and_round_trip(rng, tmp_path):
    """`CLIPVisionModelWithProjection` and `CLIPTextModelWithProjection` as a CLIP of one tower (unit vectors of
    transformers' `image_embeds`, `text_embeds`), `CLIPTextModel` as a `CLIPTextEncoder`; each written back."""
    full = hf_clip()
    full.config.vision_config.projection_dim = full.config.text_config.projection_dim = 8
    vision = transformers.CLIPVisionModelWithProjection(full.config.vision_config).eval()
    text = transformers.CLIPTextModelWithProjection(full.config.text_config).eval()
    vision.load_state_dict(full.state_dict(), strict=False)
    text.load_state_dict(full.state_dict(), strict=False)
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    pixels, ids, mask = torch.tensor(images).permute(0, 3, 1, 2), torch.tensor(TEXTS), torch.tensor(PADDING * 1)
    for hf, name, inputs, feed in ((vision, "image_embeds", {"pixel_values": pixels}, {"images": images}),
                                   (text, "text_embeds", {"input_ids": ids, "attention_mask": mask},
                                    {"token_ids": TEXTS, "padding_mask": PADDING})):  # fmt: skip
        model = keras_tfm.from_huggingface(hf)
        assert model.count_params() == sum(p.numel() for p in hf.parameters())
        with torch.no_grad():
            expected = getattr(hf(**inputs), name).numpy()
        expected /= np.linalg.norm(expected, axis=-1, keepdims=True)
        np.testing.assert_allclose(to_numpy(model(**feed)[name]), expected, atol=1e-4, rtol=0, err_msg=name)
        keras_tfm.save_huggingface(model, str(tmp_path / name))
        with torch.no_grad():
            again = getattr(type(hf).from_pretrained(tmp_path / name).eval()(**inputs), name).numpy()
        np.testing.assert_allclose(again / np.linalg.norm(again, axis=-1, keepdims=True), expected, atol=1e-5)
    with pytest.raises(keras_tfm.errors.InputError, match="no image tower"):
        model(images=images)
    # 2: the first checkpoints' configs, which transformers pools at the largest id (here mid-text, not the end)
    full.config.text_config.eos_token_id = 2
    encoder = transformers.CLIPTextModel(full.config.text_config).eval()
    tower = keras_tfm.from_huggingface(encoder)
    assert isinstance(tower, keras_tfm.CLIPTextEncoder) and tower.pooling == "largest_id"
    texts = np.array([[4, 5, 57, 9, 6, 0], [4, 50, 3, 6, 0, 0]])  # the largest ids, 57 and 50, mid-text
    ids = torch.tensor(texts)
    with torch.no_grad():
        pooled = encoder(input_ids=ids).pooler_output.numpy()
    np.testing.assert_allclose(to_numpy(tower.pooled(texts)), pooled, atol=1e-4, rtol=0)
    keras_tfm.save_huggingface(tower, str(tmp_path / "text"))
    with torch.no_grad():
        again = transformers.CLIPTextModel.from_pretrained(tmp_path / "text").eval()(input_ids=ids).pooler_output
    np.testing.assert_allclose(again.numpy(), to_numpy(tower.pooled(texts)), atol=1e-5)
