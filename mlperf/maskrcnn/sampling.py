"""Static-shape training targets: anchor labels for the RPN, fixed-size ROI sampling with a
foreground fraction, box and mask targets, all without gathers on the einsum path.

TPUs need static shapes, so every image yields exactly `num` sampled ROIs: foreground
first (at most `fg_fraction * num`), then background, then invalid padding slots with
zero weight. Random subsets are picked by thresholding random keys at their n-th largest
value (a sort, no data-dependent indexing); row selection is a one-hot einsum when
`einsum` is on (the paper's rewrite), `take_along_axis` otherwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mlperf.maskrcnn import boxes as box_lib
from mlperf.maskrcnn.roi_align import bilinear_weights, sample_coords


def select_rows(x: jax.Array, idx: jax.Array, einsum: bool) -> jax.Array:
    """x [B, N, ...] rows at idx [B, K] -> [B, K, ...]: one-hot matmul or gather."""
    if einsum:
        onehot = jax.nn.one_hot(idx, x.shape[1], dtype=x.dtype)
        return jnp.einsum("bkn,bn...->bk...", onehot, x)
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def random_subset(key: jax.Array, candidates: jax.Array, count: jax.Array) -> jax.Array:
    """A uniformly random subset of `count` [B] of the True entries of candidates [B, N]
    (all of them when fewer): random keys thresholded at their count-th largest."""
    n = candidates.shape[-1]
    keys = jnp.where(candidates, jax.random.uniform(key, candidates.shape), -1.0)
    ordered = -jnp.sort(-keys, axis=-1)
    count = jnp.minimum(count, candidates.sum(-1))
    # The count-th largest key, read with a one-hot sum (a vmapped dynamic index gathers).
    pick = jnp.arange(n)[None, :] == (count[:, None] - 1)
    threshold = jnp.sum(jnp.where(pick, ordered, 0.0), axis=-1, keepdims=True)
    return candidates & (keys >= threshold) & (count[:, None] > 0)


def sample_balanced(
    key: jax.Array, positive: jax.Array, negative: jax.Array, num: int, fraction: float
) -> tuple[jax.Array, jax.Array]:
    """Masks of sampled positives (at most fraction*num) and negatives (the rest of num)."""
    k_pos, k_neg = jax.random.split(key)
    batch = positive.shape[0]
    max_pos = jnp.full((batch,), int(round(num * fraction)), jnp.int32)
    pos = random_subset(k_pos, positive, max_pos)
    neg = random_subset(k_neg, negative & ~positive, num - pos.sum(-1).astype(jnp.int32))
    return pos, neg


def _masked_iou(a: jax.Array, gt_boxes: jax.Array, gt_valid: jax.Array) -> jax.Array:
    """IoU [B, N, G] with padding ground truths at -1 (never matched)."""
    return jnp.where(gt_valid[:, None, :], box_lib.iou(a, gt_boxes), -1.0)


def rpn_targets(
    key: jax.Array,
    anchors: jax.Array,
    gt_boxes: jax.Array,
    gt_valid: jax.Array,
    *,
    num: int,
    fraction: float = 0.5,
    pos_iou: float = 0.7,
    neg_iou: float = 0.3,
    min_best_iou: float = 0.0,
) -> dict[str, jax.Array]:
    """Objectness labels and box targets for anchors [A, 4] against gt [B, G, 4].

    Positive: IoU >= pos_iou, or the best anchor (ties included) of a ground truth whose
    best IoU is at least min_best_iou; negative: IoU < neg_iou. `num` anchors per image
    are sampled (half positive at most). min_best_iou > 0 keeps a box far smaller than
    every anchor from making positives of all the anchors that contain it (they tie at
    a tiny IoU).
    """
    batch = gt_boxes.shape[0]
    anchors_b = jnp.broadcast_to(anchors, (batch, *anchors.shape))
    overlap = _masked_iou(anchors_b, gt_boxes, gt_valid)  # [B, A, G]
    best_iou = overlap.max(-1)
    best_for_gt = overlap.max(1, keepdims=True)  # [B, 1, G]
    good = (best_for_gt > 0.0) & (best_for_gt >= min_best_iou)
    is_best = jnp.any((overlap >= best_for_gt - 1e-6) & good, axis=-1)
    positive = (best_iou >= pos_iou) | is_best
    negative = (best_iou < neg_iou) & (best_iou >= 0.0)
    pos, neg = sample_balanced(key, positive, negative, num, fraction)
    matched = jax.nn.one_hot(jnp.argmax(overlap, -1), gt_boxes.shape[1], dtype=gt_boxes.dtype)
    matched_boxes = jnp.einsum("bag,bgd->bad", matched, gt_boxes)
    return {
        "labels": pos.astype(jnp.float32),
        "weights": (pos | neg).astype(jnp.float32),
        "box_targets": box_lib.encode(matched_boxes, anchors_b, box_lib.RPN_WEIGHTS),
        "box_weights": pos.astype(jnp.float32),
    }


def sample_rois(
    key: jax.Array,
    proposals: jax.Array,
    proposal_valid: jax.Array,
    gt_boxes: jax.Array,
    gt_classes: jax.Array,
    gt_valid: jax.Array,
    *,
    num: int,
    fg_fraction: float = 0.25,
    fg_iou: float = 0.5,
    einsum: bool = True,
) -> dict[str, jax.Array]:
    """`num` ROIs per image from proposals [B, P, 4] plus the ground truths themselves.

    Returns rois [B, num, 4], classes [B, num] (0 = background), box_targets [B, num, 4]
    (class-agnostic deltas, box-head weights), matched [B, num, G] one-hot ground truth,
    foreground / valid masks [B, num].
    """
    cand = jnp.concatenate([proposals, gt_boxes], axis=1)
    cand_valid = jnp.concatenate([proposal_valid, gt_valid], axis=1)
    overlap = _masked_iou(cand, gt_boxes, gt_valid)
    best_iou = overlap.max(-1)
    fg = cand_valid & (best_iou >= fg_iou)
    bg = cand_valid & (best_iou < fg_iou)
    fg_sel, bg_sel = sample_balanced(key, fg, bg, num, fg_fraction)
    # Order: sampled foreground, then background, then anything else (weight 0).
    rank = fg_sel * 2.0 + bg_sel * 1.0 + 1e-3 * jnp.linspace(1.0, 0.0, cand.shape[1])
    _, idx = jax.lax.top_k(rank, num)
    rois = select_rows(cand, idx, einsum)
    is_fg = select_rows(fg_sel.astype(jnp.float32), idx, einsum) > 0.5
    valid = select_rows((fg_sel | bg_sel).astype(jnp.float32), idx, einsum) > 0.5
    matched_all = jax.nn.one_hot(jnp.argmax(overlap, -1), gt_boxes.shape[1], dtype=cand.dtype)
    matched = select_rows(matched_all, idx, einsum)
    matched_boxes = jnp.einsum("brg,bgd->brd", matched, gt_boxes)
    matched_class = jnp.einsum("brg,bg->br", matched, gt_classes.astype(cand.dtype))
    classes = jnp.where(is_fg, jnp.round(matched_class).astype(jnp.int32), 0)
    return {
        "rois": jax.lax.stop_gradient(rois),
        "classes": classes,
        "box_targets": box_lib.encode(matched_boxes, rois, box_lib.BOX_HEAD_WEIGHTS),
        "matched": matched,
        "fg": is_fg,
        "valid": valid,
    }


def mask_targets(
    rois: jax.Array,
    matched: jax.Array,
    gt_boxes: jax.Array,
    gt_masks: jax.Array,
    out_size: int,
) -> jax.Array:
    """Mask targets [B, R, out, out] in [0, 1]: each ROI's matched ground-truth mask,
    resampled from its box crop gt_masks [B, G, M, M] onto the ROI's out x out grid.

    All by einsum: the one-hot match picks the mask and box, and separable bilinear
    weights (zero outside the ground-truth box) resample it.
    """
    m = gt_masks.shape[-1]
    gt = jnp.einsum("brg,bgd->brd", matched, gt_boxes)
    mask = jnp.einsum("brg,bgyx->bryx", matched, gt_masks.astype(rois.dtype))

    def weights(lo, hi, glo, ghi):
        points = sample_coords(lo, hi, out_size, 1)[..., 0]  # [B, R, out] image pixels
        span = jnp.maximum(ghi - glo, 1e-6)[..., None]
        cell = (points - glo[..., None]) / span * m - 0.5
        return bilinear_weights(cell, m, clamp=False)

    wy = weights(rois[..., 0], rois[..., 2], gt[..., 0], gt[..., 2])
    wx = weights(rois[..., 1], rois[..., 3], gt[..., 1], gt[..., 3])
    return jnp.clip(jnp.einsum("brpy,bryx,brqx->brpq", wy, mask, wx), 0.0, 1.0)
