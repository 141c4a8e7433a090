"""Sums of per-example statistics over groups of the global batch (batch-norm "span").

Inside the train step's per-replica shard_map (manual over `data`) each replica sees
only its own rows, so a group larger than a replica is formed with collectives over the
data axis; elsewhere the batch axis is global and a group is a reshape. Models call
this instead of naming mesh axes themselves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from parallel.partition import manual_data_axis


def batch_group_sum(local: jax.Array, rows: int, group_size: int) -> tuple[jax.Array, int]:
    """Sums per-example statistics [rows, C] over each example's BN group.

    Returns (sums broadcastable against [rows, 1, 1, C] as [rows or 1, C], examples per
    group). `group_size` 0 is the whole global batch.
    """
    axis = manual_data_axis()
    replicas = 1 if axis is None else jax.lax.axis_size(axis)
    total = rows * replicas
    if group_size <= 0 or group_size >= total:
        s = jnp.sum(local, axis=0, keepdims=True)
        return (s if axis is None else jax.lax.psum(s, axis)), total
    if total % group_size:
        raise ValueError(
            f"batch-norm group of {group_size} examples does not divide the batch of {total} "
            "examples; set model.bn_group_size to a divisor (0 = whole batch)."
        )
    if group_size <= rows:
        if rows % group_size:
            raise ValueError(
                f"batch-norm group {group_size} does not divide the {rows} rows of a replica."
            )
        g = local.reshape(rows // group_size, group_size, -1).sum(axis=1, keepdims=True)
        return jnp.broadcast_to(g, (rows // group_size, group_size, g.shape[-1])).reshape(
            rows, -1
        ), group_size
    # The group spans several consecutive replicas: add up their sums with
    # collective-permutes of C floats (an all-gather of every replica's sums would
    # move replicas x C floats, and its gradient a reduce-scatter of as many).
    if group_size % rows:
        raise ValueError(
            f"batch-norm group {group_size} is not a multiple of the {rows} rows per replica."
        )
    sums = replica_group_sum(jnp.sum(local, axis=0, keepdims=True), axis, group_size // rows)
    return sums, group_size


def replica_group_sum(x: jax.Array, axis: str, group: int) -> jax.Array:
    """Sums `x` over each block of `group` consecutive replicas of `axis` (inside a
    shard_map manual over it): recursive doubling (log2(group) exchanges) when `group`
    is a power of two, else group - 1 shifts around the block."""
    size = jax.lax.axis_size(axis)
    if group & (group - 1) == 0:
        d = 1
        while d < group:
            x = x + jax.lax.ppermute(x, axis, [(i, i ^ d) for i in range(size)])
            d *= 2
        return x
    total = x
    for k in range(1, group):
        pairs = [(i, i - i % group + (i % group + k) % group) for i in range(size)]
        total = total + jax.lax.ppermute(x, axis, pairs)
    return total
