"""DeiT (`DeiTModel`, `DeiTForImageClassification`, `...WithTeacher`: the class and distillation heads averaged at
inference) from and to transformers, built from small random configurations offline."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16,
              patch_size=4, num_labels=3)  # fmt: skip


def hf_deit(kind: str):
    torch.manual_seed(0)
    model = getattr(transformers, kind)(transformers.DeiTConfig(**CONFIG)).eval()
    with torch.no_grad():
        model.base_model.embeddings.distillation_token.normal_()
    return model


def run_hf(hf, images, **options):
    with torch.no_grad():
        out = hf(torch.tensor(images).permute(0, 3, 1, 2), **options)
    return out.logits.numpy() if hasattr(out, "logits") else out.last_hidden_state.numpy()


@pytest.mark.parametrize("kind", ["DeiTForImageClassificationWithTeacher", "DeiTForImageClassification", "DeiTModel"])
def test_logits_at_any_size_counts_and_checkpoints_written_back(rng, tmp_path, kind):
    hf = hf_deit(kind)
    model = keras_tfm.from_huggingface(hf)
    assert model.distillation_token and model.include_top == (kind != "DeiTModel")
    if kind != "DeiTModel":  # DeiTModel's pooler is not kept (nothing of the model reads it)
        assert model.count_params() == sum(p.numel() for p in hf.parameters())
    for height, width in ((16, 16), (24, 12)):
        images = rng.normal(size=(2, height, width, 3)).astype("float32")
        expected = run_hf(hf, images, interpolate_pos_encoding=(height, width) != (16, 16))
        np.testing.assert_allclose(to_numpy(model(images)), expected, atol=1e-4, rtol=0)
    keras_tfm.save_huggingface(model, tmp_path / "again")
    again = getattr(transformers, kind).from_pretrained(tmp_path / "again").eval()
    np.testing.assert_allclose(run_hf(again, images, interpolate_pos_encoding=True),
                               run_hf(hf, images, interpolate_pos_encoding=True), atol=1e-5, rtol=0)  # fmt: skip
