"""The attention core, softmax(q k^T + mask) (with dropout) @ v, in row blocks on CPU.

Both attention layers (`SelfAttention`, `MultiHeadAttention`) compute their scores,
softmax, dropout and context here. On XLA:CPU the core runs as independent blocks of
examples when one device's [B, H, Q, K] scores are larger than `CPU_BLOCK_BYTES`: a
block's scores stay in the core's cache between the score product, the softmax and the
product with the values, where the whole tensor (2 MiB at the Transformer tiny size) goes
out to memory between them. The blocks are independent, but XLA:CPU's executor runs them
one after another, not on two cores at once (`launch.bench.kernels --kernel_chains`,
docs/design.md): the cache is the whole gain, a few percent of a step.

The blocks interleave (block c holds examples c, c + n, c + 2n, ...), so each holds the
same number of every device's rows and a batch-sharded mesh splits every block as it
splits the batch. A block's dropout mask is the same rows of the whole tensor's mask
(`dropout_keep_mask(rows=...)`), so the blocks compute what the whole core would, up to
float rounding. Other lowerings (TPU, GPU, AOT compiles for TPU from a CPU host) run the
core whole: there the compiler's own fusions tile it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from mlperf.layers.dropout import ALL_ROWS, Rows, dropout, dropout_keep_mask, keep_scale
from mlperf.layers.softmax import softmax
from parallel.partition import constrain, shard_count

# One block's scores at most (measured in docs/design.md, "Attention in blocks").
CPU_BLOCK_BYTES = 512 * 1024
_BQHD = ("batch", "length", "heads", "kv")


def cpu_block_count(
    batch: int, heads: int, queries: int, keys: int, itemsize: int, block_bytes: int
) -> int:
    """How many interleaved blocks the CPU core splits `batch` examples into: the fewest
    whose one-device scores fit `block_bytes`, a divisor of the per-device batch; 1 (no
    split) when the scores fit whole, or when one example's do not: blocks that spill
    out of the cache anyway have nothing to gain (BERT-base's measured 0.97-0.99x)."""
    local_batch = max(batch // shard_count("batch"), 1)
    local_heads = max(heads // shard_count("heads"), 1)
    per_example = local_heads * queries * keys * itemsize
    if block_bytes <= 0 or per_example > block_bytes or per_example * local_batch <= block_bytes:
        return 1
    for count in range(2, local_batch + 1):
        fits = per_example * (local_batch // count) <= block_bytes
        if fits and local_batch % count == 0 and batch % count == 0:
            return count
    return 1


def attention_context(
    q_BxQxHxD: jax.Array,
    k_BxKxHxD: jax.Array,
    v_BxKxHxD: jax.Array,
    mask: jax.Array,
    rng: jax.Array | None,
    *,
    dropout_rate: float,
    dtype: jnp.dtype,
    softmax_dtype: jnp.dtype = jnp.float32,
    additive_mask: bool = False,
    normalize_after_values: bool = False,
    block_bytes: int | None = None,
) -> jax.Array:
    """The context [B, Q, H, D] of queries (already scaled) over keys and values.

    `mask` broadcasts against the scores [B, H, Q, K] (its axis 0 is B or 1): a boolean
    keep mask, or with `additive_mask` a bias added to the scores. `rng` None is eval.
    `normalize_after_values` divides by the softmax's sum after the product with the
    values (`SelfAttention`'s docstring says why). `block_bytes` (default
    `CPU_BLOCK_BYTES`) bounds a CPU block's scores; 0 keeps the core whole.
    """
    core = functools.partial(
        _core,
        dropout_rate=dropout_rate,
        dtype=dtype,
        softmax_dtype=softmax_dtype,
        additive_mask=additive_mask,
        normalize_after_values=normalize_after_values,
    )
    if block_bytes is None:
        block_bytes = CPU_BLOCK_BYTES
    batch, queries, heads, _ = q_BxQxHxD.shape
    count = cpu_block_count(
        batch, heads, queries, k_BxKxHxD.shape[1], jnp.dtype(softmax_dtype).itemsize, block_bytes
    )
    if count == 1:
        return core(q_BxQxHxD, k_BxKxHxD, v_BxKxHxD, mask, rng)
    # platform_dependent takes arrays only: the key travels as a fifth operand if any.
    operands = (q_BxQxHxD, k_BxKxHxD, v_BxKxHxD, mask) + (() if rng is None else (rng,))

    def whole(q, k, v, mask, rng=None):
        return core(q, k, v, mask, rng)

    def in_blocks(q, k, v, mask, rng=None):
        return _in_blocks(core, count, q, k, v, mask, rng)

    return lax.platform_dependent(*operands, cpu=in_blocks, default=whole)


def _in_blocks(core, count: int, q, k, v, mask, rng) -> jax.Array:
    """`core` over `count` interleaved blocks of examples, reassembled in order."""

    def block(x: jax.Array, index: int) -> jax.Array:
        if x.shape[0] == 1:  # a mask broadcast over the batch
            return x
        return x.reshape(x.shape[0] // count, count, *x.shape[1:])[:, index]

    outs = []
    for index in range(count):
        q_b, k_b, v_b = (constrain(block(x, index), _BQHD) for x in (q, k, v))
        outs.append(core(q_b, k_b, v_b, block(mask, index), rng, rows=(count, index)))
    ctx = jnp.stack(outs, axis=1)
    return ctx.reshape(q.shape[0], *ctx.shape[2:])


def _core(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    rng: jax.Array | None,
    *,
    dropout_rate: float,
    dtype: jnp.dtype,
    softmax_dtype: jnp.dtype,
    additive_mask: bool,
    normalize_after_values: bool,
    rows: Rows = ALL_ROWS,
) -> jax.Array:
    scores_BxHxQxK = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(softmax_dtype)
    if additive_mask:
        scores_BxHxQxK = scores_BxHxQxK + mask.astype(softmax_dtype)
    else:
        scores_BxHxQxK = jnp.where(mask, scores_BxHxQxK, -1e9).astype(softmax_dtype)
    if normalize_after_values:
        # The max only keeps exp in range; its gradient cancels, so none flows through it.
        top = lax.stop_gradient(jnp.max(scores_BxHxQxK, axis=-1, keepdims=True))
        unnormalized = jnp.exp(scores_BxHxQxK - top)
        total_BxHxQ = jnp.sum(unnormalized, axis=-1)
        weights = unnormalized.astype(dtype)
        # dropout's 1 / (1 - rate) scaling moves to the result with the division by the sum.
        keep = dropout_keep_mask(scores_BxHxQxK.shape, dropout_rate, rng, rows)
        scale = 1.0
        if keep is not None:
            weights = jnp.where(keep, weights, 0).astype(dtype)
            scale = keep_scale(dropout_rate)
        ctx_BxQxHxD = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        denom_BxQxHx1 = jnp.transpose(total_BxHxQ, (0, 2, 1))[..., None]
        ctx = ctx_BxQxHxD.astype(denom_BxQxHx1.dtype) * (scale / denom_BxQxHx1)
        return ctx.astype(dtype)
    probs = dropout(softmax(scores_BxHxQxK).astype(dtype), dropout_rate, rng, rows)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)
