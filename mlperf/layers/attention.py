"""Multi-head self-attention with heads over the `model` axis (Megatron-style)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.layers.linear import DenseGeneral, dropout
from parallel.partition import constrain


class SelfAttention(nnx.Module):
    """Q/K/V projections [embed -> heads x kv], softmax, output [heads x kv -> embed].

    The scores and the softmax are fp32 unless `softmax_dtype` says otherwise (bfloat16
    halves the bytes of the [B, H, L, L] tensors, the largest in a long-sequence layer).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        rngs: nnx.Rngs,
        dropout_rate: float = 0.0,
        dtype: jnp.dtype = jnp.float32,
        softmax_dtype: jnp.dtype = jnp.float32,
    ):
        if dim % num_heads:
            raise ValueError(f"hidden size {dim} is not divisible by num_heads {num_heads}.")
        head_dim = dim // num_heads
        self.head_dim = head_dim
        self.dropout_rate = dropout_rate
        self.dtype = dtype
        self.softmax_dtype = softmax_dtype

        def proj():
            return DenseGeneral(
                (dim,), (num_heads, head_dim), ("embed", "heads", "kv"), rngs=rngs, dtype=dtype
            )

        self.query, self.key, self.value = proj(), proj(), proj()
        self.out = DenseGeneral(
            (num_heads, head_dim), (dim,), ("heads", "kv", "embed"), rngs=rngs, dtype=dtype
        )

    def __call__(
        self,
        x_BxLxD: jax.Array,
        mask_BxL: jax.Array,
        rng: jax.Array | None = None,
        queries_BxQxD: jax.Array | None = None,
    ) -> jax.Array:
        """[B, L, D] -> [B, L, D]; with `queries_BxQxD` (rows of x) only those rows attend
        (over all of x) and the result is [B, Q, D]."""
        queries = x_BxLxD if queries_BxQxD is None else queries_BxQxD
        q = constrain(self.query(queries), ("batch", "length", "heads", "kv"))
        k = constrain(self.key(x_BxLxD), ("batch", "length", "heads", "kv"))
        v = constrain(self.value(x_BxLxD), ("batch", "length", "heads", "kv"))
        q = q / jnp.sqrt(self.head_dim).astype(q.dtype)
        scores_BxHxLxL = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(self.softmax_dtype)
        bias = jnp.where(mask_BxL[:, None, None, :] > 0, 0.0, -1e9).astype(self.softmax_dtype)
        probs = jax.nn.softmax(scores_BxHxLxL + bias, axis=-1).astype(self.dtype)
        if rng is not None:
            probs = dropout(probs, self.dropout_rate, rng)
        ctx_BxLxHxK = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        ctx_BxLxHxK = constrain(ctx_BxLxHxK, ("batch", "length", "heads", "kv"))
        return self.out(ctx_BxLxHxK)
