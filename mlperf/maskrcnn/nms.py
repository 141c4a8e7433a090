"""On-device, fixed-size proposal generation and detection selection.

Everything has static shapes: per-level top-k of RPN scores, decoding, greedy NMS over
a sorted fixed-size candidate list (a loop over candidates, each suppressing later ones
that overlap it; candidates of different groups, i.e. FPN levels or classes, never
suppress each other), then the top-k survivors. Invalid slots carry score -inf and a
`valid` flag of False.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from mlperf.maskrcnn import boxes as box_lib
from mlperf.maskrcnn.sampling import select_rows

NEG_INF = -1e9


def nms_keep(
    boxes: jax.Array, scores: jax.Array, groups: jax.Array, iou_threshold: float
) -> jax.Array:
    """Greedy NMS: keep mask [B, K] for boxes [B, K, 4] sorted by score (descending).

    A candidate is kept unless a kept, higher-scored candidate of the same group
    overlaps it by more than iou_threshold; slots with score <= NEG_INF are never kept.
    """
    k = boxes.shape[1]
    overlap = box_lib.iou(boxes, boxes)
    same = groups[:, :, None] == groups[:, None, :]
    later = jnp.arange(k)[None, :] > jnp.arange(k)[:, None]
    suppress = (overlap > iou_threshold) & same & later[None]  # [B, i, j]: i suppresses j
    keep = scores > NEG_INF / 2

    def body(i, keep):
        row = jax.lax.dynamic_index_in_dim(suppress, i, axis=1, keepdims=False)  # [B, K]
        alive = jax.lax.dynamic_index_in_dim(keep, i, axis=1, keepdims=True)  # [B, 1]
        return keep & ~(row & alive)

    return jax.lax.fori_loop(0, k, body, keep)


def _top_k_rows(scores, boxes, groups, k, einsum):
    top, idx = jax.lax.top_k(scores, k)
    return top, select_rows(boxes, idx, einsum), select_rows(groups, idx, einsum), idx


def generate_proposals(
    scores: Sequence[jax.Array],
    deltas: Sequence[jax.Array],
    anchors: Sequence[jax.Array],
    image_size: tuple[int, int],
    *,
    pre_nms_topk: int,
    post_nms_topk: int,
    iou_threshold: float = 0.7,
    min_size: float = 0.0,
    einsum: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """RPN outputs per level (scores [B, N_l], deltas [B, N_l, 4], anchors [N_l, 4]) ->
    proposals [B, post_nms_topk, 4] and their valid mask, with per-level NMS."""
    all_scores, all_boxes, all_groups = [], [], []
    for level, (s, d, a) in enumerate(zip(scores, deltas, anchors, strict=True)):
        k = min(pre_nms_topk, s.shape[1])
        top, idx = jax.lax.top_k(s, k)
        d_top = select_rows(d, idx, einsum)
        a_top = select_rows(jnp.broadcast_to(a, (s.shape[0], *a.shape)), idx, einsum)
        b = box_lib.clip_boxes(box_lib.decode(d_top, a_top, box_lib.RPN_WEIGHTS), *image_size)
        big = ((b[..., 2] - b[..., 0]) > min_size) & ((b[..., 3] - b[..., 1]) > min_size)
        all_scores.append(jnp.where(big, top, NEG_INF))
        all_boxes.append(b)
        all_groups.append(jnp.full(top.shape, level, jnp.int32))
    s = jnp.concatenate(all_scores, 1)
    b = jnp.concatenate(all_boxes, 1)
    g = jnp.concatenate(all_groups, 1)
    s, b, g, _ = _top_k_rows(s, b, g.astype(b.dtype), s.shape[1], einsum)  # sort
    keep = nms_keep(b, s, g, iou_threshold)
    s = jnp.where(keep, s, NEG_INF)
    k = min(post_nms_topk, s.shape[1])
    s, b, _, _ = _top_k_rows(s, b, g, k, einsum)
    return jax.lax.stop_gradient(b), s > NEG_INF / 2


def select_detections(
    class_scores: jax.Array,
    class_boxes: jax.Array,
    roi_valid: jax.Array,
    *,
    pre_nms_topk: int,
    max_detections: int,
    iou_threshold: float = 0.5,
    score_threshold: float = 0.05,
    einsum: bool = True,
) -> dict[str, jax.Array]:
    """Per-class NMS over the box head's outputs.

    class_scores [B, R, K] (foreground classes 1..K, background dropped), class_boxes
    [B, R, K, 4]. The best `pre_nms_topk` (ROI, class) pairs go through NMS grouped by
    class; the top `max_detections` survive: boxes, scores, classes (1..K), valid.
    """
    bsz, r, k = class_scores.shape
    ok = roi_valid[:, :, None] & (class_scores >= score_threshold)
    flat_scores = jnp.where(ok, class_scores, NEG_INF).reshape(bsz, r * k)
    flat_boxes = class_boxes.reshape(bsz, r * k, 4)
    flat_class = jnp.broadcast_to(jnp.arange(1, k + 1, dtype=flat_boxes.dtype), (bsz, r, k))
    flat_class = flat_class.reshape(bsz, r * k)
    n = min(pre_nms_topk, r * k)
    s, b, c, _ = _top_k_rows(flat_scores, flat_boxes, flat_class, n, einsum)
    keep = nms_keep(b, s, c, iou_threshold)
    s = jnp.where(keep, s, NEG_INF)
    d = min(max_detections, n)
    s, b, c, _ = _top_k_rows(s, b, c, d, einsum)
    valid = s > NEG_INF / 2
    return {
        "boxes": b,
        "scores": jnp.where(valid, s, 0.0),
        "classes": jnp.where(valid, jnp.round(c), 0).astype(jnp.int32),
        "valid": valid,
    }
