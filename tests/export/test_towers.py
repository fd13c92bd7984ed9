"""An image-text model's towers exported: a SavedModel's `embed_images` and `embed_texts` (TensorFlow's loader),
one tower as ONNX (onnxruntime), each giving the model's unit vectors. (One function as LiteRT, the same route:
test_export.py's cached step.)"""

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import InputError
from tests.checks import to_numpy
from tests.models.test_clip import small_clip
from tests.models.test_siglip import small_siglip

BACKEND = keras.backend.backend()
IMAGES = np.random.default_rng(0).random((3, 8, 8, 3)).astype("float32")
TEXTS = np.array([[10, 3, 11, 0], [10, 5, 7, 11]], "int32")  # CLIP's: start, words, end, padding
MASK = (np.arange(4)[None] <= (TEXTS == 11).argmax(1)[:, None]).astype("int32")


@pytest.mark.skipif(BACKEND == "torch", reason="PyTorch writes no SavedModel (refused by name: test_export.py)")
# SigLIP's texts of the tower's fixed length: through JAX's symbolic shapes (TensorFlow's route is CLIP's)
@pytest.mark.parametrize("family", ["clip", "siglip"] if BACKEND == "jax" else ["clip"])
def test_a_saved_model_embeds_images_and_texts_as_the_model_does(tmp_path, family, capsys):
    tf = pytest.importorskip("tensorflow")
    model = small_clip() if family == "clip" else small_siglip()
    texts, mask = (TEXTS, MASK) if family == "clip" else (np.array([[10, 3, 11, 11]] * 2, "int32"), np.ones((2, 4)))
    model.export(str(tmp_path / "towers"))
    assert capsys.readouterr().out == f"Saved a SavedModel (embed_images, embed_texts) to {tmp_path / 'towers'}\n"
    served = tf.saved_model.load(str(tmp_path / "towers"))
    expected = model({"images": IMAGES, "token_ids": texts, "padding_mask": mask})
    np.testing.assert_allclose(np.asarray(served.embed_images(IMAGES)), to_numpy(expected["image_embeds"]), atol=1e-5)
    got = np.asarray(served.embed_texts(texts, mask.astype("int32")))
    np.testing.assert_allclose(got, to_numpy(expected["text_embeds"]), atol=1e-5)
    if family == "clip":  # any length up to the tower's
        short = np.asarray(served.embed_texts(TEXTS[:1, :3], MASK[:1, :3]))
        np.testing.assert_allclose(short, to_numpy(model(token_ids=TEXTS[:1, :3])["text_embeds"]), atol=1e-5)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="LiteRT and ONNX are written from TensorFlow (test_export.py)")
def test_one_tower_runs_in_onnxruntime(tmp_path):
    import onnxruntime

    model = small_clip()
    path = str(tmp_path / "text.onnx")
    with pytest.raises(
        InputError, match="tower: CLIP.export: a LiteRT or ONNX file holds one tower \\(format='onnx'\\)"
    ):
        model.export(path, format="onnx")
    model.export(path, format="onnx", tower="text", verbose=False)
    got = onnxruntime.InferenceSession(path).run(None, {"token_ids": TEXTS, "padding_mask": MASK})[0]
    expected = to_numpy(model(token_ids=TEXTS, padding_mask=MASK.astype(bool))["text_embeds"])
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.backend_independent
def test_a_tower_the_model_lacks_is_refused_by_name(tmp_path):
    text_only = keras_tfm.CLIP(None, small_clip().text_encoder, projection_dim=8)
    with pytest.raises(InputError, match=r"tower: CLIP.export: expected \['text'\]; received tower='image'"):
        text_only.export(str(tmp_path / "model.onnx"), format="onnx", tower="image")
