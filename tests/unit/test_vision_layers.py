"""Shared vision blocks: conv, batch norm with cross-replica groups, ResNet backbones."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from mlperf.layers.conv import BatchNorm, Conv, constrain_image
from mlperf.layers.resnet import ResNet, resnet34, resnet50
from parallel.mesh import build_mesh
from parallel.partition import Partitioner
from parallel.rules import SPATIAL_RULES


def _images(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(2.0, 3.0, shape), jnp.float32)


def test_conv_same_padding_and_stride():
    conv = Conv(3, 5, 3, strides=2, rngs=nnx.Rngs(0))
    y = conv(_images((2, 9, 9, 3)))
    assert y.shape == (2, 5, 5, 5)
    assert conv.kernel[...].shape == (3, 3, 3, 5)


def test_stride_by_slicing_equals_the_strided_conv_and_partitions_correctly(devices):
    """The sliced form gives the strided conv's outputs, and on a 1x8 height split of an
    8-row map (one row per shard) its kernel gradient equals the unpartitioned one (the
    plain stride-2 conv's does not under XLA's SPMD partitioner, jax 0.10)."""
    x = _images((8, 8, 8, 16), seed=2)
    strided = Conv(16, 16, 3, strides=2, rngs=nnx.Rngs(0))
    sliced = Conv(16, 16, 3, strides=2, rngs=nnx.Rngs(0), stride_by_slicing=True)
    np.testing.assert_allclose(sliced(x), strided(x), rtol=1e-5, atol=1e-5)

    graphdef, params = nnx.split(sliced)

    def loss(p, images):
        return jnp.sum(jnp.sin(nnx.merge(graphdef, p)(constrain_image(images))))

    expected = jax.grad(loss)(params, x)
    mesh = build_mesh(("data", "model"), (1, 8), (1, 1), devices)
    partitioner = Partitioner(mesh, rules=SPATIAL_RULES)
    got = partitioner.jit(jax.grad(loss))(params, x)
    np.testing.assert_allclose(got["kernel"][...], expected["kernel"][...], rtol=1e-4, atol=1e-4)


def test_batchnorm_global_and_grouped_statistics():
    x = _images((8, 4, 4, 3))
    bn = BatchNorm(3, rngs=nnx.Rngs(0))
    y = bn(x, train=True)
    np.testing.assert_allclose(np.mean(y, axis=(0, 1, 2)), 0.0, atol=1e-5)
    np.testing.assert_allclose(np.var(y, axis=(0, 1, 2)), 1.0, atol=1e-3)
    # Running statistics moved 10% of the way towards the batch statistics.
    np.testing.assert_allclose(bn.mean[...], 0.1 * np.mean(x, axis=(0, 1, 2)), rtol=1e-5)
    grouped = BatchNorm(3, rngs=nnx.Rngs(0), group_size=2)
    yg = np.asarray(grouped(x, train=True)).reshape(4, 2, 4, 4, 3)
    np.testing.assert_allclose(yg.mean(axis=(1, 2, 3)), 0.0, atol=1e-5)
    np.testing.assert_allclose(yg.var(axis=(1, 2, 3)), 1.0, atol=1e-3)
    # Eval mode uses the running statistics, not the batch.
    ye = bn(x, train=False)
    expected = (x - bn.mean[...]) / np.sqrt(bn.var[...] + 1e-5)
    np.testing.assert_allclose(ye, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("replicas", "group_size"), [(8, 0), (8, 2), (8, 4), (8, 8), (8, 16), (6, 6)]
)
def test_cross_replica_groups_in_per_replica_step_equal_global_view(devices, replicas, group_size):
    """Inside a shard_map manual over `data` (how the train step runs), groups spanning
    several replicas (2 and 4 replicas: exchanges with a partner; 3: shifts around the
    group) give the outputs and input gradients of the global-batch reshape."""
    mesh = build_mesh(("data", "model"), (replicas, 1), (1, 1), devices[:replicas])
    partitioner = Partitioner(mesh)
    x = _images((2 * replicas, 4, 4, 3), seed=1)  # 2 rows per replica
    bn = BatchNorm(3, rngs=nnx.Rngs(0), group_size=group_size)
    graphdef, state = nnx.split(bn)

    def global_loss(xs, st):
        return jnp.sum(jnp.sin(nnx.merge(graphdef, st)(xs, train=True)))

    def per_replica(xs, st):
        with partitioner.manual_over("data"):
            return nnx.merge(graphdef, st)(xs, train=True)

    fn = jax.shard_map(per_replica, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))
    got = partitioner.jit(fn)(x, state)
    expected = nnx.merge(graphdef, state)(x, train=True)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    grad = partitioner.jit(jax.grad(lambda xs: jnp.sum(jnp.sin(fn(xs, state)))))(x)
    # The state is differentiated too so that grad rebuilds its variables in its trace.
    expected_grad = jax.grad(global_loss, argnums=(0, 1))(x, state)[0]
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-4, atol=1e-4)


def test_one_pass_statistics_hold_far_from_zero():
    """Batch norm sums x and x^2 in one pass (E[x^2] - E[x]^2 in float32): for an
    activation whose mean is 30 standard deviations from zero the output still has
    mean 0 and variance 1 within 1%, and a constant channel gives a finite output."""
    x = _images((8, 4, 4, 3)) / 3.0 + 30.0  # mean 30.7, std 1
    x = x.at[..., 2].set(5.0)
    y = np.asarray(BatchNorm(3, rngs=nnx.Rngs(0))(x, train=True))
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y[..., :2].mean(axis=(0, 1, 2)), 0.0, atol=1e-2)
    np.testing.assert_allclose(y[..., :2].var(axis=(0, 1, 2)), 1.0, atol=1e-2)
    np.testing.assert_allclose(y[..., 2], 0.0, atol=1e-2)


def test_bad_group_size_is_a_clear_error():
    bn = BatchNorm(3, rngs=nnx.Rngs(0), group_size=3)
    with pytest.raises(ValueError, match="bn_group_size"):
        bn(_images((8, 2, 2, 3)), train=True)


@pytest.mark.parametrize(
    "cfg,channels",
    [
        (resnet34(width=8), {"C2": 8, "C3": 16, "C4": 32, "C5": 64}),
        (resnet50(width=8), {"C2": 32, "C3": 64, "C4": 128, "C5": 256}),
    ],
)
def test_resnet_feature_pyramid_shapes(cfg, channels):
    feats = jax.eval_shape(
        lambda: ResNet(cfg, rngs=nnx.Rngs(0))(jnp.zeros((2, 64, 64, 3)), train=False)
    )
    assert nnx.eval_shape(lambda: ResNet(cfg, rngs=nnx.Rngs(0))).out_channels == channels
    for i, name in enumerate(("C2", "C3", "C4", "C5")):
        side = 64 // (4 * 2**i)
        assert feats[name].shape == (2, side, side, channels[name])


def test_resnet34_parameter_count_matches_the_standard_net():
    # torchvision resnet34 without the fc layer: 21,284,672 parameters (BN scale+bias
    # included, running statistics not).
    model = nnx.eval_shape(lambda: ResNet(resnet34(), rngs=nnx.Rngs(0)))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert n == 21_284_672


def test_ssd_style_backbone_keeps_stride_in_stage_three():
    cfg = resnet34(width=8, num_stages=3, stage_strides=(1, 2, 1))
    feats = jax.eval_shape(
        lambda: ResNet(cfg, rngs=nnx.Rngs(0))(jnp.zeros((1, 300, 300, 3)), train=True)
    )
    assert set(feats) == {"C2", "C3", "C4"}
    assert feats["C4"].shape == (1, 38, 38, 32)
