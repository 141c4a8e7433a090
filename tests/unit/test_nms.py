"""Batched fixed-size NMS on device against a plain NumPy greedy NMS."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from mlperf.ssd.nms import batched_nms


def _iou(a, b):
    lt = np.maximum(a[:2], b[:2])
    rb = np.minimum(a[2:], b[2:])
    inter = np.prod(np.clip(rb - lt, 0, None))
    union = np.prod(a[2:] - a[:2]) + np.prod(b[2:] - b[:2]) - inter
    return inter / union


def nms_reference(boxes, scores, pre_nms, max_det, iou_thr, score_thr):
    """Per class: top pre_nms by score, greedy suppression; merge classes by score."""
    dets = []
    for c in range(1, scores.shape[1]):
        order = np.argsort(-scores[:, c], kind="stable")[:pre_nms]
        keep = []
        for i in order:
            if scores[i, c] <= score_thr:
                continue
            if all(_iou(boxes[i], boxes[j]) <= iou_thr for j in keep):
                keep.append(i)
        dets += [(scores[i, c], c, tuple(boxes[i])) for i in keep]
    dets.sort(key=lambda d: -d[0])
    return dets[:max_det]


def _random_case(seed, anchors=60, classes=4, batch=3):
    rng = np.random.default_rng(seed)
    # Clustered boxes so that suppression really happens.
    centres = rng.uniform(0.2, 0.8, (batch, 6, 2))
    pick = rng.integers(0, 6, (batch, anchors))
    c = np.take_along_axis(centres, pick[..., None], axis=1) + rng.normal(
        0, 0.03, (batch, anchors, 2)
    )
    sizes = rng.uniform(0.1, 0.3, (batch, 6, 2))
    wh = np.take_along_axis(sizes, pick[..., None], axis=1) * rng.uniform(
        0.9, 1.1, (batch, anchors, 2)
    )
    boxes = np.concatenate([c - wh / 2, c + wh / 2], -1).astype(np.float32)
    logits = rng.normal(0, 2, (batch, anchors, classes))
    scores = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return boxes, scores.astype(np.float32)


@pytest.mark.parametrize(
    "seed,pre_nms,max_det,thr", [(0, 20, 15, 0.5), (1, 60, 100, 0.3), (2, 8, 5, 0.6)]
)
def test_batched_nms_matches_numpy_reference(seed, pre_nms, max_det, thr):
    boxes, scores = _random_case(seed)
    out = jax.jit(
        lambda b, s: batched_nms(
            b, s, pre_nms=pre_nms, max_detections=max_det, iou_threshold=thr, score_threshold=0.05
        )
    )(boxes, scores)
    out = jax.tree.map(np.asarray, out)
    suppressed_any = False
    for i in range(len(boxes)):
        ref = nms_reference(boxes[i], scores[i], pre_nms, max_det, thr, 0.05)
        n = int(out["valid"][i])
        assert n == len(ref)
        np.testing.assert_allclose(out["scores"][i, :n], [d[0] for d in ref], rtol=1e-6)
        np.testing.assert_array_equal(out["classes"][i, :n], [d[1] for d in ref])
        np.testing.assert_allclose(out["boxes"][i, :n], [d[2] for d in ref], rtol=1e-6)
        # Unused slots are empty.
        assert np.all(out["scores"][i, n:] == 0) and np.all(out["classes"][i, n:] == 0)
        kept = nms_reference(boxes[i], scores[i], pre_nms, 10**6, thr, 0.05)
        everything = nms_reference(boxes[i], scores[i], pre_nms, 10**6, 1.01, 0.05)
        suppressed_any |= len(kept) < len(everything)
    assert suppressed_any


def test_overlapping_boxes_of_one_class_are_suppressed():
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 0.95, 1], [2, 2, 3, 3]]], np.float32)
    scores = np.array([[[0.1, 0.9], [0.2, 0.8], [0.3, 0.7]]], np.float32)
    out = batched_nms(boxes, scores, pre_nms=3, max_detections=3, iou_threshold=0.5)
    assert int(out["valid"][0]) == 2
    np.testing.assert_allclose(out["scores"][0], [0.9, 0.7, 0.0])
