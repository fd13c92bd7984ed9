"""DPT (`DPTForSemanticSegmentation`, `DPTForDepthEstimation`) and Depth Anything (`DepthAnythingForDepthEstimation`)
from and to transformers, built from small random configurations offline: logits and depths within 1e-4 on every
backend, at the trained size and others, equal parameter counts, the checkpoint's processor, and transformers'
post-processing."""

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.data import ImageProcessor
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VIT = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64)
NECK = dict(neck_hidden_sizes=[8, 16, 24, 32], fusion_hidden_size=16)
DPT = dict(**VIT, **NECK, image_size=32, patch_size=8, backbone_out_indices=[0, 1, 2, 3], use_auxiliary_head=False)


def noisy(hf):
    """Every parameter and running statistic away from its initial value (transformers starts the batch norm at 0
    and 1, which would not tell a mean from a variance); the depth head's last bias above 0, so that the ReLU
    passes most pixels."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in hf.named_parameters():
            parameter.normal_(0.0, 0.05) if "norm" not in name else parameter.uniform_(0.5, 1.5)
        for name, buffer in hf.named_buffers():
            if name.endswith("running_mean"):
                buffer.normal_(0.0, 0.05)
            elif name.endswith("running_var"):
                buffer.uniform_(0.5, 1.5)
        for name in ("head.conv3.bias", "head.head.4.bias"):
            if name in dict(hf.named_parameters()) and hf.get_parameter(name).numel() == 1:
                hf.get_parameter(name).fill_(0.5)
    return hf.eval()


def depth_anything(**head) -> "transformers.DepthAnythingForDepthEstimation":
    backbone = transformers.Dinov2Config(**VIT, image_size=28, patch_size=7, out_indices=[1, 2, 3, 4],
                                         reshape_hidden_states=False)  # fmt: skip
    config = transformers.DepthAnythingConfig(backbone_config=backbone, reassemble_hidden_size=32, **NECK,
                                              head_hidden_size=8, patch_size=7, **head)  # fmt: skip
    return noisy(transformers.DepthAnythingForDepthEstimation(config))


def run_hf(hf, images, field: str) -> np.ndarray:
    with torch.no_grad():
        out = getattr(hf(pixel_values=torch.tensor(images).permute(0, 3, 1, 2)), field).numpy()
    return out.transpose(0, 2, 3, 1) if out.ndim == 4 else out


def forward(model, images):
    """The model's outputs: compiled on JAX, whose eager operations each compile for every new shape (twice the
    time), eager elsewhere (TensorFlow's compile costs more than it saves)."""
    return model.predict_on_batch(images) if keras.backend.backend() == "jax" else model(images)


def parameters(model) -> int:
    """The model's parameters without batch norms' running statistics (PyTorch's buffers)."""
    return sum(int(np.prod(w.shape)) for w in model.weights if "moving" not in w.path)


def test_depth_anything_gives_transformers_depths_at_other_sizes_and_round_trips(rng, tmp_path):
    """A relative head and a metric one (a sigmoid times max_depth), at 5 x 7 patches (the table resized from
    4 x 4)."""
    images = rng.normal(size=(2, 35, 49, 3)).astype("float32")
    for index, head in enumerate([{}, {"depth_estimation_type": "metric", "max_depth": 20}]):
        hf = depth_anything(**head)
        model = keras_tfm.from_huggingface(hf)
        assert isinstance(model, keras_tfm.DPT) and parameters(model) == sum(p.numel() for p in hf.parameters())
        expected = run_hf(hf, images, "predicted_depth")
        assert expected.shape == (2, 35, 49) and (expected > 0).mean() > 0.5
        np.testing.assert_allclose(to_numpy(forward(model, images)), expected, atol=1e-4, rtol=1e-5)
        keras_tfm.save_huggingface(model, str(tmp_path / str(index)))
        reloaded = transformers.DepthAnythingForDepthEstimation.from_pretrained(tmp_path / str(index)).eval()
        np.testing.assert_allclose(run_hf(reloaded, images, "predicted_depth"), expected, atol=1e-6, rtol=0)
    assert model.head.depth_type == "metric" and model.head.max_depth == 20


def test_estimate_depth_prepares_as_the_checkpoint_and_answers_at_each_images_size(rng, tmp_path):
    """The checkpoint's `DPTImageProcessor` (aspect kept, sides multiples of the patch) and transformers'
    `post_process_depth_estimation` (bicubic to each image's size), on files of two aspects."""
    from PIL import Image
    from transformers.models.dpt.image_processing_pil_dpt import DPTImageProcessorPil

    hf = depth_anything()
    processor = DPTImageProcessorPil(size={"height": 28, "width": 28}, keep_aspect_ratio=True, ensure_multiple_of=7,
                                     resample=3, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])  # fmt: skip
    hf.save_pretrained(tmp_path / "hf")
    processor.save_pretrained(tmp_path / "hf")
    model = keras_tfm.from_huggingface(str(tmp_path / "hf"))
    assert isinstance(model.image_processor, ImageProcessor) and model.image_processor.keep_aspect_ratio
    for index, shape in enumerate([(30, 45, 3), (60, 40, 3)]):
        path = tmp_path / f"picture_{index}.png"
        Image.fromarray(rng.integers(0, 256, shape).astype("uint8")).save(path)
        inputs = processor(Image.open(path), return_tensors="pt")
        with torch.no_grad():
            outputs = hf(**inputs)
        expected = processor.post_process_depth_estimation(outputs, target_sizes=[shape[:2]])[0]["predicted_depth"]
        got = model.estimate_depth(str(path))
        assert got.shape == shape[:2]
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-4, rtol=1e-5)
    keras_tfm.save_huggingface(model, str(tmp_path / "ours"))
    written = DPTImageProcessorPil.from_pretrained(tmp_path / "ours")
    assert (written.keep_aspect_ratio, written.ensure_multiple_of, written.resample) == (True, 7, 3)


def test_dpt_segments_and_estimates_depth_as_transformers_and_round_trips(rng, tmp_path):
    """DPT's own ViT: the class token projected into every patch (readout "project"), every fused map doubled, the
    segmentation head's batch norm; written back without the auxiliary head, which only training reads."""
    images = rng.normal(size=(2, 48, 48, 3)).astype("float32")  # transformers' DPT takes square grids only
    for cls, field in ((transformers.DPTForSemanticSegmentation, "logits"),
                       (transformers.DPTForDepthEstimation, "predicted_depth")):  # fmt: skip
        hf = noisy(cls(transformers.DPTConfig(**DPT, num_labels=3)))
        model = keras_tfm.from_huggingface(hf)
        assert parameters(model) == sum(p.numel() for p in hf.parameters())
        expected = run_hf(hf, images, field)
        assert field == "logits" or (expected > 0).mean() > 0.5
        np.testing.assert_allclose(to_numpy(forward(model, images)), expected, atol=1e-4, rtol=1e-5)
        keras_tfm.save_huggingface(model, str(tmp_path / field))
        reloaded = cls.from_pretrained(tmp_path / field).eval()
        np.testing.assert_allclose(run_hf(reloaded, images, field), expected, atol=1e-6, rtol=0)
    assert model.include_top is False and expected.shape == (2, 96, 96)


def test_an_auxiliary_head_is_left_and_unknown_layouts_are_refused():
    hf = noisy(transformers.DPTForSemanticSegmentation(transformers.DPTConfig(**{**DPT, "use_auxiliary_head": True})))
    model = keras_tfm.from_huggingface(hf)
    assert model.include_top and model.class_names == ["LABEL_0", "LABEL_1"]
    hybrid = transformers.DPTForDepthEstimation(transformers.DPTConfig(**DPT, add_projection=True))
    with pytest.raises(keras_tfm.errors.InputError, match="add_projection=True are not supported"):
        keras_tfm.from_huggingface(hybrid)
