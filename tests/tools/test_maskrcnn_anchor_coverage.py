"""The anchor coverage diagnostic's numbers on hand-made boxes."""

from __future__ import annotations

import numpy as np

from launch.bench.anchor_coverage import coverage, size_summary


def test_coverage_counts_anchors_per_threshold_and_ties():
    anchors = np.asarray([[0, 0, 10, 10], [0, 0, 10, 20], [50, 50, 60, 60]], np.float32)
    gt = np.asarray([[0, 0, 10, 10], [52, 52, 54, 54]], np.float32)
    out = coverage(gt, anchors, (0.7, 0.5))
    assert out["gt_boxes"] == 2
    assert out["no_anchor_ge_0.7"] == 0.5  # the 2 px box reaches IoU 0.04 only
    assert out["anchors_ge_0.5_mean"] == 1.0  # (2 + 0) / 2: IoU 0.5 counts
    # The best-anchor rule gives the 2 px box its one best anchor as a positive.
    assert out["positives_with_best_rule_0.7_mean"] == 1.0
    np.testing.assert_allclose(out["best_iou_mean"], (1.0 + 0.04) / 2, rtol=1e-5)


def test_size_summary():
    gt = np.asarray([[0, 0, 4, 4], [0, 0, 20, 10], [0, 0, 40, 40]], np.float32)
    out = size_summary(gt)
    assert out["under_8px"] == 1 / 3 and out["under_16px"] == 2 / 3
    np.testing.assert_allclose(out["sqrt_area_p50"], np.sqrt(200.0), rtol=1e-6)
    np.testing.assert_allclose(out["h_over_w_p50"], 1.0)
