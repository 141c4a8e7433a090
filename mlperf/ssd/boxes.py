"""SSD default boxes, box matching and the (cx, cy, w, h) offset encoding.

Default boxes follow the MLPerf SSD300 reference: per feature level, two square boxes
(scale s_k and sqrt(s_k s_k+1)) plus a pair per extra aspect ratio, centred on each
cell; the six levels of a 300x300 input give 8732 boxes. Here the boxes of one cell
are adjacent (cell-major, then box), matching the NHWC heads' reshape.

Matching and encoding run on the hosts in NumPy (the input pipeline), decoding on
device in jnp. Offsets are scaled by 1/0.1 (centre) and 1/0.2 (size), as in MLPerf.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax.numpy as jnp
import numpy as np

SCALE_XY = 0.1
SCALE_WH = 0.2


@dataclasses.dataclass(frozen=True)
class AnchorConfig:
    """Default-box geometry. Sizes, steps and scales are in input pixels."""

    image_size: int = 300
    feature_sizes: tuple[int, ...] = (38, 19, 10, 5, 3, 1)
    steps: tuple[int, ...] = (8, 16, 32, 64, 100, 300)
    scales: tuple[int, ...] = (21, 45, 99, 153, 207, 261, 315)  # one more than levels
    aspect_ratios: tuple[tuple[int, ...], ...] = ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,))

    def __post_init__(self):
        n = len(self.feature_sizes)
        if not (len(self.steps) == len(self.aspect_ratios) == n and len(self.scales) == n + 1):
            raise ValueError(
                f"anchors: {n} feature sizes need {n} steps, {n} aspect-ratio sets and "
                f"{n + 1} scales; got {len(self.steps)}, {len(self.aspect_ratios)}, "
                f"{len(self.scales)}."
            )

    def boxes_per_cell(self) -> tuple[int, ...]:
        """Default boxes per feature-map cell at each level (2 + 2 per aspect ratio)."""
        return tuple(2 + 2 * len(r) for r in self.aspect_ratios)

    @property
    def num_boxes(self) -> int:
        cells = zip(self.feature_sizes, self.boxes_per_cell(), strict=True)
        return sum(f * f * a for f, a in cells)


def default_boxes(cfg: AnchorConfig) -> np.ndarray:
    """[A, 4] default boxes as (cx, cy, w, h) in [0, 1] (clipped as in the reference)."""
    out = []
    for level, size in enumerate(cfg.feature_sizes):
        sk1 = cfg.scales[level] / cfg.image_size
        sk2 = cfg.scales[level + 1] / cfg.image_size
        sk3 = math.sqrt(sk1 * sk2)
        shapes = [(sk1, sk1), (sk3, sk3)]
        for alpha in cfg.aspect_ratios[level]:
            w, h = sk1 * math.sqrt(alpha), sk1 / math.sqrt(alpha)
            shapes += [(w, h), (h, w)]
        fk = cfg.image_size / cfg.steps[level]
        for i, j in itertools.product(range(size), repeat=2):
            cx, cy = (j + 0.5) / fk, (i + 0.5) / fk
            out.extend((cx, cy, w, h) for w, h in shapes)
    return np.clip(np.asarray(out, np.float32), 0.0, 1.0)


def cxcywh_to_xyxy(b):
    """(cx, cy, w, h) -> (x0, y0, x1, y1); NumPy or jnp."""
    xp = jnp if isinstance(b, jnp.ndarray) else np
    return xp.concatenate([b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2], axis=-1)


def xyxy_to_cxcywh(b):
    """(x0, y0, x1, y1) -> (cx, cy, w, h); NumPy or jnp."""
    xp = jnp if isinstance(b, jnp.ndarray) else np
    return xp.concatenate([(b[..., :2] + b[..., 2:]) / 2, b[..., 2:] - b[..., :2]], axis=-1)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of boxes a [N, 4] and b [M, 4] (x0, y0, x1, y1) -> [N, M]."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=-1)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=-1)
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def encode_offsets(boxes_cxcywh: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """Regression targets of boxes relative to their default boxes."""
    xy = (boxes_cxcywh[:, :2] - anchors[:, :2]) / (SCALE_XY * anchors[:, 2:])
    wh = np.log(boxes_cxcywh[:, 2:] / anchors[:, 2:]) / SCALE_WH
    return np.concatenate([xy, wh], axis=-1).astype(np.float32)


def decode_offsets(offsets: jnp.ndarray, anchors: jnp.ndarray) -> jnp.ndarray:
    """Inverse of encode_offsets on device: [..., A, 4] offsets -> (x0, y0, x1, y1)."""
    xy = offsets[..., :2] * SCALE_XY * anchors[:, 2:] + anchors[:, :2]
    wh = jnp.exp(offsets[..., 2:] * SCALE_WH) * anchors[:, 2:]
    return cxcywh_to_xyxy(jnp.concatenate([xy, wh], axis=-1))


class BoxEncoder:
    """Matches ground-truth boxes to default boxes and encodes the targets (MLPerf rule:
    IoU > threshold, and every object keeps its best default box)."""

    def __init__(self, cfg: AnchorConfig, iou_threshold: float = 0.5):
        self.anchors = default_boxes(cfg)  # cx, cy, w, h
        self.anchors_xyxy = cxcywh_to_xyxy(self.anchors)
        self.iou_threshold = iou_threshold

    def encode(self, boxes_xyxy: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offsets [A, 4] float32, labels [A] int32; 0 = background)."""
        num = len(self.anchors)
        target = self.anchors.copy()
        out_labels = np.zeros(num, np.int32)
        if len(boxes_xyxy):
            ious = iou_matrix(np.asarray(boxes_xyxy, np.float32), self.anchors_xyxy)  # [G, A]
            best_iou = ious.max(axis=0)
            best_gt = ious.argmax(axis=0)
            # Every object claims its best default box, whatever the IoU.
            best_anchor = ious.argmax(axis=1)
            best_iou[best_anchor] = 2.0
            best_gt[best_anchor] = np.arange(len(boxes_xyxy))
            matched = best_iou > self.iou_threshold
            out_labels[matched] = np.asarray(labels)[best_gt[matched]]
            target[matched] = xyxy_to_cxcywh(np.asarray(boxes_xyxy, np.float32))[best_gt[matched]]
        return encode_offsets(target, self.anchors), out_labels


def to_pixel_xywh(boxes: np.ndarray, width: np.ndarray, height: np.ndarray) -> np.ndarray:
    """Normalised (x0, y0, x1, y1) boxes [..., D, 4] of images of `width` x `height`
    pixels ([...] each) -> (x, y, w, h) in those pixels, as COCO results give them."""
    size = np.stack([width, height], -1).astype(np.float32)[..., None, :]
    x0y0 = boxes[..., :2] * size
    wh = (boxes[..., 2:] - boxes[..., :2]) * size
    return np.concatenate([x0y0, wh], -1)
