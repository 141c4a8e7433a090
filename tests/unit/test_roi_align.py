"""Multilevel ROIAlign: the einsum form equals the gather reference (values and
gradients), compiles without gather or scatter ops, and under spatial partitioning
all-reduces only crop-sized partial sums."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlperf.layers.conv import IMAGE_AXES
from mlperf.maskrcnn.roi_align import roi_align_einsum, roi_align_gather
from parallel.aot import hlo_op_stats
from parallel.mesh import build_mesh
from parallel.partition import Partitioner
from parallel.rules import SPATIAL_RULES

LEVELS = (2, 3, 4, 5)
IMAGE = 64


def _inputs(seed: int = 0, jitter: float = 0.0):
    rng = np.random.default_rng(seed)
    feats = [
        jnp.asarray(rng.normal(size=(2, IMAGE // 2**lvl, IMAGE // 2**lvl, 3)), jnp.float32)
        for lvl in LEVELS
    ]
    y1, x1 = rng.uniform(0, 50, (2, 2, 8))
    h, w = rng.uniform(2, 60, (2, 2, 8))
    boxes = np.stack([y1, x1, np.minimum(y1 + h, IMAGE), np.minimum(x1 + w, IMAGE)], -1)
    # One box per level for sure: sizes 8, 16, 32, 64 px with canonical size 16.
    boxes[0, :4] = [[0, 0, 8, 8], [4, 4, 20, 20], [10, 10, 42, 42], [0, 0, 64, 64]]
    # jitter > 0 moves those boxes off the integer grid: bilinear weights have kinks at
    # grid points, where the two forms pick different (equally valid) subgradients.
    boxes[0, :4] += jitter * np.asarray([1.0, 0.7, -0.6, -0.9])
    return feats, jnp.asarray(boxes, jnp.float32)


def _align(fn, feats, boxes):
    return fn(feats, boxes, LEVELS[0], 7, 2, 16.0)


def test_einsum_equals_gather_reference_values():
    feats, boxes = _inputs()
    a = jax.jit(lambda f, b: _align(roi_align_einsum, f, b))(feats, boxes)
    b = jax.jit(lambda f, b: _align(roi_align_gather, f, b))(feats, boxes)
    assert a.shape == (2, 8, 7, 7, 3)
    np.testing.assert_allclose(a, b, atol=1e-5)
    # Not trivially zero: each of the four level-specific boxes gets a crop.
    assert float(jnp.abs(a[0, :4]).mean(axis=(1, 2, 3)).min()) > 0.05


def test_einsum_equals_gather_reference_gradients():
    feats, boxes = _inputs(1, jitter=0.37)
    weights = jnp.asarray(np.random.default_rng(2).normal(size=(2, 8, 7, 7, 3)), jnp.float32)

    def loss(fn):
        return lambda f, b: jnp.sum(_align(fn, f, b) * weights)

    ga = jax.jit(jax.grad(loss(roi_align_einsum), argnums=(0, 1)))(feats, boxes)
    gb = jax.jit(jax.grad(loss(roi_align_gather), argnums=(0, 1)))(feats, boxes)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-4, rtol=1e-4)
    assert all(float(jnp.abs(g).sum()) > 0 for g in ga[0])  # every level gets gradient


def test_sample_clamping_matches_at_the_border():
    feats, _ = _inputs(3)
    edge = jnp.asarray([[[60.0, 60.0, 64.0, 64.0], [0.0, 0.0, 1.0, 1.0]]] * 2)
    a = jax.jit(lambda f, b: _align(roi_align_einsum, f, b))(feats, edge)
    b = jax.jit(lambda f, b: _align(roi_align_gather, f, b))(feats, edge)
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize(
    "fn, expect_gathers", [(roi_align_einsum, False), (roi_align_gather, True)]
)
def test_gather_free_compilation(fn, expect_gathers):
    feats, boxes = _inputs()
    step = jax.jit(jax.value_and_grad(lambda f, b: jnp.sum(_align(fn, f, b) ** 2)))
    hlo = step.lower(feats, boxes).compile().as_text()
    count = hlo_op_stats(hlo)["gather_scatter"]
    assert (count > 0) == expect_gathers, count


def test_spatial_partitioning_all_reduces_only_crops():
    """Height split 4 ways: same values and gradients as the gather reference, and only
    crop-sized all-reduces (contracting the height first would all-reduce a
    [B, R, 7, W, C] partial sum, W/7 = 4.6x the crops at the finest level here)."""
    feats, boxes = _inputs(4, jitter=0.37)
    # 128-pixel image so that every level's height (32 .. 4) splits 4 ways.
    feats = [jnp.tile(f, (1, 2, 2, 1)) for f in feats]
    boxes = boxes * 2.0
    weights = jnp.asarray(np.random.default_rng(5).normal(size=(2, 8, 7, 7, 3)), jnp.float32)

    def loss(fn):
        return lambda f, b: jnp.sum(_align(fn, f, b) * weights)

    part = Partitioner(build_mesh(("data", "model"), (2, 4)), rules=SPATIAL_RULES)
    feat_sharding = [part.sharding(part.spec(IMAGE_AXES))] * len(feats)
    step = part.jit(
        jax.value_and_grad(loss(roi_align_einsum), argnums=(0, 1)),
        in_shardings=(feat_sharding, part.sharding(part.spec(("batch", None, None)))),
    )
    compiled = step.lower(feats, boxes).compile()
    (val, grads) = compiled(feats, boxes)
    ref_val, ref_grads = jax.jit(jax.value_and_grad(loss(roi_align_gather), argnums=(0, 1)))(
        feats, boxes
    )
    np.testing.assert_allclose(val, ref_val, rtol=1e-5)
    for x, y in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-4, rtol=1e-4)
    # XLA combines all-reduces into tuples: check every reduced tensor on its own.
    reduced = [
        math.prod(int(d) for d in dims.split(",") if d)
        for line in compiled.as_text().splitlines()
        if re.search(r"= .* all-reduce(-start)?\(", line)
        for dims in re.findall(r"f32\[([\d,]*)\]", line.split(" all-reduce")[0])
    ]
    assert len(reduced) >= 4  # the height contractions do reduce over `model`
    # Per device: one level's crops [1, R, 7, 7, C], or the box gradient's finest width
    # weights [1, R, 7, W]; height-first would reduce [1, R, 7, W, C] (5,376 here).
    assert max(reduced) <= max(8 * 7 * 7 * 3, 8 * 7 * 32), sorted(reduced)[-4:]
