"""CLIP as a model of two towers: it learns which text goes with which image from pairs without labels, with its
temperature kept where open_clip keeps it."""

import math

import keras
import numpy as np
import pytest

import keras_tfm
from tests.checks import to_numpy


def small_clip(logit_scale_init: float = math.log(10.0)):
    vision = keras_tfm.ViT(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=16, include_top=False,
                           patch_bias=False, norm_before_blocks=True, activation="quick_gelu")  # fmt: skip
    text = keras_tfm.CLIPTextEncoder(vocabulary_size=12, max_length=4, num_layers=1, num_heads=2, hidden_dim=16,
                                     end_token_id=11)  # fmt: skip
    return keras_tfm.CLIP(vision, text, projection_dim=8, logit_scale_init=logit_scale_init)


def paired(rng, rows: int = 64):
    """Images of 8 colours and texts of 8 words, colour k with word k: each batch of 8 holds each pair once."""
    classes = np.concatenate([rng.permutation(8) for _ in range(rows // 8)])
    colours = rng.random((8, 3)).astype("float32")
    images = colours[classes][:, None, None, :] + 0.05 * rng.normal(size=(rows, 8, 8, 3)).astype("float32")
    texts = np.stack([np.full(rows, 10), classes + 1, np.full(rows, 11)], axis=1)  # start, the word, end
    return {"images": images, "token_ids": texts}


def test_clip_learns_the_pairs_without_labels(rng):
    model = small_clip()
    data = paired(rng)
    model.compile(optimizer=keras.optimizers.Adam(3e-3))  # the default loss: ContrastiveLoss
    before = model.evaluate(data, batch_size=8, verbose=0)
    model.fit(data, batch_size=8, epochs=12, shuffle=False, verbose=0)
    after = model.evaluate(data, batch_size=8, verbose=0)
    assert before > 1.7 and after < 0.5, (before, after)  # chance: ln 8 = 2.08


@pytest.mark.backend_independent  # Keras applies the constraint after each step on every backend; one checks it
def test_the_temperature_stays_below_100(rng):
    model = small_clip(logit_scale_init=math.log(100.0) - 1e-3)
    model.compile(optimizer=keras.optimizers.SGD(10.0))  # a step that would push it far past ln 100
    model.fit(paired(rng, 8), batch_size=8, epochs=1, verbose=0)
    assert 0.0 <= float(to_numpy(model.logit_scale)) <= math.log(100.0) + 1e-6


@pytest.mark.backend_independent
def test_mismatched_images_and_texts_are_refused(rng):
    model = small_clip()
    data = paired(rng, 16)
    with pytest.raises(ValueError, match=r"x: CLIP.evaluate: every input must hold one row per example.*'images': 8"):
        model.evaluate({"images": data["images"][:8], "token_ids": data["token_ids"][:6]}, batch_size=8, verbose=0)


@pytest.mark.backend_independent  # configuration only: nothing is built
def test_a_named_size_is_the_checkpoints_configuration():
    """clip_vit_base_patch32() has the towers `from_huggingface` makes of transformers' default CLIPConfig (that of
    openai/clip-vit-base-patch32), whose parameter counts equal CLIPModel's (tests/convert/test_clip.py)."""
    transformers = pytest.importorskip("transformers")
    from keras_tfm.convert.clip import _text_tower, _vision_tower

    config = transformers.CLIPConfig().to_dict()
    model = keras_tfm.clip_vit_base_patch32()
    for tower, made in ((model.vision_encoder, _vision_tower(config["vision_config"])),
                        (model.text_encoder, _text_tower(config["text_config"]))):  # fmt: skip
        assert tower.get_config() == made.get_config()
    assert model.projection_dim == config["projection_dim"] == 512
    assert keras_tfm.clip_vit_base_patch32(vision_image_size=256).vision_encoder.image_size == 256
