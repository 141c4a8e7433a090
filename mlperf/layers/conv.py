"""2-D convolution and batch norm with cross-replica statistic groups, on logical axes.

Activations are NHWC with logical axes (`batch`, `height`, `width`, `channels`);
kernels are HWIO (`kernel_h`, `kernel_w`, `conv_in`, `conv_out`). Under spatial
partitioning (`height` -> `model`) XLA partitions the convolutions and exchanges the
halo rows itself (collective-permute), so nothing here knows the mesh.

Batch norm statistics span a configurable group of examples (`group_size`, the MLPerf
"bn span"): 0 means the whole global batch. Where the train step runs per data replica
(a shard_map manual over the data axis, mlperf/steps.py) a group larger than one
replica's rows is formed by parallel/batch_groups.py; in an auto-sharded jit the
batch axis is already global and the group is a reshape of it. Running statistics are
`nnx.BatchStat` variables: they live next to the parameters in the train state and the
train step writes their updated values back after the optimizer step.

Frozen layers (the Mask R-CNN reference's frozen stem, stage 1 and batch norm) hold
their weights as `FrozenParam`: a frozen conv's kernel, and a frozen batch norm's
statistics and affine, which then normalises with the running statistics in training
too (torchvision's FrozenBatchNorm2d).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.layers.linear import FrozenParam, Initializer, logical_param
from parallel.batch_groups import batch_group_sum
from parallel.partition import constrain

IMAGE_AXES = ("batch", "height", "width", "channels")
CONV_INIT = nnx.initializers.variance_scaling(2.0, "fan_out", "normal")


def constrain_image(x: jax.Array) -> jax.Array:
    """Places an NHWC activation: batch over data, height over model when spatially split."""
    return constrain(x, IMAGE_AXES)


class Conv(nnx.Module):
    """NHWC convolution with an HWIO kernel; explicit symmetric padding ((k-1)//2 per side,
    as in torchvision's ResNet) unless `padding` is given.

    `stride_by_slicing=True` computes a strided conv as the stride-1 conv followed by
    every stride-th row and column (the same values, stride^2 the FLOPs). XLA's SPMD
    partitioner (jax 0.10, CPU) returns a wrong kernel gradient for a stride-2 conv whose
    height is split 8 ways with at most one row per shard (the SSD extra layers on small
    maps under 8-way spatial partitioning); the sliced form partitions correctly.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: int,
        *,
        rngs: nnx.Rngs,
        strides: int = 1,
        padding: int | str | None = None,
        use_bias: bool = False,
        dtype: jnp.dtype = jnp.float32,
        kernel_init: Initializer = CONV_INIT,
        stride_by_slicing: bool = False,
        frozen: bool = False,
    ):
        self.strides = (strides, strides)
        self.stride_by_slicing = stride_by_slicing and strides > 1
        if padding is None:
            padding = (kernel_size - 1) // 2
        self.padding = padding if isinstance(padding, str) else ((padding, padding),) * 2
        self.dtype = dtype
        self.kernel = logical_param(
            rngs,
            kernel_init,
            (kernel_size, kernel_size, in_features, out_features),
            ("kernel_h", "kernel_w", "conv_in", "conv_out"),
            frozen=frozen,
        )
        self.frozen = frozen
        self.bias = (
            logical_param(rngs, nnx.initializers.zeros, (out_features,), ("channels",))
            if use_bias
            else None
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...]
        if self.frozen:
            kernel = jax.lax.stop_gradient(kernel)
        y = jax.lax.conv_general_dilated(
            x.astype(self.dtype),
            kernel.astype(self.dtype),
            window_strides=(1, 1) if self.stride_by_slicing else self.strides,
            padding=self.padding,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
        if self.stride_by_slicing:
            sh, sw = self.strides
            y = y[:, ::sh, ::sw]
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return constrain_image(y)


class BatchNorm(nnx.Module):
    """Batch norm over (batch group, height, width) per channel, fp32 statistics.

    train=True normalises with the group's batch statistics and moves the running
    statistics towards the replica-average ones (momentum); train=False uses the
    running statistics. `frozen_stats` uses (and keeps) the running statistics in
    training too; `frozen_affine` keeps scale and bias fixed.
    """

    def __init__(
        self,
        features: int,
        *,
        rngs: nnx.Rngs,
        momentum: float = 0.9,
        epsilon: float = 1e-5,
        group_size: int = 0,
        scale_init: Initializer = nnx.initializers.ones,
        dtype: jnp.dtype = jnp.float32,
        frozen_stats: bool = False,
        frozen_affine: bool = False,
    ):
        self.momentum = momentum
        self.epsilon = epsilon
        self.group_size = group_size
        self.dtype = dtype
        self.frozen_stats = frozen_stats
        self.frozen_affine = frozen_affine
        shape, axes = (features,), ("channels",)
        self.scale = logical_param(rngs, scale_init, shape, axes, frozen=frozen_affine)
        self.bias = logical_param(rngs, nnx.initializers.zeros, shape, axes, frozen=frozen_affine)
        stat = FrozenParam if frozen_stats else nnx.BatchStat
        with nnx.use_eager_sharding(False):
            self.mean = stat(jnp.zeros((features,)), out_sharding=axes)
            self.var = stat(jnp.ones((features,)), out_sharding=axes)

    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x32 = x.astype(jnp.float32)
        scale, bias = self.scale[...], self.bias[...]
        if self.frozen_affine:
            scale, bias = jax.lax.stop_gradient(scale), jax.lax.stop_gradient(bias)
        if train and not self.frozen_stats:
            rows, h, w, c = x.shape
            n_local = h * w  # pixels per example (global H x W: XLA reduces over `model`)
            # One pass: the sums of x and x^2 in one reduction and one group sum (as
            # Google's TPU batch norm), not a second pass over the centred activation
            # after the mean's collectives. fp32 keeps E[x^2] - E[x]^2 exact enough for
            # activations whose mean is not many standard deviations from zero.
            sums = jnp.concatenate([jnp.sum(x32, axis=(1, 2)), jnp.sum(x32 * x32, axis=(1, 2))], -1)
            s, n = batch_group_sum(sums, rows, self.group_size)
            mean = s[:, :c] / (n * n_local)  # [rows or 1, C]
            var = jnp.maximum(s[:, c:] / (n * n_local) - mean * mean, 0.0)
            centred = x32 - mean[:, None, None, :]
            # Running statistics: the average over this replica's groups (the train step
            # averages replicas), so the stored value is the global-batch mean.
            m = self.momentum
            batch_mean = jnp.mean(mean, axis=0)
            batch_var = jnp.mean(var, axis=0)
            self.mean[...] = m * self.mean[...] + (1 - m) * jax.lax.stop_gradient(batch_mean)
            self.var[...] = m * self.var[...] + (1 - m) * jax.lax.stop_gradient(batch_var)
            inv = jax.lax.rsqrt(var + self.epsilon)[:, None, None, :]
        else:
            centred = x32 - jax.lax.stop_gradient(self.mean[...])
            inv = jax.lax.rsqrt(jax.lax.stop_gradient(self.var[...]) + self.epsilon)
        y = centred * inv * scale + bias
        return constrain_image(y.astype(self.dtype))


class ConvBN(nnx.Module):
    """Conv -> BatchNorm -> optional ReLU, the unit every ResNet block is built from."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: int,
        *,
        rngs: nnx.Rngs,
        strides: int = 1,
        relu: bool = True,
        bn_group_size: int = 0,
        bn_momentum: float = 0.9,
        zero_init_scale: bool = False,
        dtype: jnp.dtype = jnp.float32,
        frozen: bool = False,
        frozen_bn: bool = False,
    ):
        """`frozen`: kernel and batch-norm affine fixed (a frozen stage); `frozen_bn`:
        batch norm with fixed statistics and affine."""
        self.conv = Conv(
            in_features,
            out_features,
            kernel_size,
            rngs=rngs,
            strides=strides,
            dtype=dtype,
            frozen=frozen,
        )
        self.bn = BatchNorm(
            out_features,
            rngs=rngs,
            momentum=bn_momentum,
            group_size=bn_group_size,
            scale_init=nnx.initializers.zeros if zero_init_scale else nnx.initializers.ones,
            dtype=dtype,
            frozen_stats=frozen_bn,
            frozen_affine=frozen or frozen_bn,
        )
        self.relu = relu

    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        y = self.bn(self.conv(x), train)
        return jax.nn.relu(y) if self.relu else y


def max_pool(x: jax.Array, window: int, stride: int, padding: Sequence[int] = (1, 1)) -> jax.Array:
    """NHWC max pooling with explicit padding (-inf), spatially partitionable by XLA."""
    pads = ((0, 0), tuple(padding), tuple(padding), (0, 0))
    y = jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, window, window, 1), (1, stride, stride, 1), pads
    )
    return constrain_image(y)
