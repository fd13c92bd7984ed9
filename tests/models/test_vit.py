import numpy as np
import pytest
from keras import ops

import keras_tfm
from keras_tfm.layers.positions import bicubic_resize_matrix
from tests.checks import assert_close, run_layer_checks, to_numpy


def tiny_vit(**overrides):
    config = dict(image_size=16, patch_size=4, num_classes=5, num_layers=1, num_heads=2, hidden_dim=16)
    return keras_tfm.ViT(**{**config, **overrides})


# the second also holds DINOv2's options: layer scale, stochastic depth, registers, a mask token, a SwiGLU MLP
DINOV2_OPTIONS = dict(layer_scale_init=0.1, drop_path_rate=0.2, num_register_tokens=2, mask_token=True,
                      gated_feed_forward=True)  # fmt: skip


@pytest.mark.parametrize(
    "overrides", [{}, {"pooling": "mean", "positions": "sinusoidal", "dropout": 0.1, **DINOV2_OPTIONS}]
)
def test_vit_passes_common_checks(tmp_path, rng, overrides):
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    # mixed precision does not depend on pooling and positions: checked once, on the first
    run_layer_checks(
        lambda **kw: tiny_vit(**overrides, **kw), (images,), tmp_path=tmp_path, mixed_precision=not overrides
    )


def test_features_and_pooling(rng):
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    features = tiny_vit(include_top=False)
    tokens = features(images)
    assert tuple(tokens.shape) == (2, 1 + 16, 16)
    mean_model = tiny_vit(pooling="mean")
    mean_model.build()
    expected = to_numpy(
        mean_model.head(ops.mean(mean_model.final_norm(_encoded(mean_model, images)[:, 1:]), axis=1)[:, None])
    )[:, 0]
    assert_close(mean_model(images), expected, atol=1e-5)
    # Token pooling computes the last block at the class token only: the same logits as the full encoder's.
    token_model = tiny_vit(pooling="token")
    token_model.build()
    head_on = [
        to_numpy(token_model.head(token_model.final_norm(token)))[:, 0]
        for token in np.split(_encoded(token_model, images)[:, :2], 2, axis=1)
    ]  # class token, first patch
    assert_close(token_model(images), head_on[0], atol=1e-5)
    assert not np.allclose(head_on[0], head_on[1], atol=1e-3)


def _encoded(model, images):
    """Every token after the encoder, recomputed by hand from the model's parts."""
    x = model.patch_embedding(images)
    cls = np.broadcast_to(to_numpy(model.class_token), (images.shape[0], 1, model.hidden_dim))
    x = np.concatenate([cls, to_numpy(x)], axis=1)
    x = x + to_numpy(model.position_embedding.embeddings)[None]
    for block in model.blocks:
        x = block(x)
    return to_numpy(x)


def test_returns_every_layers_attention_weights(rng):
    model = tiny_vit(num_layers=2)
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    logits, weights = model(images, return_attention_weights=True)
    assert len(weights) == 2 and all(tuple(w.shape) == (2, 2, 17, 17) for w in weights)
    np.testing.assert_allclose(to_numpy(weights[0]).sum(-1), 1.0, atol=1e-5)
    assert_close(logits, model(images), atol=1e-5)


def test_other_resolutions_interpolate_positions(rng):
    model = tiny_vit()
    for shape in [(1, 32, 32, 3), (1, 8, 12, 3)]:
        assert tuple(model(rng.normal(size=shape).astype("float32")).shape) == (1, 5)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_compiled_predict_at_several_image_sizes_equals_eager_calls(rng, positions):
    # TensorFlow's `predict` retraces with unknown height and width once it has seen a second size.
    model = tiny_vit(positions=positions)
    for shape in [(3, 16, 16, 3), (3, 24, 32, 3), (3, 32, 16, 3), (3, 16, 16, 3)]:
        images = rng.normal(size=shape).astype("float32")
        assert_close(model.predict(images, batch_size=3, verbose=0), model(images), atol=1e-5)


def test_bicubic_matrix_is_identity_at_same_size_and_keeps_constants():
    np.testing.assert_array_equal(to_numpy(bicubic_resize_matrix(7, 7)), np.eye(7))
    np.testing.assert_allclose(to_numpy(bicubic_resize_matrix(4, 11)).sum(axis=1), 1.0, atol=1e-6)


def test_bad_images_and_configurations_raise():
    model = tiny_vit()
    with pytest.raises(ValueError, match=r"multiple of patch_size=4.*received image shape \(1, 18, 16, 3\)"):
        model(np.zeros((1, 18, 16, 3), "float32"))
    with pytest.raises(ValueError, match=r"\(batch, height, width, 3\); received shape \(1, 16, 16, 1\)"):
        model(np.zeros((1, 16, 16, 1), "float32"))
    with pytest.raises(ValueError, match="image_size=30, patch_size=4"):
        tiny_vit(image_size=30)
    with pytest.raises(ValueError, match="pooling must be"):
        tiny_vit(pooling="max")


@pytest.mark.backend_independent
def test_size_functions_have_hugging_face_parameter_counts():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cases = [
        (
            keras_tfm.vit_base,
            dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
        ),
        (keras_tfm.vit_tiny, dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768)),
    ]
    for size, hf_config in cases:
        with torch.device("meta"):
            hf = transformers.ViTForImageClassification(transformers.ViTConfig(num_labels=1000, **hf_config))
        model = size(num_classes=1000)
        model.build()
        assert model.count_params() == sum(p.numel() for p in hf.parameters())
        if size is keras_tfm.vit_base:
            assert model.count_params() == 86_567_656


@pytest.mark.backend_independent  # counts are the same on every backend
def test_dinov2_and_deit_sizes_have_hugging_face_parameter_counts():
    """dinov2_small and deit_tiny_distilled whole; dinov2_giant one layer deep (its SwiGLU layer and
    embeddings; forty such layers would take 4.5 GB to count)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    small = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, image_size=518, patch_size=14)
    giant = dict(hidden_size=1536, num_hidden_layers=1, num_attention_heads=24, image_size=518, patch_size=14,
                 use_swiglu_ffn=True)  # fmt: skip
    deit = dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768, num_labels=1000)
    cases = [
        (keras_tfm.dinov2_small(), transformers.Dinov2Model, transformers.Dinov2Config(**small)),
        (keras_tfm.dinov2_giant(num_layers=1), transformers.Dinov2Model, transformers.Dinov2Config(**giant)),
        (keras_tfm.dinov2_small(num_register_tokens=4, position_antialias=True),
         transformers.Dinov2WithRegistersModel, transformers.Dinov2WithRegistersConfig(**small)),
        (keras_tfm.deit_tiny_distilled(), transformers.DeiTForImageClassificationWithTeacher,
         transformers.DeiTConfig(**deit)),
    ]  # fmt: skip
    for model, kind, config in cases:
        with torch.device("meta"):
            hf = kind(config)
        assert model.count_params() == sum(p.numel() for p in hf.parameters()), kind.__name__


@pytest.mark.backend_independent  # arithmetic; tests/convert/test_deit.py holds the distilled logits on every backend
def test_distilled_heads_are_averaged(rng):
    """DeiT's option of the ViT: two heads, on the class and the distillation token, averaged."""
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    distilled = tiny_vit(distillation_token=True, pooling="distilled")
    logits = to_numpy(distilled(images))
    heads = to_numpy(distilled.features(images))
    expected = (to_numpy(distilled.head(heads[:, 0])) + to_numpy(distilled.distillation_head(heads[:, 1]))) / 2
    assert_close(logits, expected, atol=1e-5)
    with pytest.raises(ValueError, match="pooling must be"):
        tiny_vit(pooling="distilled")  # no distillation token
