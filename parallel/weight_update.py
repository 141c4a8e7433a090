"""Weight-update sharding layouts: where each parameter's gradient, optimizer state and
update live over the data axis.

Xu et al., "Automatic cross-replica sharding of weight update in data-parallel training"
(docs/design.md, References), shard the weight update over all replicas. A parameter
with a dimension that the data-axis size divides keeps its own shape and shards that
dimension ("natural" layout, `Partitioner._add_data_axis`). A parameter with no such dimension
(BERT-large at data=2048: every dimension is 1024, 4096 or 30,528) would stay
replicated, and with it its optimizer state. Those get a *flat* layout instead:

    param [d_1, ..., d_n], dimension i split s_i ways over mesh axes (model, ...)
    -> [s_1, ..., s_k, local]       each model shard's elements, shard-major
    -> [s_1, ..., s_k, padded]      zero-padded to a multiple of the data size D
    spec (axes_1, ..., axes_k, data)
    -> [s_1, ..., s_k, D, padded/D] when k > 0: a row per replica
    spec (axes_1, ..., axes_k, data, None)

Splitting a sharded dimension into (shards, per-shard) and moving the shard factors
to the front keeps every model shard's elements on the devices that already hold
them, so the view costs no communication over `model`. With model shards in front,
each device's slice of [s, padded] would be [1, padded/D], split along its minor
dimension, which the TPU compiler reduce-scatters as an all-reduce and all-gathers
through padded tiles; as rows, [1, D, padded/D], the split is a major dimension (on
v3:64x64 the estimate of reduce-scattering eight model-split [1024, 1024] views over
2048 replicas drops from 0.137 to 0.078 ms, test_aot.py; the Transformer's whole step
in docs/design.md). Gradients are reduce-scattered
in this view, the optimizer state lives in it, the update is applied to the local
slice, and the new parameter is all-gathered and reshaped back. The zero padding
stays zero through Adam/LAMB/LARS/SGD updates (zero gradient, zero moments, zero
weight), so norms (global-norm clipping, LAMB trust ratios) are those of the real
elements. Leaves whose per-model-shard size is below the data size (scalars, a
2-class bias) stay replicated: their bytes are negligible and padding would dominate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec


def entry_axes(entry) -> tuple[str, ...]:
    """Mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
    return () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))


def without_axes(spec: PartitionSpec, axes: Collection[str]) -> PartitionSpec:
    """`spec` with the mesh axes in `axes` removed from every entry (an entry left with
    no axis becomes None, with one axis that name)."""
    entries = []
    for entry in spec:
        kept = tuple(m for m in entry_axes(entry) if m not in axes)
        entries.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*entries)


@dataclasses.dataclass(frozen=True)
class UpdateLayout:
    """One parameter's weight-update layout: natural (its own shape) or flat (see module).

    `spec` places the view (the natural shape, or [*prefix, padded] when flat); the
    other fields describe the flat view and are empty for a natural layout.
    """

    shape: tuple[int, ...]
    spec: PartitionSpec
    split: tuple[int, ...] = ()  # the shape with each sharded dim split (shards, per-shard)
    perm: tuple[int, ...] = ()  # moves the shard factors of `split` to the front
    prefix: tuple[int, ...] = ()  # kept (stack) dims whole, shard counts of sharded dims
    local_dims: tuple[int, ...] = ()  # per-shard dims after the permutation
    padded: int = 0  # the padded per-shard length (0: natural layout)
    rows: int = 0  # > 0: the padded elements as [rows, padded/rows], a row per replica

    @property
    def flat(self) -> bool:
        return self.padded > 0

    @property
    def view_shape(self) -> tuple[int, ...]:
        if not self.flat:
            return self.shape
        if not self.rows:
            return (*self.prefix, self.padded)
        return (*self.prefix, self.rows, self.padded // self.rows)

    @property
    def local(self) -> int:
        return math.prod(self.local_dims)

    def gathered_spec(self, data_axis: str) -> PartitionSpec:
        """The view's spec without the data axis (after the all-gather)."""
        return without_axes(self.spec, (data_axis,))

    def _keep_model_shards(self, y: jax.Array) -> jax.Array:
        """Pins the unpadded view [*prefix, local] to its model shards while tracing
        under a mesh: left to itself, the partitioner may pull the data split of the
        padded view back through the pad and reshape, and move elements across
        devices to match it."""
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            return y
        spec = PartitionSpec(*self.spec[: len(self.prefix)], None)
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, spec))

    def to_view(self, x: jax.Array) -> jax.Array:
        """The parameter-shaped `x` in this layout's view (identity when natural)."""
        if not self.flat:
            return x
        y = x.reshape(self.split).transpose(self.perm)
        y = self._keep_model_shards(y.reshape(*self.prefix, self.local))
        pad = [(0, 0)] * len(self.prefix) + [(0, self.padded - self.local)]
        return jnp.pad(y, pad).reshape(self.view_shape)

    def from_view(self, x: jax.Array) -> jax.Array:
        """The inverse of `to_view`: drops the padding and restores the parameter shape."""
        if not self.flat:
            return x
        x = x.reshape(*self.prefix, self.padded)
        y = self._keep_model_shards(x[..., : self.local])
        y = y.reshape(*self.prefix, *self.local_dims)
        inverse = [0] * len(self.perm)
        for i, p in enumerate(self.perm):
            inverse[p] = i
        return y.transpose(inverse).reshape(self.shape)


def natural_layout(shape: Sequence[int], spec: PartitionSpec) -> UpdateLayout:
    return UpdateLayout(shape=tuple(int(d) for d in shape), spec=spec)


def flat_layout(
    shape: Sequence[int],
    param_spec: PartitionSpec,
    data_axis: str,
    axis_sizes: Mapping[str, int],
    keep: Sequence[int] = (),
) -> UpdateLayout | None:
    """The flat layout of a parameter sharded by `param_spec`, or None when it does not
    apply (the data axis already used, a sharded dim not divisible by its shard count,
    or fewer per-shard elements than data replicas).

    Dimensions in `keep` (a scanned layer stack, unsharded) stay whole dimensions in
    front of the view, `[layers, *shards, padded]`, so each layer's elements remain
    separate: per-layer norms (LAMB trust ratios) are sums over the other dimensions.
    """
    shape = tuple(int(d) for d in shape)
    data_size = int(axis_sizes[data_axis])
    entries = list(param_spec) + [None] * (len(shape) - len(param_spec))
    split, prefix_pos, local_pos, prefix, prefix_entries = [], [], [], [], []
    for i, (dim, entry) in enumerate(zip(shape, entries, strict=True)):
        members = entry_axes(entry)
        if data_axis in members:
            return None
        shards = math.prod(int(axis_sizes[m]) for m in members)
        if i in keep:
            if shards > 1:
                return None
            prefix_pos.append(len(split))
            split.append(dim)
            prefix.append(dim)
            prefix_entries.append(None)
            continue
        if shards > 1:
            if dim % shards:
                return None
            prefix_pos.append(len(split))
            split.append(shards)
            prefix.append(shards)
            prefix_entries.append(entry)
            dim //= shards
        local_pos.append(len(split))
        split.append(dim)
    local = math.prod(split[i] for i in local_pos)
    if data_size <= 1 or local < data_size:
        return None
    if not prefix:
        split, local_pos = _tile_order(split, local_pos)
    local_dims = tuple(split[i] for i in local_pos)
    padded = -(-local // data_size) * data_size
    # A row per replica where model shards lead the view (a device's slice would be
    # [1, n]). Not under a kept stack dimension (BERT-large's [24, ...] views: 2 ms
    # slower per step on v3:64x64) nor for a 1-D view (already a major dimension; SSD's
    # small convolutions would leave rows shorter than a TPU tile: 0.75 ms slower).
    rows = data_size if prefix and not keep else 0
    return UpdateLayout(
        shape=shape,
        spec=PartitionSpec(*prefix_entries, data_axis, *([None] if rows else [])),
        split=tuple(split),
        perm=tuple(prefix_pos + local_pos),
        prefix=tuple(prefix),
        local_dims=local_dims,
        padded=padded,
        rows=rows,
    )


# The TPU's 32-bit tile: a 2-D array's minor dimension in rows of 128 lanes, its
# second-minor dimension in groups of 8 sublanes (layout T(8,128)).
TPU_TILE = (8, 128)


def _tile_order(split: list[int], local_pos: list[int]) -> tuple[list[int], list[int]]:
    """Orders a 1-D view's elements as a float32 TPU array stores them, where its last
    two dimensions are whole tiles: [..., r, c] -> [..., r/8, c/128, 8, 128]. Flattening
    in that order is a bitcast of the parameter on a TPU, where the row-major order is a
    relayout copy of every gradient and parameter each step (on v3:32x64, ten SSD-sized
    [3, 3, 256+, 256+] kernels: 20 copies, 1.06 against 0.62 ms, docs/design.md);
    the order does not matter elsewhere, since only the view sees it."""
    if len(local_pos) < 2:
        return split, local_pos
    r, c = split[local_pos[-2]], split[local_pos[-1]]
    if r % TPU_TILE[0] or c % TPU_TILE[1]:
        return split, local_pos
    # local_pos are the trailing positions of `split` when there is no prefix.
    lead = split[: local_pos[-2]]
    n = len(lead)
    tiled = [*lead, r // TPU_TILE[0], TPU_TILE[0], c // TPU_TILE[1], TPU_TILE[1]]
    return tiled, [*local_pos[:-2], n, n + 2, n + 1, n + 3]


def is_layout(x) -> bool:
    """Leaf predicate for trees of `UpdateLayout`."""
    return isinstance(x, UpdateLayout)


def layout_specs(layouts) -> object:
    """The PartitionSpec of each layout's view."""
    return jax.tree.map(lambda lay: lay.spec, layouts, is_leaf=is_layout)


def view_shapes(layouts, shapes) -> object:
    """ShapeDtypeStructs of the views of `shapes` (a params-shaped tree)."""
    return jax.tree.map(
        lambda lay, s: jax.ShapeDtypeStruct(lay.view_shape, s.dtype),
        layouts,
        shapes,
        is_leaf=is_layout,
    )


def to_views(tree, layouts) -> object:
    """Each parameter-shaped leaf of `tree` in its layout's view."""
    return jax.tree.map(lambda lay, x: lay.to_view(x), layouts, tree, is_leaf=is_layout)


def from_views(tree, layouts) -> object:
    """Each view-shaped leaf of `tree` back in its parameter's shape."""
    return jax.tree.map(lambda lay, x: lay.from_view(x), layouts, tree, is_leaf=is_layout)


def count_flat(layouts) -> int:
    """How many leaves use the flat (padded) view."""
    return sum(lay.flat for lay in jax.tree.leaves(layouts, is_leaf=is_layout))
