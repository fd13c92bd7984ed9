import numpy as np
import pytest

import keras_tfm
from tests.checks import assert_close, run_layer_checks, to_numpy

SMALL = dict(vocabulary_size=30, max_length=16, num_layers=1, hidden_dim=16, num_heads=2)


@pytest.mark.parametrize("head", ["mlm", "classifier", None])
def test_bert_models_pass_common_checks(tmp_path, rng, head):
    ids = rng.integers(1, 30, size=(2, 10)).astype("int32")
    # mixed precision is the encoder's, the same under every head: checked once, with the masked-LM head
    run_layer_checks(
        lambda **kw: keras_tfm.bert_tiny(head=head, **SMALL, **kw),
        (ids,),
        tmp_path=tmp_path,
        mixed_precision=head == "mlm",
    )


def test_padding_is_invisible_to_real_tokens(rng):
    model = keras_tfm.bert_tiny(head=None, **SMALL, dropout=0.0)
    ids = rng.integers(1, 30, size=(1, 10)).astype("int32")
    mask = np.arange(10)[None] < 6
    changed = ids.copy()
    changed[0, 6:] = (changed[0, 6:] + 3) % 30
    assert_close(
        to_numpy(model(ids, padding_mask=mask))[0, :6], to_numpy(model(changed, padding_mask=mask))[0, :6], atol=1e-5
    )


def test_heads_and_errors():
    classifier = keras_tfm.bert_tiny(head="classifier", num_classes=4, **SMALL)
    assert tuple(classifier(np.ones((3, 8), "int32")).shape) == (3, 4)
    mlm = keras_tfm.bert_tiny(**SMALL)
    assert isinstance(mlm, keras_tfm.BertMLM)
    assert tuple(mlm(np.ones((3, 8), "int32"), mask_positions=np.zeros((3, 2), "int32")).shape) == (3, 2, 30)
    with pytest.raises(ValueError, match="head must be"):
        keras_tfm.bert_tiny(head="qa")
    with pytest.raises(ValueError, match="max_length=16"):
        mlm(np.ones((1, 17), "int32"))
    # A gather outside the sequence was NaN on JAX and some other row's vector on PyTorch.
    ids = np.ones((3, 8), "int32")
    for wrong in (8, -1):
        positions = np.zeros((3, 2), "int32")
        positions[1, 1] = wrong
        with pytest.raises(
            ValueError, match=rf"`mask_positions` must hold positions in \[0, length=8\); received {wrong}"
        ):
            mlm(ids, mask_positions=positions)
        with pytest.raises(ValueError, match=r"`mask_positions` must hold positions in \[0, length=8\)"):
            mlm.predict({"token_ids": ids, "mask_positions": positions}, verbose=0)
        with pytest.raises(ValueError, match=r"`output_positions` must hold positions in \[0, length=8\)"):
            mlm.encoder(ids, None, None, positions)


@pytest.mark.parametrize("head", ["mlm", "classifier", None])
def test_inputs_as_one_dict_as_fit_and_predict_pass_them(rng, head):
    model = keras_tfm.bert_tiny(head=head, **SMALL, dropout=0.0)
    ids = rng.integers(1, 30, size=(4, 10)).astype("int32")
    inputs = {
        "token_ids": ids,
        "segment_ids": (np.arange(10)[None] >= 5).repeat(4, 0).astype("int32"),
        "padding_mask": np.arange(10)[None] < np.array([[10], [7], [4], [9]]),
    }
    expected = to_numpy(model(**inputs))
    assert_close(to_numpy(model(inputs)), expected, atol=1e-6)
    assert_close(model.predict(inputs, batch_size=3, verbose=0), expected, atol=1e-5)
