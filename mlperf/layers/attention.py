"""Multi-head self-attention with heads over the `model` axis (Megatron-style)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.layers.dropout import dropout, dropout_keep_mask, keep_scale
from mlperf.layers.linear import DenseGeneral
from mlperf.layers.softmax import softmax
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
    ):
        if dim % num_heads:
            raise ValueError(f"hidden size {dim} is not divisible by num_heads {num_heads}.")
        head_dim = dim // num_heads
        self.head_dim = head_dim
        self.dropout_rate = dropout_rate
        self.dtype = dtype
        self.softmax_dtype = softmax_dtype
        self.normalize_after_values = normalize_after_values

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
        if self.normalize_after_values:
            ctx_BxLxHxK = self._attend_then_normalize(scores_BxHxLxL + bias, v, rng)
        else:
            probs = softmax(scores_BxHxLxL + bias).astype(self.dtype)
            if rng is not None:
                probs = dropout(probs, self.dropout_rate, rng)
            ctx_BxLxHxK = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        ctx_BxLxHxK = constrain(ctx_BxLxHxK, ("batch", "length", "heads", "kv"))
        return self.out(ctx_BxLxHxK)

    def _attend_then_normalize(
        self, scores_BxHxLxL: jax.Array, v: jax.Array, rng: jax.Array | None
    ) -> jax.Array:
        """softmax(scores) (with dropout) @ v, normalised on the [B, L, H, K] result."""
        # The max only keeps exp in range; its gradient cancels, so none flows through it.
        top = jax.lax.stop_gradient(jnp.max(scores_BxHxLxL, axis=-1, keepdims=True))
        unnormalized = jnp.exp(scores_BxHxLxL - top)
        total_BxHxL = jnp.sum(unnormalized, axis=-1)
        weights = unnormalized.astype(self.dtype)
        # The keep bits `dropout` would draw for the normalised probabilities; its
        # 1 / (1 - rate) scaling moves to the result with the division by the sum.
        keep = dropout_keep_mask(weights.shape, self.dropout_rate, rng)
        scale = 1.0
        if keep is not None:
            weights = jnp.where(keep, weights, 0).astype(self.dtype)
            scale = keep_scale(self.dropout_rate)
        ctx_BxLxHxK = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        denom_BxLxHx1 = jnp.transpose(total_BxHxL, (0, 2, 1))[..., None]
        ctx = ctx_BxLxHxK.astype(denom_BxLxHx1.dtype) * (scale / denom_BxLxHx1)
        return ctx.astype(self.dtype)
