"""ViTMAE (`ViTMAEForPreTraining`, `ViTMAEModel`) from and to transformers, built from small random configurations
offline: given the same noise, the same hidden patches, predicted pixels and loss."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, image_size=16,
              patch_size=4, decoder_hidden_size=8, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
              decoder_intermediate_size=12)  # fmt: skip


def hf_mae(cls, **overrides):
    """Noise on every trained parameter (transformers starts the mask token and biases at 0); the fixed position
    tables stay as they are."""
    torch.manual_seed(0)
    hf = cls(transformers.ViTMAEConfig(**CONFIG, **overrides))
    with torch.no_grad():
        for parameter in hf.parameters():
            if parameter.requires_grad:
                parameter.add_(0.1 * torch.randn_like(parameter))
    return hf.eval()


def test_pretraining_gives_transformers_pixels_mask_and_loss_for_the_same_noise_and_round_trips(rng, tmp_path):
    hf = hf_mae(transformers.ViTMAEForPreTraining, norm_pix_loss=True)
    model = keras_tfm.from_huggingface(hf)
    assert isinstance(model, keras_tfm.ViTMAE) and model.count_params() == sum(p.numel() for p in hf.parameters())
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    noise = rng.random((2, 16)).astype("float32")
    ours = model(images, noise=noise)
    for normalized in (True, False):
        hf.config.norm_pix_loss = model.normalize_targets = normalized
        with torch.no_grad():
            expected = hf(torch.tensor(images).permute(0, 3, 1, 2), noise=torch.tensor(noise))
        loss = float(model.compute_loss(images, None, ours))
        assert loss == pytest.approx(expected.loss.item(), abs=1e-5), normalized
    np.testing.assert_allclose(to_numpy(ours["logits"]), expected.logits.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_array_equal(to_numpy(ours["mask"]), expected.mask.numpy())
    np.testing.assert_array_equal(to_numpy(ours["ids_restore"]), expected.ids_restore.numpy())
    assert to_numpy(ours["mask"]).sum(1).tolist() == [12, 12]  # 75% hidden
    keras_tfm.save_huggingface(model, str(tmp_path / "hf"))
    reloaded = transformers.ViTMAEForPreTraining.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        again = reloaded(torch.tensor(images).permute(0, 3, 1, 2), noise=torch.tensor(noise))
    np.testing.assert_allclose(again.logits.numpy(), expected.logits.numpy(), atol=1e-6, rtol=0)


def test_the_encoder_alone_is_a_vit_with_transformers_features(rng):
    hf = hf_mae(transformers.ViTMAEModel, mask_ratio=0.0)  # every patch seen, in the noise's order
    model = keras_tfm.from_huggingface(hf)
    assert isinstance(model, keras_tfm.ViT) and not model.include_top
    assert model.count_params() == sum(p.numel() for p in hf.parameters())
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    with torch.no_grad():
        expected = hf(torch.tensor(images).permute(0, 3, 1, 2), noise=torch.arange(16.0).repeat(2, 1))
    np.testing.assert_allclose(to_numpy(model.features(images)), expected.last_hidden_state.numpy(), atol=1e-4)
