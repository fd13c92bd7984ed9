import numpy as np
import pytest

import keras_tfm
from keras_tfm import viz


def test_rollout_of_identity_attention_is_identity_and_rows_sum_to_one(rng):
    identity = [np.broadcast_to(np.eye(5), (2, 3, 5, 5))] * 4
    np.testing.assert_allclose(viz.attention_rollout(identity), np.broadcast_to(np.eye(5), (2, 5, 5)), atol=1e-6)
    random = [rng.dirichlet(np.ones(5), size=(2, 3, 5)) for _ in range(3)]
    rollout = viz.attention_rollout(random)
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-6)
    # two layers by hand
    a = [0.5 * np.eye(5) + 0.5 * w.mean(1) for w in random[:2]]
    np.testing.assert_allclose(viz.attention_rollout(random[:2]), a[1] @ a[0], atol=1e-6)


def test_attention_map_png_from_a_vit(tmp_path, rng):
    pytest.importorskip("matplotlib")
    model = keras_tfm.ViT(image_size=16, patch_size=4, num_classes=3, num_layers=2, num_heads=2, hidden_dim=16)
    images = rng.random((1, 16, 16, 3)).astype("float32")
    _, weights = model(images, return_attention_weights=True)
    path = viz.plot_attention_maps(images[0], weights, str(tmp_path / "attention.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="15 patch tokens do not tile a 16x16 image"):
        viz.plot_attention_maps(images[0], [w[:, :, :-1, :-1] for w in weights], str(tmp_path / "x.png"))
    wide = rng.random((1, 16, 32, 3)).astype("float32")  # a 4 x 8 grid
    _, weights = model(wide, return_attention_weights=True)
    assert viz.plot_attention_maps(wide[0] * 255, weights, str(tmp_path / "wide.png")).endswith("wide.png")


def test_patch_values_cover_the_whole_image():
    grid = np.arange(12.0).reshape(3, 4)
    exact = viz._grid_to_pixels(grid, 6, 8)
    np.testing.assert_array_equal(exact, np.kron(grid, np.ones((2, 2))))
    # a 28-pixel image drawn for a model that saw it resized to 32 (8 x 8 patches of 4): no margin left over
    resized = viz._grid_to_pixels(np.arange(64.0).reshape(8, 8), 28, 28)
    assert resized.shape == (28, 28) and resized[0, 0] == 0 and resized[27, 27] == 63 and resized[27, 0] == 56


def test_learning_curves_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = viz.plot_learning_curves(
        {"loss": [3, 2, 1], "val_loss": [3, 2.5, 2], "accuracy": [0.1, 0.5, 0.7]},
        str(tmp_path / "curves.png"),
        title="test",
    )
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_learning_curves_take_what_fit_returns_and_refuse_an_empty_history(tmp_path):
    pytest.importorskip("matplotlib")
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    history = model.fit(np.ones((4, 2)), np.ones((4, 1)), epochs=2, verbose=0)  # a History, not its dict
    with open(viz.plot_learning_curves(history, str(tmp_path / "fit.png")), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"holds no training metric to plot; received the keys \['val_loss'\]"):
        viz.plot_learning_curves({"val_loss": [1.0]}, str(tmp_path / "empty.png"))  # was matplotlib's own error


@pytest.mark.backend_independent
def test_learning_curves_count_epochs_from_one_as_the_console_does(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    drawn = []

    def saved(figure, *args, **kwargs):
        drawn.extend(line.get_xdata().tolist() for axis in figure.axes for line in axis.lines)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", saved)
    viz.plot_learning_curves({"loss": [3, 2, 1], "val_loss": [3, 2.5, 2]}, str(tmp_path / "curves.png"))
    assert drawn == [[1, 2, 3], [1, 2, 3]]


@pytest.mark.backend_independent
def test_patch_features_are_drawn_by_their_principal_components(tmp_path):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(0)
    features = rng.normal(size=(3, 16, 8))
    path = viz.plot_patch_features(rng.random((3, 28, 28)), features, str(tmp_path / "patches.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"patch_features: plot_patch_features: expected \(count, patches, dim\)"):
        viz.plot_patch_features(rng.random((3, 28, 28)), features[:, :15], str(tmp_path / "odd.png"))
