"""SegFormer (`SegformerForSemanticSegmentation`, `SegformerModel`) from and to transformers, built from small
random configurations offline: the hierarchical encoder's maps, the decoder's logits, the loss, the label maps of
transformers' post-processing, at image sizes that no stride divides."""

import numpy as np
import pytest

import keras_tfm
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# two stages (B0-B5 have four; every stage is the same code): keys and values reduced in the first, not the second
CONFIG = dict(num_encoder_blocks=2, hidden_sizes=[8, 16], depths=[1, 2], num_attention_heads=[1, 2], sr_ratios=[2, 1],
              patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[4, 2], decoder_hidden_size=16, num_labels=3)  # fmt: skip


def hf_segformer(cls=None):
    """A small SegFormer with noise on every parameter and on the batch norm's running statistics (transformers
    starts them at 0 and 1, which would not tell a mean from a variance)."""
    torch.manual_seed(0)
    hf = (cls or transformers.SegformerForSemanticSegmentation)(transformers.SegformerConfig(**CONFIG))
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
        for name, buffer in hf.named_buffers():
            if name.endswith("running_mean"):
                buffer.normal_(0.0, 0.05)  # near the features: not every pixel below zero after the ReLU
            elif name.endswith("running_var"):
                buffer.uniform_(0.5, 1.5)
    return hf.eval()


def run_hf(hf, images, **kwargs):
    with torch.no_grad():
        return hf(torch.tensor(images).permute(0, 3, 1, 2), output_hidden_states=True, **kwargs)


def channels_last(tensor) -> np.ndarray:
    return tensor.permute(0, 2, 3, 1).numpy()


def test_segformer_gives_transformers_logits_maps_and_loss_and_round_trips(rng, tmp_path):
    hf = hf_segformer()
    model = keras_tfm.from_huggingface(hf)  # transformers 5's names, from memory
    trainable = sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)
    assert isinstance(model, keras_tfm.SegFormer) and trainable == sum(p.numel() for p in hf.parameters())
    # 50 x 70 pixels: every stride pads (SegFormer has no position table: any size is as good as another)
    images = rng.normal(size=(2, 50, 70, 3)).astype("float32")
    labels = rng.integers(0, 3, size=(2, 50, 70))
    labels[:, :5] = 255  # ignored pixels
    expected = run_hf(hf, images, labels=torch.tensor(labels))
    maps = model.feature_maps(images)
    for ours, theirs in zip(maps, expected.hidden_states, strict=True):
        np.testing.assert_allclose(to_numpy(ours), channels_last(theirs), atol=1e-4, rtol=0)
    logits = to_numpy(model.decoder(maps))  # the model's call: `reread` below
    assert logits.shape == (2, 13, 18, 3)
    np.testing.assert_allclose(logits, channels_last(expected.logits), atol=1e-4, rtol=0)
    loss = float(keras_tfm.SegmentationCrossEntropy()(labels, logits))
    assert loss == pytest.approx(expected.loss.item(), abs=1e-5)
    hf.save_pretrained(tmp_path / "published")  # the published names
    reread = keras_tfm.from_huggingface(str(tmp_path / "published"))
    np.testing.assert_allclose(to_numpy(reread(images)), logits, atol=1e-6, rtol=0)
    keras_tfm.save_huggingface(model, str(tmp_path / "ours"))
    reloaded = transformers.SegformerForSemanticSegmentation.from_pretrained(tmp_path / "ours").eval()
    np.testing.assert_allclose(run_hf(reloaded, images).logits.numpy(), expected.logits.numpy(), atol=1e-6, rtol=0)


def test_the_encoder_alone_gives_transformers_last_map_and_round_trips(rng, tmp_path):
    hf = hf_segformer(transformers.SegformerModel)
    model = keras_tfm.from_huggingface(hf)
    assert not model.include_top and model.count_params() == sum(p.numel() for p in hf.parameters())
    images = rng.normal(size=(2, 50, 70, 3)).astype("float32")
    expected = channels_last(run_hf(hf, images).last_hidden_state)
    np.testing.assert_allclose(to_numpy(model(images)), expected, atol=1e-4, rtol=0)
    keras_tfm.save_huggingface(model, str(tmp_path / "hf"))
    reloaded = transformers.SegformerModel.from_pretrained(tmp_path / "hf").eval()
    np.testing.assert_allclose(channels_last(run_hf(reloaded, images).last_hidden_state), expected, atol=1e-6)


# the logits and their bilinear resizing (the loss's) on every backend: the first test
@pytest.mark.backend_independent
def test_segment_gives_transformers_post_processed_label_maps_at_each_images_size(rng, tmp_path):
    hf = hf_segformer()
    with torch.no_grad():  # logits that differ across the image more than the classes' biases do
        hf.decode_head.classifier.weight.mul_(300)
    processor = transformers.SegformerImageProcessorPil(size={"height": 64, "width": 64})
    hf.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    model = keras_tfm.from_huggingface(str(tmp_path))
    images = [rng.integers(0, 256, size=size, dtype="uint8") for size in ((48, 80, 3), (90, 60, 3))]
    for image in images:  # regions of colour, which the classes tell apart more than noise
        image[: image.shape[0] // 2] //= 8
        image[:, : image.shape[1] // 3, 1:] = 255
    with torch.no_grad():
        outputs = hf(**processor(images=images, return_tensors="pt"))
    sizes = [image.shape[:2] for image in images]
    expected = [m.numpy() for m in processor.post_process_semantic_segmentation(outputs, target_sizes=sizes)]
    maps = model.segment(images)
    assert [m.shape for m in maps] == sizes
    for ours, theirs in zip(maps, expected):
        assert (ours == theirs).mean() > 0.999  # a pixel whose two best logits tie within float error may differ
    assert len(np.unique(np.concatenate([m.ravel() for m in maps]))) > 1  # not one class everywhere
    np.testing.assert_array_equal(model.segment(images[1]), maps[1])  # one image: its map alone


@pytest.mark.backend_independent
def test_a_stage_list_of_the_wrong_type_is_named():
    from keras_tfm.convert.config import checkpoint_config
    from keras_tfm.errors import CheckpointError

    checkpoint_config({"model_type": "segformer", "num_attention_heads": [1, 2, 5, 8]}, "config.json")
    for field, value in (("num_attention_heads", [1, "2"]), ("depths", 2.5), ("hidden_sizes", [32, 0])):
        with pytest.raises(CheckpointError, match=rf"'{field}' must be an integer > 0 or a list of them"):
            checkpoint_config({"model_type": "segformer", field: value}, "config.json")
    with pytest.raises(CheckpointError, match="'num_attention_heads' must be an integer > 0; it is"):
        checkpoint_config({"model_type": "llama", "num_attention_heads": [1, 2]}, "config.json")
