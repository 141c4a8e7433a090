"""Mask R-CNN building blocks in isolation: anchors, box coder, NMS, fixed-size sampling,
mask targets, mask pasting + RLE against pycocotools."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from mlperf.maskrcnn import boxes as box_lib
from mlperf.maskrcnn import sampling
from mlperf.maskrcnn.nms import nms_keep
from mlperf.maskrcnn.postprocess import paste_masks


# ---- anchors and box coder -------------------------------------------------------------
def test_anchor_counts_centres_and_shapes():
    cfg = box_lib.AnchorConfig(anchor_scale=8.0, aspect_ratios=(1.0, 2.0, 0.5))
    per_level = box_lib.level_anchors((128, 64), cfg)
    assert [len(a) for a in per_level] == [(128 // s) * (64 // s) * 3 for s in (4, 8, 16, 32, 64)]
    p2 = per_level[0].reshape(32, 16, 3, 4)
    centre = (p2[..., :2] + p2[..., 2:]) / 2
    np.testing.assert_allclose(centre[1, 2, 0], [6.0, 10.0])  # (row+0.5)*4, (col+0.5)*4
    hw = p2[0, 0, :, 2:] - p2[0, 0, :, :2]
    np.testing.assert_allclose(hw[0], [32.0, 32.0], rtol=1e-6)  # 8 x stride 4
    np.testing.assert_allclose(hw[1, 0] / hw[1, 1], 2.0, rtol=1e-5)  # ratio = h / w
    np.testing.assert_allclose(hw.prod(-1), 32.0**2, rtol=1e-5)  # constant area
    np.testing.assert_allclose(per_level[4][0, 2] - per_level[4][0, 0], 8.0 * 64)
    assert len(box_lib.all_anchors((128, 64), cfg)) == sum(len(a) for a in per_level)


def test_anchor_image_size_must_divide_the_top_stride():
    with pytest.raises(ValueError, match="multiple of the largest stride 64"):
        box_lib.level_anchors((100, 128), box_lib.AnchorConfig())


@pytest.mark.parametrize("weights", [box_lib.RPN_WEIGHTS, box_lib.BOX_HEAD_WEIGHTS])
def test_box_coder_round_trip(weights):
    rng = np.random.default_rng(0)
    anchors = rng.uniform(0, 50, (20, 2))
    anchors = jnp.asarray(np.concatenate([anchors, anchors + rng.uniform(4, 40, (20, 2))], 1))
    boxes = rng.uniform(0, 50, (20, 2))
    boxes = jnp.asarray(np.concatenate([boxes, boxes + rng.uniform(4, 40, (20, 2))], 1))
    deltas = box_lib.encode(boxes, anchors, weights)
    np.testing.assert_allclose(box_lib.decode(deltas, anchors, weights), boxes, atol=1e-3)
    zero = box_lib.decode(jnp.zeros_like(deltas), anchors, weights)
    np.testing.assert_allclose(zero, anchors, atol=1e-4)
    # A box twice the anchor's height, same centre: dh = log 2 x weight.
    a = jnp.asarray([[10.0, 10.0, 20.0, 20.0]])
    b = jnp.asarray([[5.0, 10.0, 25.0, 20.0]])
    np.testing.assert_allclose(
        box_lib.encode(b, a, weights)[0], [0, 0, weights[2] * np.log(2), 0], atol=1e-6
    )


def test_iou_and_roi_levels():
    a = jnp.asarray([[0.0, 0.0, 10.0, 10.0]])
    b = jnp.asarray([[0.0, 0.0, 10.0, 10.0], [5.0, 0.0, 15.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    np.testing.assert_allclose(box_lib.iou(a, b)[0], [1.0, 50 / 150, 0.0], rtol=1e-6)
    sizes = jnp.asarray([[0, 0, 56, 56], [0, 0, 224, 224], [0, 0, 900, 900], [0, 0, 4, 4.0]])
    np.testing.assert_array_equal(box_lib.roi_levels(sizes, 2, 5), [2, 4, 5, 2])


# ---- NMS -------------------------------------------------------------------------------
def _numpy_nms(boxes, scores, threshold):
    order = np.argsort(-scores)
    keep = []
    for i in order:
        if all(box_lib.iou(boxes[None, i], boxes[None, j])[0, 0] <= threshold for j in keep):
            keep.append(i)
    return sorted(keep)


def test_nms_matches_greedy_reference_and_respects_groups():
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 40, (30, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 20, (30, 2))], 1).astype(np.float32)
    scores = rng.uniform(0, 1, 30).astype(np.float32)
    order = np.argsort(-scores)
    b, s = jnp.asarray(boxes[order])[None], jnp.asarray(scores[order])[None]
    nms = jax.jit(nms_keep, static_argnums=3)
    keep = nms(b, s, jnp.zeros((1, 30), jnp.int32), 0.5)[0]
    kept = sorted(order[np.asarray(keep)].tolist())
    assert kept == _numpy_nms(boxes, scores, 0.5)
    assert 0 < len(kept) < 30
    # Two identical boxes: one survives in one group, both in different groups.
    same = jnp.asarray([[[0.0, 0, 10, 10], [0, 0, 10, 10]]])
    sc = jnp.asarray([[0.9, 0.8]])
    assert nms(same, sc, jnp.asarray([[0, 0]]), 0.5)[0].tolist() == [True, False]
    assert nms(same, sc, jnp.asarray([[0, 1]]), 0.5)[0].tolist() == [True, True]


# ---- sampling ----------------------------------------------------------------------------
def test_random_subset_takes_exact_counts():
    cand = jnp.asarray(np.random.default_rng(0).uniform(size=(3, 50)) < 0.4)
    count = jnp.asarray([5, 0, 1000])
    sub = sampling.random_subset(jax.random.key(0), cand, count)
    assert sub.sum(-1).tolist() == [5, 0, int(cand[2].sum())]
    assert not bool((sub & ~cand).any())


@pytest.mark.parametrize("num_gt", [1, 6])
def test_sample_rois_keeps_foreground_fraction(num_gt):
    rng = np.random.default_rng(num_gt)
    gt = np.zeros((2, 8, 4), np.float32)
    gt_xy = rng.uniform(0, 80, (2, num_gt, 2))
    gt[:, :num_gt] = np.concatenate([gt_xy, gt_xy + 30], -1)
    classes = np.zeros((2, 8), np.int32)
    classes[:, :num_gt] = rng.integers(1, 4, (2, num_gt))
    # Proposals: jittered ground truths (foreground) and random boxes (mostly background).
    jitter = np.repeat(gt[:, :num_gt], 20, axis=1) + rng.normal(0, 2, (2, 20 * num_gt, 4))
    xy = rng.uniform(0, 100, (2, 200, 2))
    props = np.concatenate([jitter, np.concatenate([xy, xy + 10], -1)], 1).astype(np.float32)
    sample = jax.jit(sampling.sample_rois, static_argnames=("num", "fg_fraction"))
    out = sample(
        jax.random.key(1),
        jnp.asarray(props),
        jnp.ones(props.shape[:2], bool),
        jnp.asarray(gt),
        jnp.asarray(classes),
        jnp.asarray(classes > 0),
        num=64,
        fg_fraction=0.25,
    )
    iou = np.asarray(box_lib.iou(jnp.asarray(np.concatenate([props, gt], 1)), jnp.asarray(gt)))
    iou = np.where(classes[:, None, :] > 0, iou, -1).max(-1)
    available = (iou >= 0.5).sum(-1)
    fg = np.asarray(out["fg"])
    assert fg.sum(-1).tolist() == np.minimum(available, 16).tolist()
    assert np.asarray(out["valid"]).all()  # enough background to fill every slot
    for i in range(2):  # foreground first, then background
        n = int(fg[i].sum())
        assert fg[i, :n].all() and not fg[i, n:].any()
    assert (np.asarray(out["classes"])[fg] > 0).all()
    assert (np.asarray(out["classes"])[~fg] == 0).all()
    roi_iou = np.asarray(box_lib.iou(out["rois"], jnp.asarray(gt))).max(-1)
    assert (roi_iou[fg] >= 0.5 - 1e-6).all() and (roi_iou[~fg] < 0.5).all()


def test_rpn_targets_label_best_anchor_and_sample_size():
    anchors = jnp.asarray(box_lib.all_anchors((64, 64), box_lib.AnchorConfig(anchor_scale=4.0)))
    gt = jnp.asarray([[[10.0, 10.0, 26.0, 26.0], [0, 0, 0, 0]]])
    targets = jax.jit(sampling.rpn_targets, static_argnames=("num",))
    t = targets(jax.random.key(0), anchors, gt, jnp.asarray([[True, False]]), num=32)
    assert 1 <= int(t["labels"].sum()) <= 16
    assert int(t["weights"].sum()) == 32
    best = int(jnp.argmax(box_lib.iou(anchors, gt[0, :1])[:, 0]))
    assert float(t["labels"][0, best]) == 1.0


def test_rpn_targets_thresholds_and_minimum_best_iou():
    """A 3 px box inside 16 px anchors ties at IoU ~0.035 with every anchor that contains
    it: the best-anchor rule makes all of them positive unless min_best_iou drops it;
    a lower pos_iou turns anchors between 0.5 and 0.7 positive."""
    cfg = box_lib.AnchorConfig(aspect_ratios=(1.0,), anchor_scale=4.0)
    anchors = jnp.asarray(box_lib.all_anchors((64, 64), cfg))
    tiny = jnp.asarray([[[30.0, 30.0, 33.0, 33.0]]])
    valid = jnp.asarray([[True]])
    targets = jax.jit(
        sampling.rpn_targets, static_argnames=("num", "pos_iou", "neg_iou", "min_best_iou")
    )
    loose = targets(jax.random.key(0), anchors, tiny, valid, num=64)
    assert int(loose["labels"].sum()) > 1  # several tied "best" anchors, all IoU < 0.1
    strict = targets(jax.random.key(0), anchors, tiny, valid, num=64, min_best_iou=0.3)
    assert int(strict["labels"].sum()) == 0
    assert int(strict["weights"].sum()) == 64  # its anchors are negatives now
    # A 20 px box: no 16 px anchor reaches 0.7, some reach 0.5.
    box = jnp.asarray([[[20.0, 20.0, 40.0, 40.0]]])
    overlap = np.asarray(box_lib.iou(anchors, box[0]))[:, 0]
    assert overlap.max() < 0.7 and (overlap >= 0.5).sum() > 1
    at_07 = targets(jax.random.key(0), anchors, box, valid, num=64, min_best_iou=0.3)
    at_05 = targets(jax.random.key(0), anchors, box, valid, num=64, pos_iou=0.5, min_best_iou=0.3)
    labels_05 = np.asarray(at_05["labels"])[0] > 0
    np.testing.assert_array_equal(labels_05, overlap >= 0.5)
    assert int(at_07["labels"].sum()) == int((overlap >= overlap.max() - 1e-6).sum())


def test_anchor_sizes_per_octave():
    cfg = box_lib.AnchorConfig(num_scales=2, aspect_ratios=(1.0,), anchor_scale=3.0)
    p2 = box_lib.level_anchors((64, 64), cfg)[0].reshape(16, 16, 2, 4)
    sides = p2[0, 0, :, 2] - p2[0, 0, :, 0]
    np.testing.assert_allclose(sides, [12.0, 12.0 * 2**0.5], rtol=1e-5)


def test_mask_targets_resample_the_matched_crop():
    m = 16
    crop = np.zeros((1, 2, m, m), np.float32)
    crop[0, 0, :, : m // 2] = 1.0  # left half of instance 0
    crop[0, 1] = 1.0
    gt = jnp.asarray([[[0.0, 0.0, 32.0, 32.0], [40.0, 40.0, 60.0, 60.0]]])
    rois = jnp.asarray([[[0.0, 0.0, 32.0, 32.0], [0.0, 0.0, 32.0, 16.0], [40.0, 40.0, 60.0, 60.0]]])
    matched = jnp.asarray([[[1.0, 0], [1.0, 0], [0, 1.0]]])
    t = np.asarray(sampling.mask_targets(rois, matched, gt, jnp.asarray(crop), 8))
    np.testing.assert_allclose(t[0, 0, :, :3], 1.0)
    np.testing.assert_allclose(t[0, 0, :, 5:], 0.0)
    np.testing.assert_allclose(t[0, 1], 1.0)  # the ROI is exactly the filled half
    np.testing.assert_allclose(t[0, 2, 1:-1, 1:-1], 1.0)


# ---- mask paste + RLE --------------------------------------------------------------------
def test_paste_of_a_full_mask_is_the_box_and_rle_round_trips():
    box = np.asarray([[10.0, 20.0, 30.0, 50.0]])  # y1, x1, y2, x2
    pasted = paste_masks(np.ones((1, 28, 28), np.float32), box, 48, 64)[0]
    expected = np.zeros((48, 64), np.uint8)
    expected[10:30, 20:50] = 1
    np.testing.assert_array_equal(pasted, expected)
    rle = mask_utils.encode(np.asfortranarray(pasted))
    np.testing.assert_array_equal(mask_utils.decode(rle), pasted)
    assert int(mask_utils.area(rle)) == 20 * 30
    # pycocotools' own rasterisation of the same box as a polygon agrees.
    poly = [[20, 10, 50, 10, 50, 30, 20, 30]]
    ref = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(poly, 48, 64)))
    assert (
        float(
            mask_utils.iou([rle], [mask_utils.merge(mask_utils.frPyObjects(poly, 48, 64))], [0])[
                0, 0
            ]
        )
        > 0.9
    )
    assert abs(int(ref.sum()) - 600) <= 60


def test_paste_scales_a_shape_into_its_box():
    m = np.zeros((1, 28, 28), np.float32)
    m[0, :, :14] = 1.0  # left half
    pasted = paste_masks(m, np.asarray([[0.0, 0.0, 40.0, 40.0]]), 40, 60)[0]
    assert pasted[:, :19].all() and not pasted[:, 21:].any()
    assert abs(int(pasted.sum()) - 800) <= 40
