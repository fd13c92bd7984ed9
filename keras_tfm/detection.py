"""Set-prediction detection (DETR, YOLOS): boxes, the matching of predictions to objects, the loss, the
post-processing and COCO's mean average precision.

Boxes are `(center_x, center_y, width, height)` fractions of the image, as the models predict them;
`center_to_corners` gives `(x0, y0, x1, y1)`. Objects come padded to one count per batch: `labels` `(batch,
objects)` with -1 for padding, `boxes` `(batch, objects, 4)`. The matching is SciPy's assignment solver, run on
the host inside the step (`host_call`); COCO's mAP is pycocotools'. Both come with the `detection` extra.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
from keras import ops

from keras_tfm.compat import host_call
from keras_tfm.errors import InputError


def center_to_corners(boxes):
    """`(..., 4)` center, width and height -> `(..., 4)` corners `(x0, y0, x1, y1)`."""
    center, size = boxes[..., :2], boxes[..., 2:]
    return ops.concatenate([center - size / 2, center + size / 2], axis=-1)


def generalized_box_iou(first, second, pairwise: bool = True):
    """Generalized IoU (Rezatofighi et al. 2019) of corner boxes: `(..., n, 4)` and `(..., m, 4)` -> `(..., n,
    m)`, or with `pairwise=False` of boxes side by side, `(..., n, 4)` twice -> `(..., n)`."""
    if pairwise:
        first, second = first[..., :, None, :], second[..., None, :, :]
    area_first = (first[..., 2] - first[..., 0]) * (first[..., 3] - first[..., 1])
    area_second = (second[..., 2] - second[..., 0]) * (second[..., 3] - second[..., 1])
    overlap = ops.maximum(ops.minimum(first[..., 2:], second[..., 2:]) - ops.maximum(first[..., :2], second[..., :2]),
                          0.0)  # fmt: skip
    intersection = overlap[..., 0] * overlap[..., 1]
    union = area_first + area_second - intersection
    hull = ops.maximum(first[..., 2:], second[..., 2:]) - ops.minimum(first[..., :2], second[..., :2])
    hull_area = hull[..., 0] * hull[..., 1]
    return intersection / union - (hull_area - union) / hull_area


def match_objects(logits, pred_boxes, labels, boxes, class_cost=1.0, box_cost=5.0, giou_cost=2.0):
    """The Hungarian matching of DETR: `(batch, objects)` int32, the query each object is matched to (-1 for
    padding, and for objects beyond the number of queries). The cost of a pair is `box_cost` x L1 distance
    of the boxes - `class_cost` x the query's probability of the object's class - `giou_cost` x their
    generalized IoU; each image's total is the least (SciPy's `linear_sum_assignment`)."""
    probabilities = ops.softmax(ops.cast(logits, "float32"), axis=-1)
    pred_boxes, boxes = ops.cast(pred_boxes, "float32"), ops.cast(boxes, "float32")
    valid = ops.greater_equal(labels, 0)
    batch, queries, objects = ops.shape(logits)[0], ops.shape(logits)[1], ops.shape(labels)[1]
    classes = ops.broadcast_to(ops.where(valid, labels, 0)[:, None, :], (batch, queries, objects))
    class_costs = -ops.take_along_axis(probabilities, ops.cast(classes, "int32"), axis=-1)
    box_costs = ops.sum(ops.abs(pred_boxes[:, :, None, :] - boxes[:, None, :, :]), axis=-1)
    giou = generalized_box_iou(center_to_corners(pred_boxes), center_to_corners(_padding_filled(boxes, valid)))
    cost = ops.stop_gradient(box_cost * box_costs + class_cost * class_costs - giou_cost * giou)
    return host_call(_assigned, [cost, valid], (batch, objects), "int32")


def _assigned(cost: np.ndarray, valid: np.ndarray) -> np.ndarray:
    from scipy.optimize import linear_sum_assignment

    matched = np.full(valid.shape, -1, "int32")
    largest = np.finfo(cost.dtype).max
    for row, (image_cost, image_valid) in enumerate(zip(cost, valid)):
        columns = np.flatnonzero(image_valid)
        queries, objects = linear_sum_assignment(np.nan_to_num(image_cost[:, columns], nan=largest, posinf=largest,
                                                                neginf=largest))  # fmt: skip
        matched[row, columns[objects]] = queries
    return matched


def _padding_filled(boxes, valid):
    """Padding rows as a whole-image box, so that no IoU divides by zero (their costs are never read)."""
    return ops.where(valid[..., None], boxes, ops.convert_to_tensor([0.5, 0.5, 1.0, 1.0], boxes.dtype))


def set_prediction_losses(logits, pred_boxes, labels, boxes, class_cost=1.0, box_cost=5.0, giou_cost=2.0,
                          no_object_weight=0.1, box_weight=5.0, giou_weight=2.0) -> dict:  # fmt: skip
    """DETR's loss after `match_objects`: `{"loss", "loss_ce", "loss_bbox", "loss_giou"}`, as transformers'
    `ForObjectDetectionLoss` names them. `loss_ce` is the cross-entropy of every query against its object's
    class or "no object" (the last class, weighted `no_object_weight`); `loss_bbox` the L1 distance and
    `loss_giou` 1 - the generalized IoU of each matched pair, each summed over the objects and divided by their
    number; `loss` is `loss_ce + box_weight * loss_bbox + giou_weight * loss_giou`."""
    labels = ops.cast(labels, "int32")
    matched = match_objects(logits, pred_boxes, labels, boxes, class_cost, box_cost, giou_cost)
    logits, pred_boxes, boxes = (ops.cast(x, "float32") for x in (logits, pred_boxes, boxes))
    queries, no_object = ops.shape(logits)[1], ops.shape(logits)[2] - 1
    paired = ops.logical_and(ops.greater_equal(matched, 0), ops.greater_equal(labels, 0))
    hits = ops.logical_and(
        ops.equal(matched[:, None, :], ops.arange(queries, dtype="int32")[None, :, None]), paired[:, None, :]
    )  # fmt: skip (batch, queries, objects)
    found = ops.any(hits, axis=-1)
    targets = ops.where(found, ops.sum(ops.where(hits, labels[:, None, :], 0), axis=-1), no_object)
    weights = ops.where(found, 1.0, no_object_weight)
    nll = -ops.take_along_axis(ops.log_softmax(logits, axis=-1), targets[..., None], axis=-1)[..., 0]
    loss_ce = ops.sum(weights * nll) / ops.sum(weights)
    count = ops.maximum(ops.sum(ops.cast(ops.greater_equal(labels, 0), "float32")), 1.0)
    chosen = ops.take_along_axis(pred_boxes, ops.maximum(matched, 0)[..., None], axis=1)
    mask = ops.cast(paired, "float32")
    loss_bbox = ops.sum(mask * ops.sum(ops.abs(chosen - boxes), axis=-1)) / count
    giou = generalized_box_iou(center_to_corners(chosen), center_to_corners(_padding_filled(boxes, paired)), False)
    loss_giou = ops.sum(mask * (1 - giou)) / count
    total = loss_ce + box_weight * loss_bbox + giou_weight * loss_giou
    return {"loss": total, "loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}


def detections(logits, pred_boxes, sizes, threshold: float = 0.5) -> list[dict]:
    """Per image, the queries whose likeliest object class scores over `threshold`: `{"scores", "labels",
    "boxes"}` with corner boxes in pixels of the image's `(height, width)` in `sizes` (transformers'
    `post_process_object_detection`)."""
    logits, pred_boxes = np.asarray(logits, "float32"), np.asarray(pred_boxes, "float32")
    if len(sizes) != len(logits):
        raise InputError(f"expected one (height, width) per image ({len(logits)}); received {len(sizes)}.", "sizes")
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities = (shifted / shifted.sum(-1, keepdims=True))[..., :-1]
    scores, labels = probabilities.max(-1), probabilities.argmax(-1)
    corners = np.concatenate(
        [pred_boxes[..., :2] - pred_boxes[..., 2:] / 2, pred_boxes[..., :2] + pred_boxes[..., 2:] / 2], -1
    )
    results = []
    for score, label, box, (height, width) in zip(scores, labels, corners, sizes):
        keep = score > threshold
        scale = np.asarray([width, height, width, height], "float32")
        results.append({"scores": score[keep], "labels": label[keep].astype("int32"), "boxes": box[keep] * scale})
    return results


def coco_average_precision(predictions: list[dict], targets: list[dict]) -> dict:
    """COCO's box mAP (pycocotools): `{"map", "map_50", "map_75", "map_small", "map_medium", "map_large"}` of
    each image's `predictions` (`detections`' dicts) against its `targets` (`{"labels", "boxes"}`, corner boxes in
    pixels), over the classes the targets hold; None where no object is of that size."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if len(predictions) != len(targets):
        raise InputError(f"expected one target per prediction ({len(predictions)}); received {len(targets)}.",
                         "targets")  # fmt: skip
    images, annotations, found = [], [], []
    for image, (predicted, target) in enumerate(zip(predictions, targets)):
        images.append({"id": image})
        for label, box in zip(np.asarray(target["labels"]), np.asarray(target["boxes"], "float64").reshape(-1, 4)):
            width, height = box[2] - box[0], box[3] - box[1]
            annotations.append({"id": len(annotations) + 1, "image_id": image, "category_id": int(label), "iscrowd": 0,
                                "bbox": [box[0], box[1], width, height], "area": width * height})  # fmt: skip
        for score, label, box in zip(
            predicted["scores"], predicted["labels"], np.asarray(predicted["boxes"], "float64")
        ):
            found.append({"image_id": image, "category_id": int(label), "score": float(score),
                          "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]})  # fmt: skip
    names = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large")
    if not annotations or not found:
        return dict.fromkeys(names, 0.0)
    truth = COCO()
    truth.dataset = {"images": images, "annotations": annotations,
                     "categories": [{"id": c} for c in sorted({a["category_id"] for a in annotations})]}  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        truth.createIndex()
        evaluation = COCOeval(truth, truth.loadRes(found), "bbox")
        evaluation.evaluate(), evaluation.accumulate(), evaluation.summarize()
    return {name: None if value < 0 else float(value) for name, value in zip(names, evaluation.stats)}
