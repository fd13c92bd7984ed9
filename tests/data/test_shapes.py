"""Generated shapes: every label agrees with the pixels (a map's classes, a shape's box and kind, the counts), and
a seed draws the same pictures."""

import numpy as np
import pytest

from keras_tfm.data import make_shapes
from keras_tfm.errors import InputError


@pytest.mark.backend_independent  # NumPy
def test_labels_boxes_and_counts_agree_with_the_label_maps():
    shapes = make_shapes(12, image_size=40, max_shapes=3, min_shapes=0, seed=5)
    for mask, labels, boxes, counts in zip(shapes.masks, shapes.labels, shapes.boxes, shapes.counts):
        present = labels[labels >= 0]
        assert set(np.unique(mask)) - {0} == {kind + 1 for kind in present}
        assert counts.tolist() == [int(np.sum(present == kind)) for kind in range(3)]
        covered = np.zeros(mask.shape, bool)
        for kind, box in zip(present, boxes):
            x0, y0, x1, y1 = (np.round(np.concatenate([box[:2] - box[2:] / 2, box[:2] + box[2:] / 2]) * 40)).astype(int)
            assert np.any(mask[y0:y1, x0:x1] == kind + 1)  # the box holds its shape's pixels
            covered[y0:y1, x0:x1] = True
        assert covered[mask > 0].all()  # and every shape's pixels are in a box
    again = make_shapes(12, image_size=40, max_shapes=3, min_shapes=0, seed=5)
    assert np.array_equal(again.images, shapes.images) and shapes.labels.max() <= 2
    with pytest.raises(InputError, match=r"^min_shapes: make_shapes: expected at most max_shapes \(1\); received 2"):
        make_shapes(2, max_shapes=1, min_shapes=2)
