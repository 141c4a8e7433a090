"""Broadcast / reduce / all-reduce built from `ppermute`, for use inside `jax.shard_map`.

Four algorithms (costs in `parallel/costmodel.py`):
- `linear_pipeline` (LP, Wang et al.): the message is cut into `num_chunks` chunks that
  stream along a chain of devices, one hop per step, so every link is busy once the
  pipeline is full and the time approaches n*beta for any P. All-reduce reduces along
  the chain 0 -> P-1 while the last device already streams finished chunks back
  P-1 -> 0 (both link directions busy), 2P + k - 3 steps in all.
- `ring`: reduce-scatter then all-gather around a ring, P - 1 steps each.
- `tree`: binomial (minimum spanning) tree, ceil(log2 P) rounds each way; any P.
- `bidirectional_exchange`: recursive-halving reduce-scatter + recursive-doubling
  all-gather, log2 P rounds each; P must be a power of two.

Every function takes the per-device block `x` of any shape and dtype, flattens it,
pads it to a whole number of chunks / blocks (zeros, which do not change a sum), and
returns the result in `x`'s shape. Results equal `lax.psum` exactly for integers; for
floats the summation order differs, so they agree to rounding.

The result is typed "varying" over the axis (it comes out of ppermutes), even where it
is the same on every device; a shard_map that returns it with a replicated out_spec
needs `check_vma=False` (there is no cast from varying back to invariant in jax 0.10).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from parallel import costmodel

PyTree = Any
AxisName = str | tuple[str, ...]

ALGORITHMS = costmodel.ALGORITHMS


# ---------------------------------------------------------------- validation helpers


def _axes(axis_name: AxisName) -> tuple[str, ...]:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _axis_size(axis_name: AxisName) -> int:
    """Static size of the (manual) axis, or a ValueError naming it."""
    try:
        return int(jax.lax.axis_size(tuple(_axes(axis_name))))
    except NameError as e:
        raise ValueError(
            f"axis_name {axis_name!r} is not a manual axis here: call the collective inside "
            f"jax.shard_map over a mesh with that axis (and include it in axis_names) ({e})"
        ) from None


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown algorithm {algorithm!r}; valid algorithms: {', '.join(ALGORITHMS)}"
        )


def _check_root(root: int, P: int) -> int:
    root = operator.index(root)
    if not 0 <= root < P:
        raise ValueError(f"root={root} is outside the axis of size {P}; need 0 <= root < {P}")
    return root


def _chunks(num_chunks: int | None, n: int, P: int, itemsize: int, op: str) -> int:
    """Validated chunk count; None picks the cost model's best for default alpha/beta."""
    if num_chunks is None:
        return costmodel.lp_chunks(
            op, P, n * itemsize, costmodel.DEFAULT_ALPHA, costmodel.DEFAULT_BETA, max_chunks=n
        )
    k = operator.index(num_chunks)
    if not 1 <= k <= max(n, 1):
        raise ValueError(f"num_chunks={k} must be between 1 and the message length ({n} elements)")
    return k


def varying_axes(x: jax.Array) -> frozenset[str]:
    """The manual mesh axes `x` is typed as varying over inside a shard_map (none outside)."""
    aval = jax.typeof(x)
    varying = getattr(getattr(aval, "mat", None), "varying", None)
    if varying is None:  # another jax version's typing
        varying = getattr(aval, "vma", ())
    return frozenset(varying)


def to_varying(x: jax.Array, axes: Sequence[str]) -> jax.Array:
    """Marks `x` as varying over `axes` (ppermute's operand must be), where it is not."""
    have = varying_axes(x)
    missing = tuple(a for a in axes if a not in have)
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def _pad_to(flat: jax.Array, multiple: int) -> jax.Array:
    pad = -flat.size % multiple
    return jnp.pad(flat, (0, pad)) if pad else flat


def _prepare(
    x: jax.Array, axis_name: AxisName, algorithm: str, num_chunks: int | None, op: str
) -> tuple[jax.Array, int, int, int | None]:
    """Validates and flattens: returns (flat varying x, n, P, chunks or None for P == 1)."""
    _check_algorithm(algorithm)
    P = _axis_size(axis_name)
    x = jnp.asarray(x)
    n = int(x.size)
    k = _chunks(num_chunks, n, P, x.dtype.itemsize, op)
    if algorithm == "bidirectional_exchange" and P & (P - 1):
        raise ValueError(
            f"bidirectional_exchange needs a power-of-two axis size; axis {axis_name!r} has "
            f"P={P} devices (use 'ring', 'tree' or 'linear_pipeline')"
        )
    return to_varying(x.reshape(-1), _axes(axis_name)), n, P, k


def _finish(flat: jax.Array, n: int, like: jax.Array) -> jax.Array:
    return flat[:n].reshape(jnp.shape(like))


# ---------------------------------------------------------------- linear pipeline


def _linear_pipeline(
    flat: jax.Array, axis_name: AxisName, P: int, k: int, first: int, mode: str
) -> jax.Array:
    """Chain collective over devices first, first+1, ... (mod P).

    mode "reduce": sums flow down the chain (the last device ends with the total);
    "broadcast": the first device's chunks flow down the chain;
    "all_reduce": sums flow down the chain while finished chunks flow back up it.
    At step t the device at chain position q sends chunk t - q downstream, so after
    P - 2 fill steps every link carries one chunk per step.

    The loop carries one chunk per flow (the value this device sends next), not the
    message: the input is only read, and each step's received chunk is emitted as a scan
    output, so no step copies or rewrites the whole buffer. A device's result is then a
    contiguous run of those outputs (chunk j of position q arrives at step j + q - 1).
    """
    n = flat.size
    own = _pad_to(flat, k).reshape(k, -1)
    q = (jax.lax.axis_index(axis_name) - first) % P  # position down the chain
    r = P - 1 - q  # position up the chain (all_reduce's return flow)
    dev = [(first + p) % P for p in range(P)]
    down = [(dev[p], dev[p + 1]) for p in range(P - 1)]
    up = [(dev[p + 1], dev[p]) for p in range(P - 1)]
    add = mode != "broadcast"
    steps = (2 * P - 3 if mode == "all_reduce" else P - 2) + k

    def chunk(j):
        return jax.lax.dynamic_index_in_dim(own, jnp.clip(j, 0, k - 1), keepdims=False)

    def step(carry, t):
        down_next, up_next = carry  # what this device sends down / up at step t
        received = jax.lax.ppermute(down_next, axis_name, down)  # chunk t - q + 1
        down_value = chunk(t - q + 1) + received if add else received
        # The chain's head sends its own chunks; everyone else forwards what arrived.
        down_next = jnp.where(q == 0, chunk(t + 1), down_value)
        if mode != "all_reduce":
            return (down_next, up_next), (down_value, down_value)
        # Up the chain: the tail sends each chunk the step after completing it.
        received_up = jax.lax.ppermute(jnp.where(r == 0, carry[0], up_next), axis_name, up)
        return (down_next, received_up), (down_value, received_up)

    init = (jnp.where(q == 0, chunk(0), jnp.zeros_like(own[0])), jnp.zeros_like(own[0]))
    _, (downs, ups) = jax.lax.scan(step, init, jnp.arange(steps))

    def run(ys, start):
        return jax.lax.dynamic_slice_in_dim(ys, jnp.maximum(start, 0), k, axis=0)

    if mode == "all_reduce":
        # The tail's sums complete down the chain; the others receive them from above.
        result = jnp.where(r == 0, run(downs, q - 1), run(ups, P - 2 + r))
    else:
        result = jnp.where(q == 0, own, run(downs, q - 1))
    return result.reshape(-1)[:n]


# ---------------------------------------------------------------- ring


def _ring_all_reduce(flat: jax.Array, axis_name: AxisName, P: int) -> jax.Array:
    """Reduce-scatter then all-gather around the ring i -> i+1, P - 1 steps each."""
    n = flat.size
    buf = _pad_to(flat, P).reshape(P, -1)
    me = jax.lax.axis_index(axis_name)
    ring = [(i, (i + 1) % P) for i in range(P)]

    def scatter_step(s, buf):
        # Send the partial sum of block me - s; add the neighbour's block me - s - 1.
        recv = jax.lax.ppermute(buf[(me - s) % P], axis_name, ring)
        j = (me - s - 1) % P
        return buf.at[j].add(recv)

    def gather_step(s, buf):
        # Device me finished block me + 1; pass completed blocks on around the ring.
        recv = jax.lax.ppermute(buf[(me + 1 - s) % P], axis_name, ring)
        return buf.at[(me - s) % P].set(recv)

    buf = jax.lax.fori_loop(0, P - 1, scatter_step, buf)
    buf = jax.lax.fori_loop(0, P - 1, gather_step, buf)
    return buf.reshape(-1)[:n]


# ---------------------------------------------------------------- binomial tree


def _tree_reduce(flat: jax.Array, axis_name: AxisName, P: int, root: int) -> jax.Array:
    """Binomial-tree reduce to `root` in ceil(log2 P) rounds; works for any P.

    In the round with distance d, relative rank r with r % 2d == d sends its partial
    sum to r - d. Devices that receive nothing get zeros from ppermute, so every
    device simply adds what arrives.
    """
    mask = 1
    while mask < P:
        pairs = [
            ((root + r) % P, (root + r - mask) % P) for r in range(P) if r % (2 * mask) == mask
        ]
        flat = flat + jax.lax.ppermute(flat, axis_name, pairs)
        mask *= 2
    return flat


def _tree_broadcast(flat: jax.Array, axis_name: AxisName, P: int, root: int) -> jax.Array:
    """Binomial-tree broadcast from `root`: the reduce's rounds in reverse."""
    rel = (jax.lax.axis_index(axis_name) - root) % P
    mask = 1 << max(0, math.ceil(math.log2(P)) - 1) if P > 1 else 0
    while mask >= 1:
        pairs = [
            ((root + r) % P, (root + r + mask) % P)
            for r in range(P)
            if r % (2 * mask) == 0 and r + mask < P
        ]
        recv = jax.lax.ppermute(flat, axis_name, pairs)
        flat = jnp.where(rel % (2 * mask) == mask, recv, flat)
        mask //= 2
    return flat


# ---------------------------------------------------------------- bidirectional exchange


def _exchange_all_reduce(flat: jax.Array, axis_name: AxisName, P: int) -> jax.Array:
    """Recursive halving reduce-scatter, then recursive doubling all-gather (P = 2^m)."""
    n = flat.size
    buf = _pad_to(flat, P)
    me = jax.lax.axis_index(axis_name)
    d = P // 2
    while d >= 1:
        # Partners me and me^d split the current segment: the one with bit d set keeps
        # the upper half. After all rounds device i holds block i of the sum.
        upper = (me & d) != 0
        half = buf.size // 2
        lo, hi = buf[:half], buf[half:]
        recv = jax.lax.ppermute(jnp.where(upper, lo, hi), axis_name, [(i, i ^ d) for i in range(P)])
        buf = jnp.where(upper, hi, lo) + recv
        d //= 2
    d = 1
    while d < P:
        upper = (me & d) != 0
        recv = jax.lax.ppermute(buf, axis_name, [(i, i ^ d) for i in range(P)])
        buf = jnp.where(upper, jnp.concatenate([recv, buf]), jnp.concatenate([buf, recv]))
        d *= 2
    return buf[:n]


def _only_root(flat: jax.Array, axis_name: AxisName, root: int) -> jax.Array:
    """The root's data and zeros elsewhere: summing it is a broadcast."""
    is_root = jax.lax.axis_index(axis_name) == root
    return jnp.where(is_root, flat, jnp.zeros_like(flat))


# ---------------------------------------------------------------- public API


def all_reduce(
    x: jax.Array,
    axis_name: AxisName,
    algorithm: str = "linear_pipeline",
    num_chunks: int | None = None,
) -> jax.Array:
    """Sum of `x` over `axis_name` on every device, like `lax.psum`, via `algorithm`.

    `num_chunks` is the LP pipeline depth (other algorithms validate but ignore it);
    None picks `costmodel.lp_chunks` for default alpha/beta.
    """
    flat, n, P, k = _prepare(x, axis_name, algorithm, num_chunks, "all_reduce")
    if P == 1 or n == 0:
        return _finish(flat, n, x)
    if algorithm == "linear_pipeline":
        out = _linear_pipeline(flat, axis_name, P, k, first=0, mode="all_reduce")
    elif algorithm == "ring":
        out = _ring_all_reduce(flat, axis_name, P)
    elif algorithm == "tree":
        out = _tree_broadcast(_tree_reduce(flat, axis_name, P, 0), axis_name, P, 0)
    else:
        out = _exchange_all_reduce(flat, axis_name, P)
    return _finish(out, n, x)


def reduce(
    x: jax.Array,
    axis_name: AxisName,
    algorithm: str = "linear_pipeline",
    root: int = 0,
    num_chunks: int | None = None,
) -> jax.Array:
    """Sum of `x` over `axis_name`, valid on device `root` of the axis.

    What the other devices hold depends on the algorithm (do not rely on it):
    linear_pipeline: partial sums of the chain before them (root + 1, ..., itself);
    tree: partial sums of their binomial subtree; ring and bidirectional_exchange: the
    full sum (they are reduce-scatter + all-gather, which costs the same as
    reduce-scatter + gather in the alpha-beta model).
    """
    flat, n, P, k = _prepare(x, axis_name, algorithm, num_chunks, "reduce")
    root = _check_root(root, P)
    if P == 1 or n == 0:
        return _finish(flat, n, x)
    if algorithm == "linear_pipeline":
        # The chain ends at the root: root + 1 -> root + 2 -> ... -> root.
        out = _linear_pipeline(flat, axis_name, P, k, first=(root + 1) % P, mode="reduce")
    elif algorithm == "ring":
        out = _ring_all_reduce(flat, axis_name, P)
    elif algorithm == "tree":
        out = _tree_reduce(flat, axis_name, P, root)
    else:
        out = _exchange_all_reduce(flat, axis_name, P)
    return _finish(out, n, x)


def broadcast(
    x: jax.Array,
    axis_name: AxisName,
    algorithm: str = "linear_pipeline",
    root: int = 0,
    num_chunks: int | None = None,
) -> jax.Array:
    """`x` of device `root` of `axis_name`, on every device of the axis.

    ring and bidirectional_exchange all-reduce the root's data with zeros, which in the
    alpha-beta model costs the same as their scatter + all-gather broadcast.
    """
    flat, n, P, k = _prepare(x, axis_name, algorithm, num_chunks, "broadcast")
    root = _check_root(root, P)
    if P == 1 or n == 0:
        return _finish(flat, n, x)
    if algorithm == "linear_pipeline":
        out = _linear_pipeline(flat, axis_name, P, k, first=root, mode="broadcast")
    elif algorithm == "ring":
        out = _ring_all_reduce(_only_root(flat, axis_name, root), axis_name, P)
    elif algorithm == "tree":
        out = _tree_broadcast(flat, axis_name, P, root)
    else:
        out = _exchange_all_reduce(_only_root(flat, axis_name, root), axis_name, P)
    return _finish(out, n, x)


# ---------------------------------------------------------------- bucketing


def bucketed(
    tree: PyTree, bucket_bytes: int
) -> tuple[list[jax.Array], Callable[[Sequence[jax.Array]], PyTree]]:
    """Flattens a pytree of arrays into a few 1-D buckets of about `bucket_bytes`.

    Leaves are grouped by dtype (a bucket has one dtype) in tree order and packed
    greedily: a bucket is closed when the next leaf would take it past `bucket_bytes`;
    a leaf larger than that gets a bucket of its own. Returns `(buckets, unflatten)`,
    where `unflatten(buckets)` rebuilds the tree (shapes and dtypes) from buckets of
    the same sizes, e.g. after an all-reduce of each bucket, so a model with many small
    tensors pays one collective's latency per bucket instead of per tensor.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be positive")
    leaves, treedef = jax.tree.flatten(tree)
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    # plan: per bucket, a list of leaf indices; a bucket is open per dtype
    plans: list[list[int]] = []
    open_bucket: dict[np.dtype, tuple[int, int]] = {}  # dtype -> (plan index, bytes)
    for i, leaf in enumerate(leaves):
        nbytes = leaf.size * leaf.dtype.itemsize
        current = open_bucket.get(leaf.dtype)
        if current is not None and current[1] + nbytes <= bucket_bytes:
            plans[current[0]].append(i)
            open_bucket[leaf.dtype] = (current[0], current[1] + nbytes)
        else:
            plans.append([i])
            open_bucket[leaf.dtype] = (len(plans) - 1, nbytes)
    buckets = [jnp.concatenate([leaves[i].reshape(-1) for i in plan]) for plan in plans]
    shapes = [leaf.shape for leaf in leaves]
    dtypes = [leaf.dtype for leaf in leaves]

    def unflatten(new_buckets: Sequence[jax.Array]) -> PyTree:
        if len(new_buckets) != len(plans):
            raise ValueError(f"expected {len(plans)} buckets, got {len(new_buckets)}")
        out: list[jax.Array | None] = [None] * len(leaves)
        for plan, bucket in zip(plans, new_buckets, strict=True):
            offset = 0
            for i in plan:
                size = math.prod(shapes[i])
                out[i] = bucket[offset : offset + size].reshape(shapes[i]).astype(dtypes[i])
                offset += size
        return jax.tree.unflatten(treedef, out)

    return buckets, unflatten


def tree_all_reduce(
    tree: PyTree,
    axis_name: AxisName,
    algorithm: str = "linear_pipeline",
    bucket_bytes: int = 4 << 20,
    num_chunks: int | None = None,
) -> PyTree:
    """All-reduces every leaf of `tree` with one collective per bucket (see `bucketed`)."""
    buckets, unflatten = bucketed(tree, bucket_bytes)
    # A bucket may be shorter than num_chunks elements; it then gets one chunk per element.
    chunks = [None if num_chunks is None else min(num_chunks, b.size) for b in buckets]
    return unflatten(
        [all_reduce(b, axis_name, algorithm, k) for b, k in zip(buckets, chunks, strict=True)]
    )
