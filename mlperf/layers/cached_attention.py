"""Multi-head attention for encoder-decoder models: separate query and key/value inputs,
boolean masks (padding, packed segments, causal), and a decode cache.

The shared `SelfAttention` (BERT) takes one input and a padding mask; translation needs
cross-attention, masks built from segment ids (packed rows) and causality, and
step-by-step decoding. Heads are over `model` as in the shared layer.

The decode cache holds keys and values [B, L, H, K] for every decoder position; step i
writes its key/value with a one-hot multiply-add over the length axis (no scatter),
as Google's MLPerf v0.7 code did: `dynamic_update_slice` would lower to a scatter-like
update that partitions poorly on TPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.layers.attention_core import CPU_BLOCK_BYTES, attention_context
from mlperf.layers.linear import DenseGeneral
from parallel.partition import constrain

Cache = dict[str, jax.Array]


def segment_mask(q_segments: jax.Array, kv_segments: jax.Array) -> jax.Array:
    """[B,Q], [B,K] -> bool [B,1,Q,K]: same non-zero segment (0 = padding)."""
    same = q_segments[:, :, None] == kv_segments[:, None, :]
    valid = (q_segments[:, :, None] > 0) & (kv_segments[:, None, :] > 0)
    return (same & valid)[:, None]


def causal_mask(length: int) -> jax.Array:
    """bool [1,1,L,L]: query i sees keys j <= i (segments are contiguous in packed rows)."""
    idx = jnp.arange(length)
    return (idx[None, :] <= idx[:, None])[None, None]


class MultiHeadAttention(nnx.Module):
    """Q from `x_q`, K/V from `x_kv`; fp32 softmax; output back to the model dimension."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        rngs: nnx.Rngs,
        dropout_rate: float = 0.0,
        dtype: jnp.dtype = jnp.float32,
        cpu_block_bytes: int = CPU_BLOCK_BYTES,
    ):
        if dim % num_heads:
            raise ValueError(f"model dim {dim} is not divisible by num_heads {num_heads}.")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.dropout_rate = dropout_rate
        self.dtype = dtype
        self.cpu_block_bytes = cpu_block_bytes

        def proj():
            return DenseGeneral(
                (dim,),
                (num_heads, self.head_dim),
                ("embed", "heads", "kv"),
                rngs=rngs,
                dtype=dtype,
                use_bias=False,
            )

        self.query, self.key, self.value = proj(), proj(), proj()
        self.out = DenseGeneral(
            (num_heads, self.head_dim),
            (dim,),
            ("heads", "kv", "embed"),
            rngs=rngs,
            dtype=dtype,
            use_bias=False,
        )

    def keys_values(self, x_kv: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Projected keys and values [B,K,H,D] of a key/value input [B,K,E]."""
        k = constrain(self.key(x_kv), ("batch", "length", "heads", "kv"))
        v = constrain(self.value(x_kv), ("batch", "length", "heads", "kv"))
        return k, v

    def attend(
        self,
        x_q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        mask: jax.Array | None,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """Attention of queries from x_q [B,Q,E] over projected k, v; mask bool [B|1,1,Q,K]."""
        q = constrain(self.query(x_q), ("batch", "length", "heads", "kv"))
        q = q / jnp.sqrt(self.head_dim).astype(q.dtype)
        if mask is None:
            mask = jnp.ones((1, 1, 1, 1), bool)
        ctx_BxQxHxD = attention_context(
            q,
            k,
            v,
            mask,
            rng,
            dropout_rate=self.dropout_rate,
            dtype=self.dtype,
            block_bytes=self.cpu_block_bytes,
        )
        ctx_BxQxHxD = constrain(ctx_BxQxHxD, ("batch", "length", "heads", "kv"))
        return self.out(ctx_BxQxHxD)

    def __call__(
        self,
        x_q: jax.Array,
        x_kv: jax.Array,
        mask: jax.Array | None,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """Full attention (training, encoding): self-attention when x_kv is x_q."""
        k, v = self.keys_values(x_kv)
        return self.attend(x_q, k, v, mask, rng)

    def init_cache(self, batch: int, length: int) -> Cache:
        """An empty self-attention cache for `length` decoder positions."""
        shape = (batch, length, self.num_heads, self.head_dim)
        return {"k": jnp.zeros(shape, self.dtype), "v": jnp.zeros(shape, self.dtype)}

    def decode_step(
        self, x_Bx1xE: jax.Array, cache: Cache, index: jax.Array, one_hot: bool = True
    ) -> tuple:
        """Causal self-attention of one new position `index` over positions <= index.

        Returns (output [B,1,E], updated cache). With `one_hot` the cache update is
        `cache * (1 - onehot) + onehot * new`: a multiply-add, no scatter, but it reads and
        writes the whole cache every step. Without, a `dynamic_update_slice` writes the one
        new position in place (O(1) per step; the CPU choice).
        """
        k_new, v_new = self.keys_values(x_Bx1xE)
        length = cache["k"].shape[1]
        if one_hot:
            onehot_L = jax.nn.one_hot(index, length, dtype=cache["k"].dtype)[None, :, None, None]
            k = cache["k"] * (1 - onehot_L) + onehot_L * k_new
            v = cache["v"] * (1 - onehot_L) + onehot_L * v_new
        else:
            start = (0, index, 0, 0)
            k = jax.lax.dynamic_update_slice(cache["k"], k_new.astype(cache["k"].dtype), start)
            v = jax.lax.dynamic_update_slice(cache["v"], v_new.astype(cache["v"].dtype), start)
        visible = (jnp.arange(length) <= index)[None, None, None, :]
        out = self.attend(x_Bx1xE, k, v, visible)
        return out, {"k": k, "v": v}
