"""DINOv2 (with and without registers, GELU and SwiGLU MLPs, with its classifier) from and to transformers,
built from small random configurations offline: the same features at the trained size and at others, the same
parameter counts, and checkpoints transformers loads back."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, image_size=28, patch_size=7,
              layerscale_value=0.5)  # fmt: skip
KINDS = {
    "plain": ("Dinov2", {}),
    "swiglu": ("Dinov2", {"use_swiglu_ffn": True}),
    "registers": ("Dinov2WithRegisters", {"num_register_tokens": 3}),
}


def hf_dinov2(kind: str, head: bool = False, **config):
    """A random transformers DINOv2, its layer scales and tokens drawn too (they start at constants)."""
    name, options = KINDS[kind]
    torch.manual_seed(0)
    config = getattr(transformers, f"{name}Config")(**{**CONFIG, **options, **config})
    model = getattr(transformers, f"{name}ForImageClassification" if head else f"{name}Model")(config).eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if "lambda1" in parameter_name or "token" in parameter_name:
                parameter.copy_(torch.randn_like(parameter))
    return model


def run_hf(hf, images):
    with torch.no_grad():
        out = hf(torch.tensor(images).permute(0, 3, 1, 2))
    return out.logits.numpy() if hasattr(out, "logits") else out.last_hidden_state.numpy()


@pytest.mark.parametrize("kind", list(KINDS))
def test_features_and_parameter_count_match_at_any_image_size(rng, kind):
    hf = hf_dinov2(kind)
    model = keras_tfm.from_huggingface(hf)
    assert not model.include_top and model.count_params() == sum(p.numel() for p in hf.parameters())
    for height, width in ((28, 28), (21, 35)):  # the trained size; fewer rows (antialiased) and more columns
        images = rng.normal(size=(2, height, width, 3)).astype("float32")
        np.testing.assert_allclose(to_numpy(model(images)), run_hf(hf, images), atol=1e-4, rtol=0)
    masked = np.zeros((2, 16), bool)  # patches the mask token stands for (masked image modelling)
    masked[:, ::3] = True
    images = rng.normal(size=(2, 28, 28, 3)).astype("float32")
    with torch.no_grad():
        expected = hf(torch.tensor(images).permute(0, 3, 1, 2), bool_masked_pos=torch.tensor(masked))
    got = to_numpy(model.features(images, masked_patches=masked))
    np.testing.assert_allclose(got, expected.last_hidden_state.numpy(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["plain", "registers"])
def test_the_classifier_and_checkpoints_written_back(rng, tmp_path, kind):
    """`...ForImageClassification` (its head on the class token beside the mean patch) gives the same logits
    and keeps its labels; `save_huggingface` writes a checkpoint transformers loads with the same outputs."""
    labels = {0: "a", 1: "b", 2: "c"}
    hf = hf_dinov2(kind, head=True, num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()})
    model = keras_tfm.from_huggingface(hf)
    assert model.class_names == ["a", "b", "c"] and model.count_params() == sum(p.numel() for p in hf.parameters())
    images = rng.normal(size=(2, 28, 28, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(images)), run_hf(hf, images), atol=1e-4, rtol=0)
    keras_tfm.save_huggingface(model, tmp_path / "again")
    again = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "again").eval()
    assert type(again) is type(hf) and again.config.id2label == labels
    np.testing.assert_allclose(run_hf(again, images), run_hf(hf, images), atol=1e-5, rtol=0)
    backbone = keras_tfm.from_huggingface(str(tmp_path / "again"), num_classes=5)  # a new head of 5 classes
    assert backbone.num_classes == 5 and backbone.layer_scale_init is not None


def test_published_checkpoints_names_are_read(rng, tmp_path):
    """facebook/dinov2-* were saved by transformers 4: `attention.attention.query`, `attention.output.dense`,
    and the giant's SwiGLU as one `mlp.weights_in` (gate rows, then up rows) and `mlp.weights_out`."""
    from safetensors.numpy import save_file

    hf = hf_dinov2("swiglu")
    old = {}
    for name, value in hf.state_dict().items():
        for new, previous in ((".attention.q_proj.", ".attention.attention.query."),
                              (".attention.k_proj.", ".attention.attention.key."),
                              (".attention.v_proj.", ".attention.attention.value."),
                              (".attention.o_proj.", ".attention.output.dense."),
                              (".mlp.down_proj.", ".mlp.weights_out.")):  # fmt: skip
            name = name.replace(new, previous)
        old[name] = value.numpy()
    for name in [name for name in old if ".mlp.gate_proj." in name]:
        up = name.replace("gate_proj", "up_proj")
        old[name.replace("gate_proj", "weights_in")] = np.concatenate([old.pop(name), old.pop(up)])
    save_file(old, str(tmp_path / "model.safetensors"))
    hf.config.to_json_file(str(tmp_path / "config.json"))
    model = keras_tfm.from_huggingface(str(tmp_path))
    images = rng.normal(size=(1, 28, 28, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(model(images)), run_hf(hf, images), atol=1e-4, rtol=0)


def test_hidden_states_of_chosen_layers_are_transformers(rng):
    hf = hf_dinov2("registers")
    model = keras_tfm.from_huggingface(hf)
    images = rng.normal(size=(1, 28, 28, 3)).astype("float32")
    with torch.no_grad():
        expected = hf(torch.tensor(images).permute(0, 3, 1, 2), output_hidden_states=True).hidden_states
    states = model.hidden_states(images, layers=[0, 2])
    assert sorted(states) == [0, 2]
    for index, state in states.items():
        np.testing.assert_allclose(to_numpy(state), expected[index].numpy(), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match=r"layers: ViT.hidden_states: expected layer numbers in \[0, 2\]"):
        model.hidden_states(images, layers=[3])
