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
    # The group spans several replicas: gather every replica's sums (C floats each)
    # and add up those of this replica's group.
    if group_size % rows:
        raise ValueError(
            f"batch-norm group {group_size} is not a multiple of the {rows} rows per replica."
        )
    per_group = group_size // rows
    sums = jax.lax.all_gather(jnp.sum(local, axis=0), axis)  # [replicas, C]
    first = (jax.lax.axis_index(axis) // per_group) * per_group
    mine = jax.lax.dynamic_slice_in_dim(sums, first, per_group, axis=0)
    return jnp.sum(mine, axis=0, keepdims=True), group_size
