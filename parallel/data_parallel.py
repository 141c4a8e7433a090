"""Per-replica gradients over the data axis, reduced explicitly (WUS: reduce-scatter).

The gradient computation runs inside a `shard_map` that is manual over the data axis
only (tensor parallelism over `model` stays with XLA's partitioner). Each data replica
differentiates its own slice of the global batch, with parameters cast to "varying"
so JAX does not insert its own all-reduce, and the partial gradients are then
reduced by us:
- weight-update sharding: `psum_scatter` along the dimension the update is sharded
  on, so the compiled step has a true reduce-scatter (and the later parameter
  all-gather) on every backend, not an all-reduce followed by a slice; arrays with no
  dimension the data size divides are first put in their flat, zero-padded view
  (parallel/weight_update.py) and scattered along its last dimension;
- otherwise (WUS off, or leaves too small for the flat view): `psum`, an all-reduce.
- one data replica: no collective at all (the sum is the gradient; XLA:CPU would run a
  one-device all-reduce as a copy of every gradient).
- another algorithm (`grad_allreduce`: linear_pipeline, ring, tree,
  bidirectional_exchange from parallel/collectives.py): the gradients are flattened
  into buckets, all-reduced with that algorithm (ppermute only), and each replica then
  keeps its own slice where the update is weight-update sharded.

Gradients are summed in `GradReduction.dtype` (`parallel.grad_reduce_dtype`): float32
(default), bfloat16 (Google's v0.7 BERT: half the bytes on the wire), or float16 with a
static loss scale (Lin et al.'s T4 cluster): each replica's gradient is multiplied by the
scale before the cast so that small values stay representable, and the sum is divided by
it after the cast back. Microbatch accumulation and the update stay in float32.
XLA:CPU cannot compile narrow collectives inside this program (its all-reduce promotion
pass aborts), and would widen them to float32 anyway: on CPU devices the gradients are
rounded to the narrow type and summed in float32, which keeps the rounding a run sees
and the tests check; TPU and GPU programs sum in the narrow type itself.

`parallel.grad_path=annotations` is the alternative without any of this
(`annotated_value_and_grad`): the loss and gradient run on the global batch with only
sharding annotations, and XLA's SPMD partitioner inserts the reduction itself (as
MaxText and big_vision do); it supports XLA's float32 reduction only. docs/design.md
compares the two.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from parallel import collectives
from parallel.partition import Partitioner
from parallel.weight_update import UpdateLayout, entry_axes, is_layout, to_views

XLA = "xla"
GRAD_ALLREDUCE_ALGORITHMS = (XLA, *collectives.ALGORITHMS)
GRAD_REDUCE_DTYPES = ("float32", "bfloat16", "float16")
SHARD_MAP = "shard_map"
ANNOTATIONS = "annotations"
GRAD_PATHS = (SHARD_MAP, ANNOTATIONS)

PyTree = Any


def _data_dim(spec: PartitionSpec, data_axis: str) -> int | None:
    """Index of the dimension whose sharding includes the data axis, if any."""
    for i, entry in enumerate(spec):
        if data_axis in entry_axes(entry):
            return i
    return None


def _manual_spec(spec: PartitionSpec, data_axis: str) -> PartitionSpec:
    """The spec seen by a shard_map manual over the data axis only."""
    dim = _data_dim(spec, data_axis)
    if dim is None:
        return PartitionSpec()
    return PartitionSpec(*([None] * dim), data_axis)


@dataclasses.dataclass(frozen=True)
class GradReduction:
    """How per-replica gradients are summed over the data axis."""

    algorithm: str = XLA  # or one of parallel.collectives.ALGORITHMS
    bucket_bytes: int = 4 << 20  # custom algorithms: one collective per bucket this size
    num_chunks: int | None = None  # linear_pipeline chunks; None: the cost model's choice
    dtype: str = "float32"  # the gradients' type while they are summed over data
    loss_scale: float = 1024.0  # float16 only: gradients x scale before the cast, / after
    path: str = SHARD_MAP  # or ANNOTATIONS: XLA's partitioner places the reduction

    @classmethod
    def from_config(cls, parallel: Any) -> GradReduction:
        """From a config's `parallel` block (missing keys: the defaults); ValueError
        naming the key for a value that cannot work."""
        return cls(
            algorithm=parallel.get("grad_allreduce", XLA),
            bucket_bytes=parallel.get("grad_bucket_bytes", 4 << 20),
            num_chunks=parallel.get("grad_allreduce_chunks", 0) or None,
            dtype=parallel.get("grad_reduce_dtype", "float32"),
            loss_scale=parallel.get("grad_loss_scale", 1024.0),
            path=parallel.get("grad_path", SHARD_MAP),
        )

    def __post_init__(self):
        if self.path not in GRAD_PATHS:
            raise ValueError(
                f"parallel.grad_path={self.path!r} is unknown; use one of {', '.join(GRAD_PATHS)}."
            )
        if self.path == ANNOTATIONS and (self.algorithm != XLA or self.dtype != "float32"):
            raise ValueError(
                "parallel.grad_path=annotations leaves the gradient reduction to XLA, in "
                f"float32: grad_allreduce={self.algorithm!r} and grad_reduce_dtype="
                f"{self.dtype!r} need parallel.grad_path=shard_map (or grad_allreduce=xla "
                "and grad_reduce_dtype=float32)."
            )
        if self.dtype not in GRAD_REDUCE_DTYPES:
            raise ValueError(
                f"parallel.grad_reduce_dtype={self.dtype!r} is unknown; use one of "
                f"{', '.join(GRAD_REDUCE_DTYPES)}."
            )
        if not self.loss_scale > 0:
            raise ValueError(f"parallel.grad_loss_scale={self.loss_scale} must be > 0.")
        if self.algorithm not in GRAD_ALLREDUCE_ALGORITHMS:
            raise ValueError(
                f"parallel.grad_allreduce={self.algorithm!r} is unknown; use one of "
                f"{', '.join(GRAD_ALLREDUCE_ALGORITHMS)}."
            )
        if self.bucket_bytes < 1:
            raise ValueError(f"parallel.grad_bucket_bytes={self.bucket_bytes} must be >= 1.")
        if self.num_chunks is not None and self.num_chunks < 1:
            raise ValueError(f"parallel.grad_allreduce_chunks={self.num_chunks} must be >= 1.")


def reduce_gradients(
    grads: PyTree,
    layouts: PyTree,
    data_axis: str,
    how: GradReduction = GradReduction(),
    narrow_collectives: bool = True,
) -> PyTree:
    """Sums per-replica gradients over `data_axis` into their update layouts (a tree of
    `UpdateLayout`): leaves whose layout has a data dimension come back as this
    replica's slice of the sum in the layout's view, in the gradients' own dtype (the
    sum itself runs in `how.dtype`)."""
    if how.dtype == "float32":
        return _reduce(grads, layouts, data_axis, how)
    wire = jnp.dtype(how.dtype)
    scale = how.loss_scale if how.dtype == "float16" else 1.0
    dtypes = jax.tree.map(lambda g: g.dtype, grads)
    sent = jax.tree.map(lambda g: (g * scale).astype(wire), grads)
    if not narrow_collectives:  # XLA:CPU: the rounding without the narrow collective
        sent = jax.tree.map(lambda g, d: g.astype(d), sent, dtypes)
    summed = _reduce(sent, layouts, data_axis, how)
    return jax.tree.map(lambda g, d: g.astype(d) / scale, summed, dtypes)


def _reduce(grads: PyTree, layouts: PyTree, data_axis: str, how: GradReduction) -> PyTree:
    if jax.lax.axis_size(data_axis) == 1:
        # One replica: the sum is the gradient itself. XLA:CPU runs a one-device
        # all-reduce as a copy of every gradient (BERT-base: 440 MB a step), so none is
        # emitted; the caller's shard_map skips its replication check for this.
        return to_views(grads, layouts)
    if how.algorithm != XLA:
        return _custom_reduce(grads, layouts, data_axis, how)

    def one(layout, g):
        dim = _data_dim(layout.spec, data_axis)
        if dim is None:
            return jax.lax.psum(g, data_axis)
        view = layout.to_view(g)
        return _scatter_model_local(view, layout, data_axis, dim)

    return jax.tree.map(one, layouts, grads, is_leaf=is_layout)


def _scatter_model_local(view: jax.Array, layout: UpdateLayout, data_axis: str, dim: int):
    """psum_scatter over data of a view. A view also sharded over other (auto) axes on
    other dimensions is scattered inside a shard_map manual over those axes too, so
    each device reduces only its own model shard's elements: a reduce-scatter manual
    over data alone first gathers the auto axes (measured: the full [hidden, mlp]
    gradient on every model shard). A dimension shared by data and model, data-major,
    is left to XLA (its model-local scatter would give the model-major order)."""
    scatter = functools.partial(
        jax.lax.psum_scatter, axis_name=data_axis, scatter_dimension=dim, tiled=True
    )
    spec = layout.gathered_spec(data_axis)
    other_axes = {a for entry in spec for a in entry_axes(entry)}
    if not other_axes or entry_axes(layout.spec[dim]) != (data_axis,):
        return scatter(view)
    return jax.shard_map(
        scatter,
        mesh=jax.sharding.get_abstract_mesh(),
        in_specs=spec,
        out_specs=spec,
        axis_names=other_axes,
    )(view)


def _custom_reduce(grads: PyTree, layouts: PyTree, data_axis: str, how: GradReduction) -> PyTree:
    summed = collectives.tree_all_reduce(
        grads, data_axis, how.algorithm, how.bucket_bytes, how.num_chunks
    )
    index = jax.lax.axis_index(data_axis)
    size = jax.lax.axis_size(data_axis)

    def keep_own_slice(layout, g):
        dim = _data_dim(layout.spec, data_axis)
        if dim is None:
            return g
        view = layout.to_view(g)
        n = view.shape[dim] // size
        return jax.lax.dynamic_slice_in_dim(view, index * n, n, axis=dim)

    return jax.tree.map(keep_own_slice, layouts, summed, is_leaf=is_layout)


def data_parallel_value_and_grad(
    local_fn: Callable[[PyTree, PyTree, PyTree, jax.Array], tuple[jax.Array, dict, PyTree]],
    partitioner: Partitioner,
    layouts: PyTree,
    how: GradReduction = GradReduction(),
) -> Callable:
    """Wraps `local_fn(params, local_batch, shared, rng) -> (loss, aux, grads)`.

    Returns fn(params, batch, shared, rng) -> (loss, aux, grads) where `batch` is the
    global batch (sharded over data), loss and aux are summed over replicas (tasks
    return contributions normalised by global denominators, so sums are the global
    values), and grads come back in their update (WUS) layouts, a tree of `UpdateLayout`
    (`Partitioner.update_layouts`).
    """
    axis = partitioner.data_axis
    narrow_collectives = partitioner.mesh.devices.flat[0].platform != "cpu"
    one_replica = partitioner.data_size == 1
    grad_out_specs = jax.tree.map(
        lambda layout: _manual_spec(layout.spec, axis), layouts, is_leaf=is_layout
    )

    def per_replica(params, batch, shared, rng):
        # Distinct dropout masks per replica; parameters vary per replica for autodiff.
        rng = jax.random.fold_in(rng, jax.lax.axis_index(axis))
        params = jax.tree.map(lambda p: jax.lax.pcast(p, axis, to="varying"), params)
        with partitioner.manual_over(axis):
            loss, aux, grads = local_fn(params, batch, shared, rng)
        grads = reduce_gradients(grads, layouts, axis, how, narrow_collectives)
        if not one_replica:
            loss = jax.lax.psum(loss, axis)
            aux = jax.tree.map(lambda a: jax.lax.psum(a, axis), aux)
        return loss, aux, grads

    def fn(params, batch, shared, rng):
        batch_specs = jax.tree.map(lambda _: PartitionSpec(axis), batch)
        mapped = jax.shard_map(
            per_replica,
            mesh=partitioner.mesh,
            in_specs=(PartitionSpec(), batch_specs, PartitionSpec(), PartitionSpec()),
            out_specs=(PartitionSpec(), PartitionSpec(), grad_out_specs),
            axis_names={axis},
            # Custom collectives return sums typed "varying" although every replica holds
            # the same value, and one replica's gradients are returned unsummed (typed
            # "varying" too); jax has no cast back to invariant, so skip the check there.
            check_vma=how.algorithm == XLA and not one_replica,
        )
        return mapped(params, batch, shared, rng)

    return fn


def annotated_value_and_grad(
    global_fn: Callable[[PyTree, PyTree, PyTree, jax.Array], tuple[jax.Array, dict, PyTree]],
    layouts: PyTree,
) -> Callable:
    """The annotation-only counterpart of `data_parallel_value_and_grad`.

    `global_fn(params, batch, shared, rng) -> (loss, aux, grads)` runs on the global batch
    (sharded over data by its input sharding); no manual region, no explicit collective:
    the caller's sharding constraint on the returned views (the weight-update layouts)
    is all XLA's partitioner is told, and it chooses the reduction (an all-reduce, or a
    reduce-scatter where its passes form one). Dropout masks are drawn for the global
    batch from one key, so they differ from the shard_map path's per-replica masks.
    """

    def fn(params, batch, shared, rng):
        loss, aux, grads = global_fn(params, batch, shared, rng)
        views = jax.tree.map(lambda lay, g: lay.to_view(g), layouts, grads, is_leaf=is_layout)
        return loss, aux, views

    return fn
