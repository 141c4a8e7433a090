"""Multilevel ROIAlign as bilinear-weight einsums (no gather), and a gather reference.

ROIAlign samples each output bin at `sampling` x `sampling` points and averages their
bilinear interpolations. Bilinear interpolation and the bin average are both separable,
so a whole crop is two small weight matrices per ROI, Wy [out, H] and Wx [out, W], and
the crop is `Wy @ F @ Wx^T` per channel, per FPN level, with the ROI's level folded into
Wy as a 0/1 factor; F @ Wx^T is contracted first (see roi_align_einsum for why). This
is the TPU form of the paper: MXU matmuls instead of gathers (which TPUs execute slowly
and which the partitioner cannot split). `roi_align_gather` is the textbook four-corner
version for testing equality.

Coordinates follow the "aligned" convention: a pixel's centre is at index + 0.5, so a
box [y1, x1, y2, x2] in image pixels maps to y / stride - 0.5 in feature cells. Sample
points are clamped to the feature map, identically in both versions.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from mlperf.maskrcnn.boxes import roi_levels
from parallel.partition import constrain


def sample_coords(lo: jax.Array, hi: jax.Array, out_size: int, sampling: int) -> jax.Array:
    """Sample positions [..., out_size, sampling] spread evenly over the bins of [lo, hi]."""
    bin_size = (hi - lo) / out_size
    frac = (
        jnp.arange(out_size)[:, None] + (jnp.arange(sampling)[None, :] + 0.5) / sampling
    ).astype(lo.dtype)
    return lo[..., None, None] + bin_size[..., None, None] * frac


def bilinear_weights(coords: jax.Array, size: int, clamp: bool = True) -> jax.Array:
    """Interpolation weights [..., size] of positions `coords` [...] on a grid 0..size-1.

    clamp=True pins positions to the grid (ROIAlign); clamp=False gives zero weight to
    positions more than one cell outside (mask crops, where outside means background).
    """
    if clamp:
        coords = jnp.clip(coords, 0.0, size - 1.0)
    grid = jnp.arange(size, dtype=coords.dtype)
    return jax.nn.relu(1.0 - jnp.abs(coords[..., None] - grid))


def _axis_weights(
    lo: jax.Array, hi: jax.Array, stride: float, size: int, out_size: int, sampling: int
) -> jax.Array:
    """Bin-averaged weights [B, R, out_size, size] along one image axis."""
    coords = sample_coords(lo / stride - 0.5, hi / stride - 0.5, out_size, sampling)
    return bilinear_weights(coords, size).mean(axis=-2)


def roi_align_einsum(
    features: Sequence[jax.Array],
    boxes: jax.Array,
    min_level: int,
    out_size: int,
    sampling: int = 2,
    canonical_size: float = 224.0,
) -> jax.Array:
    """Multilevel ROIAlign: features[i] [B, H_i, W_i, C] at level min_level + i (stride
    2**level), boxes [B, R, 4] in image pixels -> [B, R, out_size, out_size, C]."""
    max_level = min_level + len(features) - 1
    levels = roi_levels(boxes, min_level, max_level, canonical_size)
    out = None
    for i, feat in enumerate(features):
        stride = float(2 ** (min_level + i))
        _, h, w, _ = feat.shape
        on_level = (levels == min_level + i).astype(feat.dtype)[..., None, None]
        wy = _axis_weights(boxes[..., 0], boxes[..., 2], stride, h, out_size, sampling)
        wx = _axis_weights(boxes[..., 1], boxes[..., 3], stride, w, out_size, sampling)
        wy = (wy * on_level).astype(feat.dtype)
        # Width first, height last: with the height split over devices (spatial
        # partitioning) the height contraction ends in an all-reduce of its partial sums,
        # so it must produce the small [B, R, out, out, C] crop. Contracting height first
        # all-reduces a [B, R, out, W, C] intermediate (W/out times larger, same FLOPs).
        rows = jnp.einsum("bhwc,brqw->bhrqc", feat, wx.astype(feat.dtype))
        rows = constrain(rows, ("batch", "height", None, None, "channels"))
        crop = jnp.einsum("brph,bhrqc->brpqc", wy, rows)
        out = crop if out is None else out + crop
    return out


def _bilinear_gather(feat: jax.Array, y: jax.Array, x: jax.Array) -> jax.Array:
    """feat [H, W, C] interpolated at points y, x [...] with four gathers -> [..., C]."""
    h, w, _ = feat.shape
    y = jnp.clip(y, 0.0, h - 1.0)
    x = jnp.clip(x, 0.0, w - 1.0)
    y0 = jnp.floor(y).astype(jnp.int32)
    x0 = jnp.floor(x).astype(jnp.int32)
    y1 = jnp.minimum(y0 + 1, h - 1)
    x1 = jnp.minimum(x0 + 1, w - 1)
    ly = (y - y0)[..., None]
    lx = (x - x0)[..., None]
    return (
        feat[y0, x0] * (1 - ly) * (1 - lx)
        + feat[y0, x1] * (1 - ly) * lx
        + feat[y1, x0] * ly * (1 - lx)
        + feat[y1, x1] * ly * lx
    )


def roi_align_gather(
    features: Sequence[jax.Array],
    boxes: jax.Array,
    min_level: int,
    out_size: int,
    sampling: int = 2,
    canonical_size: float = 224.0,
) -> jax.Array:
    """Reference ROIAlign with gathers; same signature and result as roi_align_einsum."""
    max_level = min_level + len(features) - 1
    levels = roi_levels(boxes, min_level, max_level, canonical_size)
    out = None
    for i, feat in enumerate(features):
        stride = float(2 ** (min_level + i))
        ys = sample_coords(
            boxes[..., 0] / stride - 0.5, boxes[..., 2] / stride - 0.5, out_size, sampling
        )
        xs = sample_coords(
            boxes[..., 1] / stride - 0.5, boxes[..., 3] / stride - 0.5, out_size, sampling
        )
        # Full grid of sample points per ROI: [B, R, O, S, O, S].
        yy = ys[..., :, :, None, None] + 0 * xs[..., None, None, :, :]
        xx = xs[..., None, None, :, :] + 0 * ys[..., :, :, None, None]
        vals = jax.vmap(_bilinear_gather)(feat, yy, xx)  # [B, R, O, S, O, S, C]
        crop = vals.mean(axis=(3, 5))
        on_level = (levels == min_level + i).astype(crop.dtype)[..., None, None, None]
        crop = crop * on_level
        out = crop if out is None else out + crop
    return out
