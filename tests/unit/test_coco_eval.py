"""The shared COCO evaluator equals pycocotools run on a results JSON file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from input_pipeline.shapes_dataset import ShapesParams, write_shapes_coco
from mlperf.coco_eval import STAT_NAMES, CocoEvaluator, write_results


@pytest.fixture(scope="module")
def gt_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    return write_shapes_coco(str(out), ShapesParams(num_images=10, image_size=64, seed=7))


def _noisy_detections(gt: dict, seed: int):
    """Jittered true boxes with random scores, some wrong labels, and false positives."""
    rng = np.random.default_rng(seed)
    ids, boxes, scores, labels = [], [], [], []
    for a in gt["annotations"]:
        x, y, w, h = a["bbox"]
        jitter = rng.normal(0, 0.08, 4) * [w, h, w, h]
        ids.append(a["image_id"])
        boxes.append([x + jitter[0], y + jitter[1], w + jitter[2], h + jitter[3]])
        scores.append(rng.uniform(0.3, 1.0))
        labels.append(a["category_id"] if rng.random() < 0.8 else rng.integers(1, 4))
    for img in gt["images"]:
        for _ in range(3):
            x, y = rng.uniform(0, 40, 2)
            ids.append(img["id"])
            boxes.append([x, y, rng.uniform(5, 24), rng.uniform(5, 24)])
            scores.append(rng.uniform(0.0, 0.6))
            labels.append(rng.integers(1, 4))
    return np.array(ids), np.array(boxes), np.array(scores), np.array(labels)


def test_map_equals_pycocotools_on_a_results_json(gt_path, tmp_path):
    with open(gt_path) as f:
        gt = json.load(f)
    evaluator = CocoEvaluator(gt, label_to_category=[0, 1, 2, 3])
    results = evaluator.box_results(*_noisy_detections(gt, seed=0))
    ours = evaluator.evaluate(results)
    assert 0.1 < ours["AP"] < 0.95

    path = str(tmp_path / "results.json")
    write_results(path, results)
    coco_gt = COCO(gt_path)
    coco_eval = COCOeval(coco_gt, coco_gt.loadRes(path), iouType="bbox")
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
    assert [ours[k] for k in STAT_NAMES] == [float(v) for v in coco_eval.stats]


def test_perfect_detections_score_one_and_none_score_zero(gt_path):
    with open(gt_path) as f:
        gt = json.load(f)
    evaluator = CocoEvaluator(gt_path, label_to_category=[0, 1, 2, 3])
    anns = gt["annotations"]
    results = evaluator.box_results(
        np.array([a["image_id"] for a in anns]),
        np.array([a["bbox"] for a in anns]),
        np.ones(len(anns)),
        np.array([a["category_id"] for a in anns]),
    )
    assert evaluator.evaluate(results)["AP"] == pytest.approx(1.0)
    assert evaluator.evaluate([])["AP"] == 0.0


def test_label_map_translates_contiguous_labels(gt_path):
    evaluator = CocoEvaluator(gt_path, label_to_category=[0, 3, 1, 2])
    (r,) = evaluator.box_results(np.array([5]), np.array([[1.0, 2, 3, 4]]), [0.5], [1])
    assert r["category_id"] == 3 and r["bbox"] == [1.0, 2.0, 3.0, 4.0]


def test_segm_results_round_trip(gt_path):
    with open(gt_path) as f:
        gt = json.load(f)
    evaluator = CocoEvaluator(gt, label_to_category=[0, 1, 2, 3])
    from pycocotools import mask as mask_utils

    anns = gt["annotations"]
    masks = []
    for a in anns:
        rle = mask_utils.frPyObjects(a["segmentation"], 64, 64)
        masks.append(mask_utils.decode(mask_utils.merge(rle)))
    results = evaluator.mask_results(
        np.array([a["image_id"] for a in anns]),
        np.stack(masks),
        np.ones(len(anns)),
        np.array([a["category_id"] for a in anns]),
    )
    assert evaluator.evaluate(results, "segm")["AP"] == pytest.approx(1.0)
