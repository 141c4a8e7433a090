"""Multi-head self-attention with heads over the `model` axis (Megatron-style)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.config_error import ConfigError
from mlperf.layers.attention_core import CPU_BLOCK_BYTES, attention_context
from mlperf.layers.linear import DenseGeneral
from parallel.partition import constrain


class SelfAttention(nnx.Module):
    """Q/K/V projections [embed -> heads x kv], softmax, output [heads x kv -> embed].

    The scores and the softmax are fp32 unless `softmax_dtype` says otherwise (bfloat16
    halves the bytes of the [B, H, L, L] tensors, the largest in a long-sequence layer).

    `normalize_after_values` divides by the softmax's sum after the product with the
    values, as Google's v0.7 BERT does: dropout(softmax(s)) @ v equals
    (keep * exp(s - max)) @ v / (sum * (1 - rate)), the same result up to rounding with
    the same keep mask, but the division and the dropout's scaling run over [B, L, H, K]
    instead of [B, H, L, L], and the softmax's backward needs no reduction over the keys.
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
        normalize_after_values: bool = False,
        cpu_block_bytes: int = CPU_BLOCK_BYTES,
    ):
        if dim % num_heads:
            raise ConfigError(f"hidden size {dim} is not divisible by num_heads {num_heads}.")
        head_dim = dim // num_heads
        self.head_dim = head_dim
        self.dropout_rate = dropout_rate
        self.dtype = dtype
        self.softmax_dtype = softmax_dtype
        self.normalize_after_values = normalize_after_values
        self.cpu_block_bytes = cpu_block_bytes

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
        (over all of x) and the result is [B, Q, D]. `mask_BxL` is the keys' padding mask
        [B, L], or a per-query mask [B, Q, L] (packed rows: each query sees its own
        sequence's keys only)."""
        queries = x_BxLxD if queries_BxQxD is None else queries_BxQxD
        q = constrain(self.query(queries), ("batch", "length", "heads", "kv"))
        k = constrain(self.key(x_BxLxD), ("batch", "length", "heads", "kv"))
        v = constrain(self.value(x_BxLxD), ("batch", "length", "heads", "kv"))
        q = q / jnp.sqrt(self.head_dim).astype(q.dtype)
        keep = mask_BxL[:, None, None, :] if mask_BxL.ndim == 2 else mask_BxL[:, None]
        bias_Bx1x1xL = jnp.where(keep > 0, 0.0, -1e9)
        ctx_BxLxHxK = attention_context(
            q,
            k,
            v,
            bias_Bx1x1xL.astype(self.softmax_dtype),
            rng,
            dropout_rate=self.dropout_rate,
            dtype=self.dtype,
            softmax_dtype=self.softmax_dtype,
            additive_mask=True,
            normalize_after_values=self.normalize_after_values,
            block_bytes=self.cpu_block_bytes,
        )
        ctx_BxLxHxK = constrain(ctx_BxLxHxK, ("batch", "length", "heads", "kv"))
        return self.out(ctx_BxLxHxK)
