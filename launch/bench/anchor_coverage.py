"""How well the RPN's anchors cover a data set's ground-truth boxes (numpy, no model), for
several anchor settings: one JSON line of box sizes, then one per (num_scales, anchor_scale).

    python -m launch.bench.anchor_coverage --config configs/maskrcnn.py:coco128 \\
        --config.data.data_dir=DIR

For each ground-truth box of the training split, as the pipeline prepares it (resized
and padded, no augmentation): its best anchor IoU and how many anchors reach each RPN
positive threshold, for a few anchor scales; and the boxes' sizes in pixels. An RPN can
only learn to propose what its positive anchors look like, so a ground truth whose best
anchor IoU is far below the threshold is one the RPN sees a single, poor, positive for
(the "best anchor per ground truth" rule) or none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from absl import flags

from launch.bench.common import CONFIG, run
from launch.cli import usage_error
from mlperf.maskrcnn.boxes import AnchorConfig, all_anchors, iou
from mlperf.validate import ConfigError, check_data_dir

_SCALES = flags.DEFINE_list("anchor_scales", ["2", "3", "4", "6", "8"], "anchor_scale values.")
_THRESHOLDS = flags.DEFINE_list("pos_iou", ["0.7", "0.5"], "RPN positive IoU thresholds.")
_NUM_SCALES = flags.DEFINE_list("num_scales", ["1", "2"], "Anchor sizes per octave.")


def coverage(
    gt_boxes: np.ndarray, anchors: np.ndarray, thresholds: Sequence[float]
) -> dict[str, float]:
    """Summary of the anchors' coverage of gt_boxes [N, 4]: quantiles of each box's best
    anchor IoU, and per threshold the share of boxes with no anchor at or above it and
    the mean number of anchors at or above it per box."""
    # The IoU the RPN matcher itself uses (rpn_targets).
    overlap = np.asarray(iou(jnp.asarray(gt_boxes), jnp.asarray(anchors)))  # [N, A]
    best = overlap.max(1)
    out = {
        "gt_boxes": float(len(gt_boxes)),
        "best_iou_p10": float(np.quantile(best, 0.1)),
        "best_iou_median": float(np.median(best)),
        "best_iou_mean": float(best.mean()),
    }
    # The "best anchor of each ground truth is positive" rule adds the anchors tied at
    # each box's best IoU (rpn_targets does this): one positive per box at least.
    tied = (overlap >= best[:, None] - 1e-6) & (best[:, None] > 0)
    for t in thresholds:
        count = (overlap >= t).sum(1)
        out[f"no_anchor_ge_{t}"] = float(np.mean(count == 0))
        out[f"anchors_ge_{t}_mean"] = float(count.mean())
        out[f"positives_with_best_rule_{t}_mean"] = float(((overlap >= t) | tied).sum(1).mean())
    return out


def size_summary(gt_boxes: np.ndarray) -> dict[str, float]:
    """Quantiles of sqrt(area) and of height/width of boxes [N, 4] (pixels)."""
    h = gt_boxes[:, 2] - gt_boxes[:, 0]
    w = gt_boxes[:, 3] - gt_boxes[:, 1]
    side = np.sqrt(h * w)
    q = (0.1, 0.25, 0.5, 0.75, 0.9)
    out = {f"sqrt_area_p{int(x * 100)}": float(np.quantile(side, x)) for x in q}
    out.update({f"h_over_w_p{int(x * 100)}": float(np.quantile(h / w, x)) for x in q})
    out["under_8px"] = float(np.mean(side < 8))
    out["under_16px"] = float(np.mean(side < 16))
    return out


def train_gt_boxes(config) -> tuple[np.ndarray, tuple[float, ...]]:
    """Every valid ground-truth box of the config's training split (eval-style resize and
    pad, no augmentation) and the config's aspect ratios."""
    from input_pipeline import maskrcnn_data
    from mlperf.maskrcnn.task import MaskRcnnTask

    task = MaskRcnnTask(config)
    train = task.prepare(shard_index=0, shard_count=1).coco.train
    examples = maskrcnn_data.EvalExamples(train, task.input_params())
    boxes = []
    for i in range(len(examples)):  # index: the record source ends by ValueError
        ex = examples[i]
        boxes.append(ex["gt_boxes"][ex["gt_classes"] > 0])
    return np.concatenate(boxes), tuple(config.model.aspect_ratios)


def main(argv: list[str]) -> None:
    config = CONFIG.value
    if config is None:
        usage_error("anchor_coverage: give --config, e.g. configs/maskrcnn.py:coco128")
    try:
        check_data_dir(config)
    except ConfigError as e:
        usage_error(f"anchor_coverage: {e}")
    gt, ratios = train_gt_boxes(config)
    size = (config.data.image_size, config.data.image_size)
    print(json.dumps({"sizes": size_summary(gt)}), flush=True)
    thresholds = [float(t) for t in _THRESHOLDS.value]
    for num_scales in (int(n) for n in _NUM_SCALES.value):
        for scale in (float(s) for s in _SCALES.value):
            # The model's levels: P2..P6 (strides 4..64).
            cfg = AnchorConfig(2, 6, num_scales, aspect_ratios=ratios, anchor_scale=scale)
            anchors = all_anchors(size, cfg)
            row = coverage(gt, anchors, thresholds)
            row.update(anchor_scale=scale, num_scales=num_scales, anchors=len(anchors))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    run(main, keep_memory=False)
