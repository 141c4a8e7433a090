"""Multilevel anchors, the box coder and box geometry for Mask R-CNN.

Boxes are [y1, x1, y2, x2] in padded-image pixels (the TF Mask R-CNN convention). The
box coder is the Faster R-CNN parameterisation: (dy, dx, dh, dw) scaled by per-stage
weights (1,1,1,1) for the RPN and (10,10,5,5) for the box head; decoding clamps the log
sizes so a wild regression cannot overflow exp.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

# exp(dh) is clamped at 1000/16 scale, as in Detectron / the MLPerf reference.
_MAX_LOG_SCALE = math.log(1000.0 / 16.0)
RPN_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
BOX_HEAD_WEIGHTS = (10.0, 10.0, 5.0, 5.0)


@dataclasses.dataclass(frozen=True)
class AnchorConfig:
    """Anchors at FPN levels min_level..max_level (stride 2**level)."""

    min_level: int = 2
    max_level: int = 6
    num_scales: int = 1
    aspect_ratios: tuple[float, ...] = (1.0, 2.0, 0.5)
    anchor_scale: float = 8.0  # base size = anchor_scale * stride

    @property
    def anchors_per_location(self) -> int:
        return self.num_scales * len(self.aspect_ratios)

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(range(self.min_level, self.max_level + 1))


def level_shapes(image_size: tuple[int, int], cfg: AnchorConfig) -> list[tuple[int, int]]:
    """Feature map (height, width) per level; the image must divide by the top stride."""
    h, w = image_size
    top = 2**cfg.max_level
    if h % top or w % top:
        raise ValueError(
            f"image size {image_size} must be a multiple of the largest stride {top} "
            f"(level {cfg.max_level}); pad images to a multiple of {top}."
        )
    return [(h // 2**lvl, w // 2**lvl) for lvl in cfg.levels]


def level_anchors(image_size: tuple[int, int], cfg: AnchorConfig) -> list[np.ndarray]:
    """Anchors per level, each [H_l * W_l * A, 4] in (row, col, anchor) order."""
    out = []
    for lvl, (fh, fw) in zip(cfg.levels, level_shapes(image_size, cfg), strict=True):
        stride = 2**lvl
        sizes = []
        for scale in range(cfg.num_scales):
            base = cfg.anchor_scale * stride * 2 ** (scale / cfg.num_scales)
            for ratio in cfg.aspect_ratios:
                # ratio = height / width at constant area base**2
                sizes.append((base * math.sqrt(ratio), base / math.sqrt(ratio)))
        hw = np.asarray(sizes, np.float32)  # [A, 2]
        cy = (np.arange(fh, dtype=np.float32) + 0.5) * stride
        cx = (np.arange(fw, dtype=np.float32) + 0.5) * stride
        cy, cx = np.meshgrid(cy, cx, indexing="ij")
        centers = np.stack([cy, cx], -1)[:, :, None, :]  # [H, W, 1, 2]
        half = hw[None, None] / 2
        boxes = np.concatenate([centers - half, centers + half], -1)  # [H, W, A, 4]
        out.append(boxes.reshape(-1, 4).astype(np.float32))
    return out


def all_anchors(image_size: tuple[int, int], cfg: AnchorConfig) -> np.ndarray:
    """Anchors of every level concatenated: [sum_l H_l W_l A, 4]."""
    return np.concatenate(level_anchors(image_size, cfg), axis=0)


def encode(boxes: jax.Array, anchors: jax.Array, weights: Sequence[float]) -> jax.Array:
    """Regression targets of `boxes` relative to `anchors` (same leading shape)."""
    wy, wx, wh, ww = weights
    ah = anchors[..., 2] - anchors[..., 0]
    aw = anchors[..., 3] - anchors[..., 1]
    acy = anchors[..., 0] + 0.5 * ah
    acx = anchors[..., 1] + 0.5 * aw
    bh = boxes[..., 2] - boxes[..., 0]
    bw = boxes[..., 3] - boxes[..., 1]
    bcy = boxes[..., 0] + 0.5 * bh
    bcx = boxes[..., 1] + 0.5 * bw
    ah, aw = jnp.maximum(ah, 1e-6), jnp.maximum(aw, 1e-6)
    bh, bw = jnp.maximum(bh, 1e-6), jnp.maximum(bw, 1e-6)
    return jnp.stack(
        [
            wy * (bcy - acy) / ah,
            wx * (bcx - acx) / aw,
            wh * jnp.log(bh / ah),
            ww * jnp.log(bw / aw),
        ],
        axis=-1,
    )


def decode(deltas: jax.Array, anchors: jax.Array, weights: Sequence[float]) -> jax.Array:
    """Boxes from regression `deltas` relative to `anchors` (inverse of `encode`)."""
    wy, wx, wh, ww = weights
    ah = anchors[..., 2] - anchors[..., 0]
    aw = anchors[..., 3] - anchors[..., 1]
    acy = anchors[..., 0] + 0.5 * ah
    acx = anchors[..., 1] + 0.5 * aw
    dy, dx = deltas[..., 0] / wy, deltas[..., 1] / wx
    dh = jnp.minimum(deltas[..., 2] / wh, _MAX_LOG_SCALE)
    dw = jnp.minimum(deltas[..., 3] / ww, _MAX_LOG_SCALE)
    cy, cx = dy * ah + acy, dx * aw + acx
    h, w = jnp.exp(dh) * ah, jnp.exp(dw) * aw
    return jnp.stack([cy - 0.5 * h, cx - 0.5 * w, cy + 0.5 * h, cx + 0.5 * w], axis=-1)


def clip_boxes(boxes: jax.Array, height: float, width: float) -> jax.Array:
    """Clips boxes to the image [0, height] x [0, width]."""
    lim = jnp.asarray([height, width, height, width], boxes.dtype)
    return jnp.clip(boxes, 0.0, lim)


def area(boxes: jax.Array) -> jax.Array:
    return jnp.maximum(boxes[..., 2] - boxes[..., 0], 0.0) * jnp.maximum(
        boxes[..., 3] - boxes[..., 1], 0.0
    )


def iou(a: jax.Array, b: jax.Array) -> jax.Array:
    """Pairwise IoU of a [..., N, 4] and b [..., M, 4] -> [..., N, M]."""
    a_, b_ = a[..., :, None, :], b[..., None, :, :]
    ih = jnp.maximum(jnp.minimum(a_[..., 2], b_[..., 2]) - jnp.maximum(a_[..., 0], b_[..., 0]), 0)
    iw = jnp.maximum(jnp.minimum(a_[..., 3], b_[..., 3]) - jnp.maximum(a_[..., 1], b_[..., 1]), 0)
    inter = ih * iw
    union = area(a)[..., :, None] + area(b)[..., None, :] - inter
    return inter / jnp.maximum(union, 1e-8)


def roi_levels(boxes: jax.Array, min_level: int, max_level: int, canonical: float = 224.0):
    """FPN level of each ROI: 4 + log2(sqrt(area) / 224), clipped (the FPN paper's rule)."""
    size = jnp.sqrt(jnp.maximum(area(boxes), 1e-6))
    level = jnp.floor(4.0 + jnp.log2(size / canonical + 1e-8))
    return jnp.clip(level, min_level, max_level).astype(jnp.int32)
