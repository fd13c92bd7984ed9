"""Set-prediction detection's parts: the matching is the cheapest assignment, COCO's mAP (pycocotools) scores
perfect, wrong and displaced detections as COCO does. Their agreement with transformers: tests/convert/test_yolos.py."""

import itertools

import numpy as np
import pytest
from keras import ops

from keras_tfm.detection import center_to_corners, coco_average_precision, generalized_box_iou, match_objects
from keras_tfm.errors import InputError
from tests.checks import to_numpy

pytest.importorskip("scipy")


@pytest.mark.backend_independent
def test_the_matching_is_the_cheapest_assignment_and_skips_padding(rng):
    logits = rng.normal(size=(2, 5, 4)).astype("float32")
    pred_boxes = rng.uniform(0.2, 0.8, (2, 5, 4)).astype("float32")
    labels = np.asarray([[0, 2, 1], [1, -1, -1]], "int32")
    boxes = rng.uniform(0.2, 0.6, (2, 3, 4)).astype("float32")
    matched = to_numpy(match_objects(logits, pred_boxes, labels, boxes))
    assert matched[1, 1:].tolist() == [-1, -1] and len(set(matched[0])) == 3
    probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    giou = to_numpy(generalized_box_iou(*(center_to_corners(ops.convert_to_tensor(b[0])) for b in (pred_boxes, boxes))))
    cost = 5 * np.abs(pred_boxes[0][:, None] - boxes[0][None]).sum(-1) - probabilities[0][:, labels[0]] - 2 * giou
    best = min(itertools.permutations(range(5), 3), key=lambda queries: sum(cost[q, i] for i, q in enumerate(queries)))
    assert tuple(matched[0]) == best


@pytest.mark.backend_independent
def test_coco_map_of_perfect_wrong_and_displaced_detections():
    pytest.importorskip("pycocotools")
    truth = [{"labels": np.asarray([1, 2]), "boxes": np.asarray([[10, 10, 50, 40], [60, 20, 90, 80]], "float32")}]
    perfect = [{"scores": np.asarray([0.9, 0.8]), "labels": truth[0]["labels"], "boxes": truth[0]["boxes"]}]
    assert coco_average_precision(perfect, truth)["map"] == pytest.approx(1.0)
    wrong = [{**perfect[0], "labels": np.asarray([2, 1])}]
    assert coco_average_precision(wrong, truth)["map"] == pytest.approx(0.0)
    # the first box moved by a quarter of its width: IoU 0.6, counted at 0.5, missed at 0.75
    moved = [{**perfect[0], "boxes": perfect[0]["boxes"] + np.asarray([[10, 0, 10, 0], [0, 0, 0, 0]], "float32")}]
    scores = coco_average_precision(moved, truth)
    assert scores["map_50"] == pytest.approx(1.0) and scores["map_75"] == pytest.approx(0.5)
    assert scores["map_small"] is None  # no object under 32 x 32 pixels
    with pytest.raises(InputError, match=r"^targets: expected one target per prediction \(1\); received 2"):
        coco_average_precision(perfect, truth * 2)
