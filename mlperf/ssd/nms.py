"""Batched, fixed-size non-maximum suppression on device (static shapes, per class).

Per image and class: the top `pre_nms` scores, their pairwise IoU, and a greedy pass
(a fori_loop over candidates in score order) that drops a box overlapping a kept,
higher-scoring one by more than the threshold. The survivors of all classes are merged
by score into `max_detections` slots; unused slots have score 0 and `valid` counts the
used ones. Everything is batched over images, so eval runs sharded on the mesh.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def pairwise_iou(boxes: jax.Array) -> jax.Array:
    """IoU of every pair in boxes [..., K, 4] (x0, y0, x1, y1) -> [..., K, K]."""
    lt = jnp.maximum(boxes[..., :, None, :2], boxes[..., None, :, :2])
    rb = jnp.minimum(boxes[..., :, None, 2:], boxes[..., None, :, 2:])
    inter = jnp.prod(jnp.clip(rb - lt, 0.0), axis=-1)
    area = jnp.prod(jnp.clip(boxes[..., 2:] - boxes[..., :2], 0.0), axis=-1)
    union = area[..., :, None] + area[..., None, :] - inter
    return inter / jnp.maximum(union, 1e-12)


def greedy_keep(iou: jax.Array, candidate: jax.Array, threshold: float) -> jax.Array:
    """Greedy NMS over candidates sorted by descending score.

    iou [..., K, K], candidate [..., K] bool -> keep [..., K] bool.
    """
    k = iou.shape[-1]
    order = jnp.arange(k)

    def body(i, keep):
        earlier = keep & (order < i)
        suppressed = jnp.any(earlier & (iou[..., :, i] > threshold), axis=-1)
        return keep.at[..., i].set(keep[..., i] & ~suppressed)

    return jax.lax.fori_loop(0, k, body, candidate)


def batched_nms(
    boxes: jax.Array,
    scores: jax.Array,
    *,
    pre_nms: int,
    max_detections: int,
    iou_threshold: float = 0.5,
    score_threshold: float = 0.05,
) -> dict[str, jax.Array]:
    """boxes [B, A, 4], scores [B, A, C] (class 0 = background, skipped) ->
    boxes [B, D, 4], scores [B, D], classes [B, D] (1..C-1), valid [B]."""
    b, num_anchors, c = scores.shape
    k = min(pre_nms, num_anchors)
    per_class = jnp.swapaxes(scores[..., 1:], 1, 2)  # [B, C-1, A]
    top_scores, top_idx = jax.lax.top_k(per_class, k)  # [B, C-1, K]
    cand = jnp.take_along_axis(boxes[:, None, :, :], top_idx[..., None], axis=2)  # [B,C-1,K,4]
    keep = greedy_keep(pairwise_iou(cand), top_scores > score_threshold, iou_threshold)
    kept_scores = jnp.where(keep, top_scores, 0.0).reshape(b, -1)
    d = min(max_detections, kept_scores.shape[1])
    out_scores, flat = jax.lax.top_k(kept_scores, d)
    out_boxes = jnp.take_along_axis(cand.reshape(b, -1, 4), flat[..., None], axis=1)
    classes = (flat // k + 1).astype(jnp.int32)
    valid = out_scores > 0.0
    return {
        "boxes": jnp.where(valid[..., None], out_boxes, 0.0),
        "scores": out_scores,
        "classes": jnp.where(valid, classes, 0),
        "valid": valid.sum(axis=1).astype(jnp.int32),
    }
