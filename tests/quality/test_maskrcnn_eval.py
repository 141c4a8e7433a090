"""Host-side Mask R-CNN eval: fixed-size detections -> original pixels -> pasted RLE masks
-> COCOeval bbox and segm. Ground truth fed back as detections scores near 1; wrong
classes score near 0."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from configs.maskrcnn import get_config
from mlperf.maskrcnn.task import BOX_AP, MASK_AP, MaskRcnnTask


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    c = get_config("tiny")
    c.data.update(shapes_images=96, eval_count=16, cache_dir=str(tmp_path_factory.mktemp("cache")))
    t = MaskRcnnTask(c)
    return t.with_data(t.prepare(0, 1))


def _gt_as_detections(batch: dict[str, np.ndarray], out_size: int, shift_class: int = 0):
    """The batch's ground truth in eval_outputs' format (score 1, masks resized)."""
    n, g = batch["gt_classes"].shape
    masks = np.zeros((n, g, out_size, out_size), np.float16)
    for i in range(n):
        for j in range(g):
            img = Image.fromarray(batch["gt_masks"][i, j] * 255)
            masks[i, j] = np.asarray(img.resize((out_size, out_size), Image.BILINEAR)) / 255.0
    valid = batch["gt_classes"] > 0
    classes = np.where(valid, (batch["gt_classes"] - 1 + shift_class) % 3 + 1, 0)
    return {
        "boxes": batch["gt_boxes"],
        "scores": valid.astype(np.float32),
        "classes": classes.astype(np.int32),
        "valid": valid,
        "masks": masks,
    }


def _metrics(task, shift_class):
    batches = task.eval_data(8, 0, 1)
    size = task.model_config().mask_size
    outputs = [_gt_as_detections(b, size, shift_class) for b in batches]
    stats = task.host_eval_stats(outputs, batches)
    sums = {k: v[None] for k, v in stats.items()}  # one data shard
    sums["examples"] = int(sum(b["mask"].sum() for b in batches))
    return task.finalize_eval(sums)


def test_ground_truth_detections_score_high(task):
    m = _metrics(task, shift_class=0)
    assert m["eval_examples"] == 16
    assert m[BOX_AP] > 0.9, m
    assert m[MASK_AP] > 0.7, m
    assert task.target_reached({BOX_AP: 1.0, MASK_AP: 1.0})
    assert not task.target_reached({BOX_AP: 1.0, MASK_AP: 0.0})


def test_wrong_classes_score_low(task):
    m = _metrics(task, shift_class=1)
    assert m[BOX_AP] < 0.05 and m[MASK_AP] < 0.05, m


@pytest.mark.slow
@pytest.mark.xdist_group("maskrcnn_e2e")
def test_tiny_run_reaches_both_targets(tmp_path):
    """The documented tiny targets (box and mask mAP) within the tiny step budget."""
    from mlperf.train import run

    c = get_config("tiny")
    c.data.cache_dir = str(tmp_path / "cache")
    result = run(c, str(tmp_path / "run"))
    assert result["reached_target"], result["eval"]
    assert result["eval"][BOX_AP] >= c.train.target
    assert result["eval"][MASK_AP] >= c.train.mask_target
