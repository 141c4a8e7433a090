"""The Partitioner: owns the mesh and turns logical annotations into shardings.

Everything else speaks logical axis names. The Partitioner maps them to mesh axes
(parallel/rules.py), decides where parameters and optimizer state live (replicated,
weight-update sharded, or FSDP), places activations, and assembles per-host numpy
batches into global `jax.Array`s.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from parallel.mesh import mesh_shape
from parallel.rules import DEFAULT_RULES, STACK_AXIS, Rules, logical_to_spec
from parallel.weight_update import entry_axes, flat_layout, natural_layout, without_axes

PyTree = Any
_ACTIVE: contextvars.ContextVar[Partitioner | None] = contextvars.ContextVar(
    "active_partitioner", default=None
)
_MANUAL: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "manual_axes", default=frozenset()
)


def _stack_dims(logical_axes: Sequence[str | None] | None) -> tuple[int, ...]:
    """Dimensions named `stack` (a scanned layer stack's leading axis)."""
    return tuple(i for i, a in enumerate(logical_axes or ()) if a == STACK_AXIS)


def is_logical_leaf(x: Any) -> bool:
    """Logical-axis trees hold tuples of names (or None) as leaves."""
    return x is None or (isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x))


@dataclasses.dataclass(frozen=True)
class DataLayout:
    """Where this host's rows sit in the global batch (t5x's DataLayout, simplified).

    Hosts whose devices hold the same batch rows (model axis spanning hosts) get the
    same `shard_index` and must feed identical data.
    """

    global_batch_size: int
    host_batch_size: int
    shard_index: int
    shard_count: int

    @property
    def host_slice(self) -> slice:
        start = self.shard_index * self.host_batch_size
        return slice(start, start + self.host_batch_size)


def _local_index(index: tuple, row_axis: int, layout: DataLayout, ndim: int) -> tuple:
    """A device's index into a global batch array, as an index into this host's rows
    (the row axis shifted by the host's first row)."""
    index = tuple(index) + (slice(None),) * (ndim - len(index))
    rows = index[row_axis]
    first = layout.host_slice.start
    start = (rows.start or 0) - first
    stop = layout.host_batch_size if rows.stop is None else rows.stop - first
    return (*index[:row_axis], slice(start, stop), *index[row_axis + 1 :])


def _assemble(
    local: np.ndarray,
    sharding: NamedSharding,
    global_shape: tuple[int, ...],
    row_axis: int,
    layout: DataLayout,
) -> jax.Array:
    """This host's rows `local` as its part of a global array. Sharded on its rows alone,
    JAX splits them; split beyond its rows (an image's height), each device is sent its
    own block of them, so no device receives what another holds."""
    if all(entry is None for i, entry in enumerate(sharding.spec) if i != row_axis):
        return jax.make_array_from_process_local_data(sharding, local, global_shape)
    return jax.make_array_from_callback(
        global_shape,
        sharding,
        lambda index: local[_local_index(index, row_axis, layout, local.ndim)],
    )


class Partitioner:
    """Owns the mesh: shardings for logical trees, jit, activation constraints, batches."""

    def __init__(
        self,
        mesh: Mesh,
        rules: Rules = DEFAULT_RULES,
        weight_update_sharding: bool = True,
        fsdp: bool = False,
        data_axis: str = "data",
        input_axes: Mapping[str, Sequence[str | None]] | None = None,
    ):
        """`input_axes`: per input field, the logical axes of one example's dimensions
        (after the batch's), for fields split beyond their rows, e.g. an image's height
        over `model` under spatial partitioning: each device is sent only its part of
        such a field, instead of every row whole."""
        if data_axis not in mesh.axis_names:
            raise ValueError(f"data axis {data_axis!r} is not a mesh axis {mesh.axis_names}.")
        self.mesh = mesh
        self.rules = rules
        self.weight_update_sharding = weight_update_sharding
        self.fsdp = fsdp
        self.data_axis = data_axis
        self.input_axes = {name: tuple(axes) for name, axes in (input_axes or {}).items()}

    # ---- specs and shardings -------------------------------------------------------
    @property
    def data_size(self) -> int:
        return int(self.mesh.shape[self.data_axis])

    @property
    def axis_sizes(self) -> dict[str, int]:
        return mesh_shape(self.mesh)

    def spec(self, logical_axes: Sequence[str | None] | None) -> PartitionSpec:
        """PartitionSpec for one array's logical axes (None = fully replicated)."""
        if logical_axes is None:
            return PartitionSpec()
        return logical_to_spec(logical_axes, self.rules)

    def sharding(self, spec: PartitionSpec) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def replicate(self, make: Callable[[], Any]) -> Any:
        """A value made on every device of the mesh (works across processes, unlike
        device_put, which needs addressable devices)."""
        return jax.jit(make, out_shardings=self.replicated())()

    @staticmethod
    def from_host(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
        """A global array from a full host copy that every process holds (a pretrained
        checkpoint each host read): each addressable device takes only its shard."""
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    def _add_data_axis(
        self, spec: PartitionSpec, shape: Sequence[int], avoid: Sequence[int] = ()
    ) -> PartitionSpec:
        """Shards the first free dimension divisible by the data-axis size over `data`.

        This is weight-update sharding (ZeRO-1): state that is replicated over the data
        axis gets split across it, so a gradient all-reduce becomes reduce-scatter +
        all-gather. Arrays with no such dimension (biases of odd size, scalars) stay put.
        Dimensions in `avoid` (a scanned layer stack) are never chosen: a scan slices
        one layer per step, and under FSDP a stack sharded over `data` would have to be
        gathered whole before the loop.
        """
        entries = list(spec) + [None] * (len(shape) - len(spec))
        used = {a for e in entries for a in entry_axes(e)}
        if self.data_axis in used or self.data_size == 1:
            return PartitionSpec(*entries)
        sizes = self.axis_sizes
        # Prefer an unsharded dimension; else share one with other axes, data-major, so a
        # reduce-scatter over data yields exactly this layout.
        for want_free in (True, False):
            for i, (dim, entry) in enumerate(zip(shape, entries, strict=True)):
                if i in avoid:
                    continue
                members = entry_axes(entry)
                if want_free != (not members):
                    continue
                split = int(np.prod([sizes[m] for m in members])) if members else 1
                if dim % (split * self.data_size) == 0:
                    entries[i] = self.data_axis if not members else (self.data_axis, *members)
                    return PartitionSpec(*entries)
        return PartitionSpec(*entries)

    def param_specs(self, logical: PyTree, shapes: PyTree) -> PyTree:
        """PartitionSpecs for parameters (FSDP adds the data axis to parameters too)."""

        def one(axes, shape):
            spec = self.spec(axes)
            return self._add_data_axis(spec, shape.shape, _stack_dims(axes)) if self.fsdp else spec

        return jax.tree.map(one, logical, shapes, is_leaf=is_logical_leaf)

    def update_layouts(self, logical: PyTree, shapes: PyTree) -> PyTree:
        """Where each parameter's gradient, optimizer state and update live (WUS): its own
        shape with a data-sharded dimension, or, when no dimension divides the data
        size, a flat zero-padded view sharded over data (parallel/weight_update.py)."""
        wus = self.weight_update_sharding or self.fsdp

        def one(axes, shape):
            spec = self.spec(axes)
            if not wus:
                return natural_layout(shape.shape, spec)
            with_data = self._add_data_axis(spec, shape.shape, _stack_dims(axes))
            if any(self.data_axis in entry_axes(e) for e in with_data):
                return natural_layout(shape.shape, with_data)
            # Also under FSDP: such a parameter itself stays replicated over data.
            flat = flat_layout(
                shape.shape, spec, self.data_axis, self.axis_sizes, keep=_stack_dims(axes)
            )
            return flat or natural_layout(shape.shape, spec)

        return jax.tree.map(one, logical, shapes, is_leaf=is_logical_leaf)

    def to_shardings(self, specs: PyTree) -> PyTree:
        return jax.tree.map(self.sharding, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))

    # ---- activations -----------------------------------------------------------------
    @contextlib.contextmanager
    def active(self) -> Iterator[Partitioner]:
        """Makes `constrain` place activations with this partitioner while tracing."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    @contextlib.contextmanager
    def manual_over(self, *axes: str) -> Iterator[None]:
        """Inside a shard_map manual over `axes`: `constrain` drops those axes."""
        token = _MANUAL.set(_MANUAL.get() | frozenset(axes))
        try:
            yield
        finally:
            _MANUAL.reset(token)

    def jit(
        self,
        fn: Callable,
        in_shardings: Any = None,
        out_shardings: Any = None,
        donate_argnums: int | Sequence[int] = (),
        static_argnums: int | Sequence[int] = (),
    ) -> Callable:
        """jax.jit with this partitioner active during tracing (for `constrain`)."""

        def traced(*args, **kwargs):
            # The abstract mesh lets shard_map regions place values on the auto axes.
            with self.active(), jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
                return fn(*args, **kwargs)

        kwargs = {}
        if in_shardings is not None:
            kwargs["in_shardings"] = in_shardings
        if out_shardings is not None:
            kwargs["out_shardings"] = out_shardings
        return jax.jit(
            traced, donate_argnums=donate_argnums, static_argnums=static_argnums, **kwargs
        )

    # ---- data --------------------------------------------------------------------------
    def batch_spec(self, ndim: int, name: str | None = None) -> PartitionSpec:
        """The spec of a batch array of `ndim` dimensions: rows over `batch`; the input
        field `name`'s other dimensions as `input_axes` names them (else whole)."""
        axes = self.input_axes.get(name) if name is not None else None
        if axes is None:
            return self.spec(("batch",) + (None,) * (ndim - 1))
        if len(axes) != ndim - 1:
            raise ValueError(
                f"input field {name!r} has {ndim - 1} dimensions per example, but its "
                f"input axes {axes} name {len(axes)}."
            )
        return self.spec(("batch", *axes))

    def steps_batch_spec(self, ndim: int, name: str | None = None) -> PartitionSpec:
        """The spec of several steps' batches stacked on a leading axis (one dispatch of
        several train steps): that axis unsharded, each step's rows as `batch_spec`."""
        return PartitionSpec(None, *self.batch_spec(ndim - 1, name))

    def input_spec(
        self, name: str | None, shape: Sequence[int], steps: bool = False
    ) -> PartitionSpec:
        """The spec of input field `name` of global `shape` (`steps`: several steps'
        batches stacked first): `batch_spec`, but a dimension beyond the rows that its
        mesh axes do not divide goes whole (a 300-pixel image over 8 devices)."""
        spec = (self.steps_batch_spec if steps else self.batch_spec)(len(shape), name)
        rows = 1 if steps else 0
        entries = []
        for i, entry in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
            names = () if entry is None else (entry,) if isinstance(entry, str) else entry
            ways = math.prod(self.axis_sizes[n] for n in names)
            entries.append(entry if i == rows or shape[i] % ways == 0 else None)
        return PartitionSpec(*entries)

    def batch_shards(self) -> int:
        """How many ways a batch's rows are split (the mesh axes `batch` maps to): a
        global batch must hold a multiple of this many rows."""
        mapped = self.batch_spec(1)[0]
        names = () if mapped is None else (mapped,) if isinstance(mapped, str) else mapped
        return math.prod(self.axis_sizes[name] for name in names)

    def constrain_batch(self, x: jax.Array) -> jax.Array:
        """Keeps an array's leading (batch) dimension sharded like the input batch."""
        return jax.lax.with_sharding_constraint(x, self.sharding(self.batch_spec(x.ndim)))

    def data_layout(self, global_batch_size: int) -> DataLayout:
        """This process's contiguous slice of a global batch of `global_batch_size` rows."""
        sharding = self.sharding(self.batch_spec(1))
        index_map = sharding.addressable_devices_indices_map((global_batch_size,))
        starts = sorted({(idx[0].start or 0) for idx in index_map.values()})
        stops = sorted({(idx[0].stop or global_batch_size) for idx in index_map.values()})
        start, stop = starts[0], stops[-1]
        host_batch = stop - start
        if host_batch <= 0 or global_batch_size % host_batch or start % host_batch:
            raise ValueError(
                f"global batch {global_batch_size} does not split into equal contiguous host "
                f"slices on mesh {self.axis_sizes}; use a batch divisible by the data axis."
            )
        return DataLayout(
            global_batch_size=global_batch_size,
            host_batch_size=host_batch,
            shard_index=start // host_batch,
            shard_count=global_batch_size // host_batch,
        )

    def host_to_global(
        self, host_batch: Mapping[str, np.ndarray], layout: DataLayout
    ) -> dict[str, jax.Array]:
        """Assembles this host's numpy batch into global arrays sharded over `batch`."""
        out = {}
        for name, local in host_batch.items():
            if local.shape[0] != layout.host_batch_size:
                raise ValueError(
                    f"host batch field {name!r} has {local.shape[0]} rows, expected "
                    f"{layout.host_batch_size} (global {layout.global_batch_size})."
                )
            global_shape = (layout.global_batch_size, *local.shape[1:])
            sharding = self.sharding(self.input_spec(name, global_shape))
            out[name] = _assemble(local, sharding, global_shape, 0, layout)
        return out

    def host_steps_to_global(
        self, stacked: Mapping[str, np.ndarray], layout: DataLayout
    ) -> dict[str, jax.Array]:
        """Assembles this host's batches of several steps, stacked on a leading axis
        ([steps, host rows, ...]), into global arrays [steps, global rows, ...]: one
        transfer for all of them, each step's rows sharded as `host_to_global` shards one
        batch."""
        out = {}
        for name, local in stacked.items():
            if local.ndim < 2 or local.shape[1] != layout.host_batch_size:
                raise ValueError(
                    f"stacked host batch field {name!r} has shape {local.shape}, expected "
                    f"[steps, {layout.host_batch_size}, ...] (global {layout.global_batch_size})."
                )
            global_shape = (local.shape[0], layout.global_batch_size, *local.shape[2:])
            sharding = self.sharding(self.input_spec(name, global_shape, steps=True))
            out[name] = _assemble(local, sharding, global_shape, 1, layout)
        return out

    def global_to_host(
        self, arrays: Mapping[str, jax.Array], layout: DataLayout
    ) -> dict[str, np.ndarray]:
        """This host's rows of batch-sharded global arrays (the inverse of host_to_global)."""
        out = {}
        for name, arr in arrays.items():
            host = np.empty((layout.host_batch_size, *arr.shape[1:]), arr.dtype)
            for shard in arr.addressable_shards:
                host[_local_index(shard.index, 0, layout, arr.ndim)] = np.asarray(shard.data)
            out[name] = host
        return out

    def gather_host_stats(
        self, stats: Mapping[str, np.ndarray], layout: DataLayout
    ) -> dict[str, np.ndarray]:
        """Stacks every data shard's numpy stats: name -> [shard_count, ...] on every host.

        Hosts that feed the same rows (a model axis spanning hosts) hold the same stats;
        each shard is kept once, so sums over the leading axis count every example once.
        """
        if jax.process_count() == 1:
            return {k: np.asarray(v)[None] for k, v in stats.items()}
        from jax.experimental import multihost_utils

        tagged = {"__shard__": np.asarray(layout.shard_index, np.int32), **stats}
        gathered = multihost_utils.process_allgather(tagged)
        shard_ids = np.asarray(gathered.pop("__shard__"))
        _, keep = np.unique(shard_ids, return_index=True)
        return {k: np.asarray(v)[np.sort(keep)] for k, v in gathered.items()}


def manual_data_axis() -> str | None:
    """The data axis while tracing inside a shard_map manual over it, else None.

    Layers whose statistics span examples (batch norm) need explicit collectives only
    there: each replica sees just its own rows.
    """
    partitioner = _ACTIVE.get()
    if partitioner is None or partitioner.data_axis not in _MANUAL.get():
        return None
    return partitioner.data_axis


def shard_count(logical_axis: str) -> int:
    """How many ways the active mesh splits the logical axis (1 outside an active
    Partitioner, and for axes a surrounding shard_map has made manual: there shapes are
    already per device). Layers size per-device work by it, not by mesh axes."""
    partitioner = _ACTIVE.get()
    if partitioner is None:
        return 1
    mapped = partitioner.spec((logical_axis,))[0]
    if mapped is None:
        return 1
    names = (mapped,) if isinstance(mapped, str) else tuple(mapped)
    sizes = partitioner.axis_sizes
    manual = _MANUAL.get()
    count = 1
    for name in names:
        if name not in manual:
            count *= sizes[name]
    return count


def constrain_if_mapped(
    x: jax.Array, logical_axes: Sequence[str | None], *, axis: str
) -> jax.Array:
    """`constrain`, but only where the logical `axis` is split over the mesh; otherwise x
    is left for the compiler to place. For a constraint an option needs (sequence
    parallelism's split rows) that would only pin the default program: pinning the
    residual sums of BERT-large replicated costs 3% of the TPU compiler's step estimate.
    """
    partitioner = _ACTIVE.get()
    if partitioner is None or partitioner.spec((axis,))[0] is None:
        return x
    return constrain(x, logical_axes)


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """Places an activation by logical axes; a no-op outside an active Partitioner."""
    partitioner = _ACTIVE.get()
    if partitioner is None:
        return x
    spec = partitioner.spec(tuple(logical_axes))
    manual = _MANUAL.get()
    if not manual:
        return jax.lax.with_sharding_constraint(x, partitioner.sharding(spec))
    # In a shard_map manual over some axes, only the remaining (auto) axes can be named.
    mesh = jax.sharding.get_abstract_mesh()
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, without_axes(spec, manual)))
