"""Host-side Mask R-CNN post-processing: detections back to original image pixels, mask
pasting by separable bilinear-weight einsums, and COCO results (boxes and RLE masks).

Pasting is the inverse of ROIAlign: every image pixel whose centre lies inside a
detection box samples the box's M x M mask bilinearly; the two interpolation matrices
Wy [H, M] and Wx [W, M] make it one einsum `Wy @ mask @ Wx^T` (no per-pixel lookups),
thresholded at 0.5. Masks are RLE-encoded with pycocotools.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlperf.coco_eval import CocoEvaluator


def _paste_weights(lo: np.ndarray, hi: np.ndarray, size: int, mask_size: int) -> np.ndarray:
    """[D, size, M] weights of image pixels 0..size-1 on each box's mask cells."""
    centres = np.arange(size, dtype=np.float32) + 0.5
    span = np.maximum(hi - lo, 1e-6)[:, None]
    cell = (centres[None, :] - lo[:, None]) / span * mask_size - 0.5
    inside = (centres[None, :] >= lo[:, None]) & (centres[None, :] <= hi[:, None])
    cell = np.clip(cell, 0.0, mask_size - 1.0)
    grid = np.arange(mask_size, dtype=np.float32)
    w = np.maximum(1.0 - np.abs(cell[..., None] - grid), 0.0)
    return w * inside[..., None]


def paste_masks(
    masks: np.ndarray, boxes: np.ndarray, height: int, width: int, threshold: float = 0.5
) -> np.ndarray:
    """masks [D, M, M] in [0, 1] over boxes [D, 4] (y1, x1, y2, x2 image pixels) ->
    binary full-image masks [D, height, width] (uint8)."""
    masks = np.asarray(masks, np.float32)
    boxes = np.asarray(boxes, np.float32)
    m = masks.shape[-1]
    wy = _paste_weights(boxes[:, 0], boxes[:, 2], height, m)
    wx = _paste_weights(boxes[:, 1], boxes[:, 3], width, m)
    pasted = np.einsum("dym,dmn,dxn->dyx", wy, masks, wx, optimize=True)
    return (pasted >= threshold).astype(np.uint8)


def image_boxes(boxes: np.ndarray, scale: float, height: int, width: int) -> np.ndarray:
    """Detection boxes [D, 4] (y1, x1, y2, x2 in resized-image pixels) in the original
    image's pixels: scaled back by 1/scale and clipped to the image."""
    b = np.asarray(boxes, np.float32) / float(scale)
    return np.clip(b, 0.0, [height, width, height, width])


def yxyx_to_xywh(boxes: np.ndarray) -> np.ndarray:
    """(y1, x1, y2, x2) boxes [D, 4] -> COCO's (x, y, w, h)."""
    b = boxes
    return np.stack([b[:, 1], b[:, 0], b[:, 3] - b[:, 1], b[:, 2] - b[:, 0]], 1)


def coco_results(
    evaluator: CocoEvaluator,
    image_ids: np.ndarray,
    scales: np.ndarray,
    boxes: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    valid: np.ndarray,
    masks: np.ndarray,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """COCO bbox and segm results of N images' fixed-size detections.

    boxes [N, D, 4] in resized-image pixels (y1, x1, y2, x2), scaled back by 1/scale;
    masks [N, D, M, M] pasted at each image's original size (from the ground truth).
    """
    box_res: list[dict[str, Any]] = []
    seg_res: list[dict[str, Any]] = []
    for i in range(len(image_ids)):
        keep = np.asarray(valid[i], bool)
        if not keep.any():
            continue
        image_id = int(image_ids[i])
        info = evaluator.gt.imgs[image_id]
        height, width = int(info["height"]), int(info["width"])
        b = image_boxes(boxes[i][keep], scales[i], height, width)
        ids = np.full(len(b), image_id)
        xywh = yxyx_to_xywh(b)
        box_res += evaluator.box_results(ids, xywh, scores[i][keep], classes[i][keep])
        pasted = paste_masks(masks[i][keep], b, height, width)
        seg_res += evaluator.mask_results(ids, pasted, scores[i][keep], classes[i][keep])
    return box_res, seg_res
