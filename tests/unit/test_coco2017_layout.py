"""COCO 2017 as distributed (train2017/, val2017/, annotations/instances_*2017.json) feeds
SSD and Mask R-CNN with no conversion step, and the eval scores against the full val JSON.

The fixture folder tests/fixtures/coco2017/ is written by make_coco2017_layout.py.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from configs import maskrcnn as maskrcnn_configs
from configs import ssd as ssd_configs
from mlperf.maskrcnn.task import MaskRcnnTask
from mlperf.ssd.task import SsdTask

COCO = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "coco2017")
VAL_JSON = os.path.join(COCO, "annotations", "instances_val2017.json")


def _official_layout(config, cache: str):
    """The flags a user gives for a COCO 2017 folder (what mlperf_v07 sets, plus data_dir)."""
    config.data.update(
        source="coco",
        data_dir=COCO,
        annotations="annotations/instances_train2017.json",
        images_dir="train2017",
        eval_annotations="annotations/instances_val2017.json",
        eval_images_dir="val2017",
        categories=(),
        cache_dir=cache,
    )
    config.model.num_classes = 0  # from the data
    return config


def _perfect_results(evaluator, with_masks: bool) -> list[dict]:
    """Every non-crowd ground-truth object of the val JSON as a detection of score 1."""
    with open(VAL_JSON) as f:
        gt = json.load(f)
    sizes = {im["id"]: (im["height"], im["width"]) for im in gt["images"]}
    results = []
    for a in gt["annotations"]:
        if a["iscrowd"]:
            continue
        r = {"image_id": a["image_id"], "category_id": a["category_id"], "score": 1.0}
        if with_masks:
            h, w = sizes[a["image_id"]]
            rle = mask_utils.merge(mask_utils.frPyObjects(a["segmentation"], h, w))
            r["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode()}
        else:
            r["bbox"] = a["bbox"]
        results.append(r)
    return results


@pytest.fixture(scope="module")
def ssd_task(tmp_path_factory):
    config = _official_layout(ssd_configs.get_config("tiny"), str(tmp_path_factory.mktemp("c")))
    task = SsdTask(config)
    return task.with_data(task.prepare(0, 1))


def test_ssd_reads_the_coco2017_folder_and_scores_against_the_full_val_json(ssd_task):
    data = ssd_task.data.coco
    assert (len(data.train), len(data.eval)) == (3, 3)  # incl. the image without objects
    assert data.label_to_category == [0, 1, 3, 18]
    assert ssd_task.model_config().num_classes == 4
    assert os.path.samefile(data.eval_gt_path, VAL_JSON)
    with open(VAL_JSON) as f:
        assert ssd_task.data.evaluator.gt.dataset["annotations"] == json.load(f)["annotations"]
    stats = ssd_task.data.evaluator.evaluate(_perfect_results(ssd_task.data.evaluator, False))
    assert stats["AP"] == pytest.approx(1.0)
    batches = ssd_task.eval_data(4, 0, 1)
    ids = batches[0]["image_id"][batches[0]["mask"] > 0]
    assert sorted(int(i) for i in ids) == [101, 102, 103]


def test_ssd_eval_without_detections_scores_zero(ssd_task):
    assert ssd_task.data.evaluator.evaluate([])["AP"] == 0.0


def test_maskrcnn_reads_the_coco2017_folder_and_scores_boxes_and_masks(tmp_path):
    config = _official_layout(maskrcnn_configs.get_config("tiny"), str(tmp_path))
    task = MaskRcnnTask(config)
    task = task.with_data(task.prepare(0, 1))
    data = task.data.coco
    assert (len(data.train), len(data.eval)) == (3, 3)
    assert os.path.samefile(data.eval_gt_path, VAL_JSON)
    assert task.num_classes() == 3
    for iou_type, masks in (("bbox", False), ("segm", True)):
        stats = task.data.evaluator.evaluate(_perfect_results(task.data.evaluator, masks), iou_type)
        assert stats["AP"] == pytest.approx(1.0), iou_type
    batch = task.eval_data(4, 0, 1)[0]
    assert batch["image"].shape == (4, 64, 64, 3)
    # Image 101's two objects, resized into the 64-pixel canvas (longer side 96 -> 64).
    first = int(np.flatnonzero(batch["image_id"] == 101)[0])
    assert sorted(batch["gt_classes"][first][:2].tolist()) == [1, 2]


def test_a_category_filter_scores_against_the_filtered_copy(tmp_path):
    config = _official_layout(ssd_configs.get_config("tiny"), str(tmp_path))
    config.data.categories = ("dog",)
    task = SsdTask(config)
    task = task.with_data(task.prepare(0, 1))
    data = task.data.coco
    assert data.label_to_category == [0, 18]
    assert not os.path.samefile(data.eval_gt_path, VAL_JSON)
    with open(data.eval_gt_path) as f:
        assert {a["category_id"] for a in json.load(f)["annotations"]} == {18}
