"""How well the RPN's anchors cover a config's ground-truth boxes, for several anchor
settings (mlperf/maskrcnn/anchor_coverage.py): one JSON line of box sizes, then one per
(num_scales, anchor_scale).

    python -m launch.maskrcnn_anchor_coverage --config configs/maskrcnn.py:coco128 \\
        --config.data.data_dir=DIR
"""

from __future__ import annotations

import json

from absl import app, flags
from ml_collections import config_flags

from mlperf.maskrcnn.anchor_coverage import coverage, size_summary, train_gt_boxes
from mlperf.maskrcnn.boxes import AnchorConfig, all_anchors
from mlperf.validate import ConfigError, check_data_dir

_CONFIG = config_flags.DEFINE_config_file("config", None, "A Mask R-CNN config.")
_SCALES = flags.DEFINE_list("anchor_scales", ["2", "3", "4", "6", "8"], "anchor_scale values.")
_THRESHOLDS = flags.DEFINE_list("pos_iou", ["0.7", "0.5"], "RPN positive IoU thresholds.")
_NUM_SCALES = flags.DEFINE_list("num_scales", ["1", "2"], "Anchor sizes per octave.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    try:
        check_data_dir(config)
    except ConfigError as e:
        raise SystemExit(f"maskrcnn_anchor_coverage: {e}") from None
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
    app.run(main)
