"""Parameters with logical axes, dense (einsum) projections and layer norm.

Every parameter carries its logical axis names as flax metadata (`out_sharding`);
`parallel/` turns those into mesh shardings. Eager sharding is off: modules never
need a mesh to be built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.layers.bias import add_bias_fp32_sum
from mlperf.layers.matmul import matmul

Initializer = nnx.initializers.Initializer
DEFAULT_INIT = nnx.initializers.truncated_normal(stddev=0.02)


class FrozenParam(nnx.BatchStat):
    """A weight held fixed during training (a frozen backbone stage, frozen batch norm).

    Not an nnx.Param, so no L2 term or trainable-parameter count includes it; as
    non-trainable model state it lives in the train state and checkpoints next to the
    weights (same names, so a checkpoint loads whether or not a layer is frozen), and the
    train step keeps its value (mlperf/steps.py). Layers stop gradients at it, so no
    backward pass is spent on it."""


def logical_param(
    rngs: nnx.Rngs,
    init: Initializer,
    shape: Sequence[int],
    axes: Sequence[str | None],
    dtype: jnp.dtype = jnp.float32,
    frozen: bool = False,
) -> nnx.Param | FrozenParam:
    """An nnx.Param whose metadata names its logical axes (one per dimension); a
    FrozenParam instead when `frozen`."""
    if len(axes) != len(shape):
        raise ValueError(f"param of shape {tuple(shape)} needs {len(shape)} axes, got {axes}.")
    kind = FrozenParam if frozen else nnx.Param
    with nnx.use_eager_sharding(False):
        return kind(init(rngs.params(), tuple(shape), dtype), out_sharding=tuple(axes))


class DenseGeneral(nnx.Module):
    """y = einsum(x, W) + b over the trailing `in_shape` dims of x into `out_shape`."""

    def __init__(
        self,
        in_shape: Sequence[int],
        out_shape: Sequence[int],
        kernel_axes: Sequence[str | None],
        *,
        rngs: nnx.Rngs,
        use_bias: bool = True,
        dtype: jnp.dtype = jnp.float32,
        param_dtype: jnp.dtype = jnp.float32,
        kernel_init: Initializer = DEFAULT_INIT,
    ):
        self.in_shape = tuple(in_shape)
        self.out_shape = tuple(out_shape)
        self.dtype = dtype
        self.kernel = logical_param(
            rngs, kernel_init, (*self.in_shape, *self.out_shape), kernel_axes, param_dtype
        )
        bias_axes = tuple(kernel_axes)[len(self.in_shape) :]
        self.bias = (
            logical_param(rngs, nnx.initializers.zeros, self.out_shape, bias_axes, param_dtype)
            if use_bias
            else None
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        n_in = len(self.in_shape)
        if x.shape[x.ndim - n_in :] != self.in_shape:
            raise ValueError(
                f"DenseGeneral expects inputs ending in {self.in_shape}, got shape {x.shape}."
            )
        lead = x.shape[: x.ndim - n_in]
        # One 2-D matmul [M, K] @ [K, N] over the flattened leading and contracted dims,
        # the same sums as the einsum over the original dims. Why: for the einsum's
        # backward pass XLA:CPU builds the weight gradient as a transpose copy of the
        # [B, L, N] cotangent plus a dot off its fast (YNNPACK) path, ~20% of a tiny BERT
        # step; the 2-D form's gradient needs no copy (tiny MLP fwd+bwd 1.7x faster).
        # The reshapes only merge dims (major sharded dims stay major), so SPMD keeps
        # the same shardings; parameters keep their shapes and logical axes.
        k = math.prod(self.in_shape)
        kernel = self.kernel[...].astype(self.dtype).reshape(k, -1)
        y = matmul(x.astype(self.dtype).reshape(-1, k), kernel)
        # The bias goes on after the reshape: added to the 2-D product instead, the
        # BERT-large step compiled for v3 was estimated 3.6% slower.
        y = y.reshape(*lead, *self.out_shape)
        if self.bias is not None:
            y = add_bias_fp32_sum(y, self.bias[...].astype(self.dtype))
        return y


class LayerNorm(nnx.Module):
    """Layer normalisation over the last axis, statistics in fp32."""

    def __init__(
        self,
        dim: int,
        axis_name: str = "embed",
        *,
        rngs: nnx.Rngs,
        eps: float = 1e-12,
        dtype: jnp.dtype = jnp.float32,
    ):
        self.eps = eps
        self.dtype = dtype
        self.scale = logical_param(rngs, nnx.initializers.ones, (dim,), (axis_name,))
        self.bias = logical_param(rngs, nnx.initializers.zeros, (dim,), (axis_name,))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale[...] + self.bias[...]).astype(self.dtype)
