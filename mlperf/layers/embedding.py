"""Token embeddings and position gathers, as one-hot einsums or as gathers.

On TPU a gather/scatter over a large table is slow and, under SPMD with the vocabulary
sharded, needs extra collectives; the MLPerf v0.7 runs replaced them by one-hot
matmuls that the MXU does at full rate. `einsum_gather=True` selects that path; both
paths give the same values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.layers.linear import DEFAULT_INIT, logical_param
from mlperf.layers.matmul import matmul_transposed


class Embed(nnx.Module):
    """A (num, dim) table with logical axes; lookup by one-hot einsum or by gather."""

    def __init__(
        self,
        num: int,
        dim: int,
        axes: tuple[str, str],
        *,
        rngs: nnx.Rngs,
        einsum_gather: bool = True,
        dtype: jnp.dtype = jnp.float32,
        param_dtype: jnp.dtype = jnp.float32,
    ):
        self.num = num
        self.einsum_gather = einsum_gather
        self.dtype = dtype
        self.embedding = logical_param(rngs, DEFAULT_INIT, (num, dim), axes, param_dtype)

    def __call__(self, ids: jax.Array) -> jax.Array:
        table = self.embedding[...].astype(self.dtype)
        if self.einsum_gather:
            one_hot = jax.nn.one_hot(ids, self.num, dtype=self.dtype)
            return jnp.einsum("...v,vd->...d", one_hot, table)
        return jnp.take(table, ids, axis=0)

    def attend(self, x: jax.Array) -> jax.Array:
        """Logits against the table (tied output projection): x @ table.T."""
        return matmul_transposed(x.astype(self.dtype), self.embedding[...].astype(self.dtype))


def gather_positions(
    x_BxLxD: jax.Array, positions_BxP: jax.Array, einsum_gather: bool
) -> jax.Array:
    """Rows of x at `positions` per example: [B,L,D], [B,P] -> [B,P,D]."""
    if einsum_gather:
        one_hot_BxPxL = jax.nn.one_hot(positions_BxP, x_BxLxD.shape[1], dtype=x_BxLxD.dtype)
        return jnp.einsum("bpl,bld->bpd", one_hot_BxPxL, x_BxLxD)
    return jnp.take_along_axis(x_BxLxD, positions_BxP[..., None], axis=1)
