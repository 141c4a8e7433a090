"""COCO evaluation with pycocotools: detections -> COCO results -> COCOeval metrics.

Shared by SSD (boxes) and Mask R-CNN (boxes and masks): `box_results` and
`mask_results` turn per-detection arrays into COCO result dicts, `evaluate` runs
COCOeval for one IoU type and returns its twelve summary numbers by name. The numbers
are exactly pycocotools' own on the same detections (a results JSON written with
`write_results` and scored by pycocotools gives the same values; tested).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pycocotools.coco
import pycocotools.cocoeval
from pycocotools import mask as mask_utils

# COCOeval.summarize() order of its 12 stats.
STAT_NAMES = (
    "AP",
    "AP50",
    "AP75",
    "APs",
    "APm",
    "APl",
    "AR1",
    "AR10",
    "AR100",
    "ARs",
    "ARm",
    "ARl",
)


def _quiet(*args: Any, **kwargs: Any) -> None:
    """pycocotools prints progress; the eval runs in a background thread next to the
    training loop's own output, and redirecting sys.stdout there would swallow the loop's
    lines, so its module-level `print` is replaced instead."""


pycocotools.coco.print = _quiet  # type: ignore[attr-defined]
pycocotools.cocoeval.print = _quiet  # type: ignore[attr-defined]


def load_ground_truth(gt: dict[str, Any] | str) -> pycocotools.coco.COCO:
    """A pycocotools COCO object from a COCO dict or a JSON path."""
    if isinstance(gt, str):
        with open(gt) as f:
            gt = json.load(f)
    coco = pycocotools.coco.COCO()
    coco.dataset = copy.deepcopy(gt)
    coco.dataset.setdefault("info", {})
    coco.dataset.setdefault("licenses", [])
    coco.createIndex()
    return coco


class CocoEvaluator:
    """Scores detections against one ground truth; label i maps to label_to_category[i]."""

    def __init__(self, gt: dict[str, Any] | str, label_to_category: Sequence[int]):
        self.gt = load_ground_truth(gt)
        self.label_to_category = np.asarray(label_to_category, np.int64)

    def box_results(
        self,
        image_ids: np.ndarray,
        boxes_xywh: np.ndarray,
        scores: np.ndarray,
        labels: np.ndarray,
    ) -> list[dict[str, Any]]:
        """COCO result dicts from flat per-detection arrays (boxes in image pixels)."""
        cats = self.label_to_category[np.asarray(labels, np.int64)]
        return [
            {
                "image_id": int(i),
                "category_id": int(c),
                "bbox": [round(float(v), 3) for v in b],
                "score": round(float(s), 5),
            }
            for i, b, s, c in zip(image_ids, boxes_xywh, scores, cats, strict=True)
        ]

    def mask_results(
        self,
        image_ids: np.ndarray,
        masks: np.ndarray,
        scores: np.ndarray,
        labels: np.ndarray,
    ) -> list[dict[str, Any]]:
        """COCO segmentation results from binary masks [N, H, W] in image pixels (RLE)."""
        out = []
        cats = self.label_to_category[np.asarray(labels, np.int64)]
        for i, m, s, c in zip(image_ids, masks, scores, cats, strict=True):
            rle = mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))
            rle["counts"] = rle["counts"].decode("ascii")
            out.append(
                {
                    "image_id": int(i),
                    "category_id": int(c),
                    "segmentation": rle,
                    "score": round(float(s), 5),
                }
            )
        return out

    def evaluate(self, results: list[dict[str, Any]], iou_type: str = "bbox") -> dict[str, float]:
        """COCOeval summary stats (AP, AP50, ..., ARl) for `iou_type` ("bbox" or "segm")."""
        if iou_type not in ("bbox", "segm"):
            raise ValueError(f"iou_type {iou_type!r}: use 'bbox' or 'segm'.")
        if not results:  # pycocotools cannot load an empty result list
            return dict.fromkeys(STAT_NAMES, 0.0)
        dt = self.gt.loadRes(copy.deepcopy(results))
        coco_eval = pycocotools.cocoeval.COCOeval(self.gt, dt, iouType=iou_type)
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
        # COCOeval reports -1 where a size class has no ground truth; keep its value.
        return {name: float(v) for name, v in zip(STAT_NAMES, coco_eval.stats, strict=True)}


def write_results(path: str, results: list[dict[str, Any]]) -> None:
    """Writes COCO results as the JSON pycocotools' loadRes reads."""
    with open(path, "w") as f:
        json.dump(results, f)
