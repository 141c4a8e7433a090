"""Sharded train state: abstract init -> logical axes -> shardings -> jitted init.

The full parameter set never exists on one host: the model is built abstractly
(`nnx.eval_shape`), its logical annotations become PartitionSpecs through the
Partitioner, and a jitted initialiser writes each shard straight onto its devices.
The state is a plain dict {step, params, opt_state} of arrays (params as a nested
dict), which optax, the step functions and checkpoints all handle directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from input_pipeline.input_errors import InputError
from mlperf.layers.linear import FrozenParam
from parallel.partition import Partitioner, is_logical_leaf
from parallel.rules import STACK_AXIS
from parallel.weight_update import count_flat, layout_specs, to_views, view_shapes

PyTree = Any


@dataclasses.dataclass
class StateLayout:
    """Everything the loop needs to build, shard and rebuild the model state."""

    graphdef: Any
    abstract_state: Any  # nnx.State template used to rebuild a model from pure params
    logical: PyTree  # params-shaped tree of logical axis tuples
    param_specs: PyTree
    # WUS: where gradients, optimizer state and updates live, and in which shape: each
    # parameter's own, or a flat padded view (UpdateLayout)
    update_layouts: PyTree
    state_shardings: PyTree  # shardings of {step, params, opt_state}
    abstract_train_state: PyTree  # ShapeDtypeStructs with shardings

    @property
    def update_specs(self) -> PyTree:
        """PartitionSpecs of the update views."""
        return layout_specs(self.update_layouts)

    def model(self, params: PyTree) -> nnx.Module:
        """Rebuilds the NNX module around a pure params dict (inside a trace)."""
        state = jax.tree.map(lambda x: x, self.abstract_state)  # fresh copy of the template
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state)


def _logical_axes(abstract_state: nnx.State) -> PyTree:
    return nnx.to_pure_dict(
        abstract_state,
        extract_fn=lambda v: tuple(v.get_metadata().get("out_sharding") or ()) or None,
    )


def abstract_model(build_model: Callable[[nnx.Rngs], nnx.Module], seed: int) -> nnx.Module:
    """The model with shapes only (nothing allocated): what layouts are built from."""
    return nnx.eval_shape(lambda: build_model(nnx.Rngs(seed)))


def stacked_leaves(model: nnx.Module) -> PyTree:
    """A state-shaped tree of bools: True where a leaf's leading dimension is a scanned
    layer stack (logical axis `stack`), e.g. BERT with `model.scan_layers`."""
    return jax.tree.map(
        lambda axes: bool(axes) and axes[0] == STACK_AXIS,
        _logical_axes(nnx.state(model)),
        is_leaf=is_logical_leaf,
    )


# Model state the train step writes back from the forward pass (batch-norm running
# statistics); frozen weights are non-trainable state too but never change.
UPDATED_MODEL_STATE = nnx.All(nnx.BatchStat, nnx.Not(FrozenParam))


def model_state_template(layout: StateLayout) -> PyTree | None:
    """The params-subtree of non-trainable model state the forward pass updates
    (batch-norm running statistics), or None if the model has none (BERT)."""
    stats = nnx.to_pure_dict(layout.abstract_state.filter(UPDATED_MODEL_STATE))
    return stats if jax.tree.leaves(stats) else None


def frozen_template(layout: StateLayout) -> PyTree | None:
    """The params-subtree of frozen weights (FrozenParam), or None if there are none."""
    frozen = nnx.to_pure_dict(layout.abstract_state.filter(FrozenParam))
    return frozen if jax.tree.leaves(frozen) else None


def param_count(layout: StateLayout) -> int:
    shapes = layout.abstract_train_state["params"]
    return int(sum(x.size for x in jax.tree.leaves(shapes)))


def build_state_layout(
    model: nnx.Module, tx: optax.GradientTransformation, partitioner: Partitioner
) -> StateLayout:
    """Abstract model (`abstract_model`) -> logical axes -> PartitionSpecs for params and
    optimizer state."""
    graphdef, abstract_state = nnx.split(model)
    logical = _logical_axes(abstract_state)
    shapes = nnx.to_pure_dict(abstract_state)
    # Parameters without annotations are replicated: fill in all-None axes.
    logical = jax.tree.map(
        lambda axes, s: axes if axes is not None else (None,) * len(s.shape),
        logical,
        shapes,
        is_leaf=is_logical_leaf,
    )
    param_specs = partitioner.param_specs(logical, shapes)
    update_layouts = partitioner.update_layouts(logical, shapes)
    # The optimizer state is shaped like the update views (flat padded views where no
    # dimension of a parameter divides the data axis).
    abstract_opt = jax.eval_shape(tx.init, view_shapes(update_layouts, shapes))
    update_shardings = partitioner.to_shardings(layout_specs(update_layouts))
    # Optimizer leaves shaped like params follow the update (WUS) layout; counters etc.
    # are replicated.
    opt_shardings = optax.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        abstract_opt,
        update_shardings,
        transform_non_params=lambda _: partitioner.replicated(),
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
    )
    state_shardings = {
        "step": partitioner.replicated(),
        "params": partitioner.to_shardings(param_specs),
        "opt_state": opt_shardings,
    }
    abstract_train_state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        {"step": jax.ShapeDtypeStruct((), jnp.int32), "params": shapes, "opt_state": abstract_opt},
        state_shardings,
    )
    return StateLayout(
        graphdef,
        abstract_state,
        logical,
        param_specs,
        update_layouts,
        state_shardings,
        abstract_train_state,
    )


def init_train_state(
    build_model: Callable[[nnx.Rngs], nnx.Module],
    tx: optax.GradientTransformation,
    layout: StateLayout,
    partitioner: Partitioner,
    seed: int,
) -> PyTree:
    """Initialises the sharded state on the mesh (each device writes its own shards)."""

    def init():
        model = build_model(nnx.Rngs(seed))
        # Non-trainable model state (batch-norm running statistics, nnx.BatchStat) rides
        # in `params` next to the weights: it gets zero gradients, and the train step
        # overwrites it with the updated values after the optimizer step (steps.py).
        params = nnx.to_pure_dict(nnx.state(model, (nnx.Param, nnx.BatchStat)))
        return {
            "step": jnp.zeros((), jnp.int32),
            "params": params,
            "opt_state": tx.init(to_views(params, layout.update_layouts)),
        }

    return partitioner.jit(init, out_shardings=layout.state_shardings)()


class StoredStateCodec:
    """Checkpoints hold every optimizer leaf in its parameter's own shape.

    A flat weight-update view ([*shards, padded], parallel/weight_update.py) has a shape
    that depends on the data-axis size, so a checkpoint of views could only be restored
    onto the same data size. `encode` turns the views back into parameter shapes before
    a save and `decode` makes the views of the restoring mesh after a restore: a
    checkpoint written at data=8 resumes at data=4 or 16. The conversion is a reshape
    and a zero pad or cut (the padding is zero), so the values are exact.
    """

    def __init__(self, layout: StateLayout, tx: optax.GradientTransformation, partitioner):
        layouts = layout.update_layouts
        abstract = layout.abstract_train_state
        param_shardings = layout.state_shardings["params"]

        def tree_map_opt(fn, opt_state, *rest):
            return optax.tree_map_params(
                tx,
                fn,
                opt_state,
                *rest,
                transform_non_params=lambda x: x,
                is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
            )

        stored_opt = tree_map_opt(
            lambda view, lay, sh: jax.ShapeDtypeStruct(lay.shape, view.dtype, sharding=sh),
            abstract["opt_state"],
            layouts,
            param_shardings,
        )
        self.abstract = {**abstract, "opt_state": stored_opt}
        stored_shardings = jax.tree.map(lambda s: s.sharding, stored_opt)
        self._encode = partitioner.jit(
            lambda opt: tree_map_opt(lambda v, lay: lay.from_view(v), opt, layouts),
            out_shardings=stored_shardings,
        )
        self._decode = partitioner.jit(
            lambda opt: tree_map_opt(lambda v, lay: lay.to_view(v), opt, layouts),
            out_shardings=layout.state_shardings["opt_state"],
        )

    def encode(self, state: PyTree) -> PyTree:
        """The train state with its optimizer leaves in parameter shapes (for saving)."""
        return {**state, "opt_state": self._encode(state["opt_state"])}

    def decode(self, stored: PyTree) -> PyTree:
        """A restored stored state in this mesh's update views."""
        return {**stored, "opt_state": self._decode(stored["opt_state"])}


def stored_state_codec(
    layout: StateLayout, tx: optax.GradientTransformation, partitioner
) -> StoredStateCodec | None:
    """The codec when some leaf uses a flat view; None when every optimizer leaf already
    has its parameter's shape (the stored form is then the state itself)."""
    if not count_flat(layout.update_layouts):
        return None
    return StoredStateCodec(layout, tx, partitioner)


def _path_key(path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)


def load_params(
    state: PyTree,
    host_params: PyTree,
    tx: optax.GradientTransformation,
    layout: StateLayout,
    partitioner: Partitioner,
) -> PyTree:
    """`state` with the parameters found in `host_params` (a nested dict of full host
    arrays: the params tree or any sub-tree, e.g. a pretrained backbone) replaced, each
    leaf written straight into its sharding (every host reads its own shards from its
    copy), and the optimizer state initialised again from the new parameters."""
    given = {_path_key(p): x for p, x in jax.tree_util.tree_flatten_with_path(host_params)[0]}
    flat, treedef = jax.tree_util.tree_flatten_with_path(state["params"])
    shardings = jax.tree.leaves(layout.state_shardings["params"])
    leaves, used = [], 0
    for (path, old), sharding in zip(flat, shardings, strict=True):
        host = given.get(_path_key(path))
        if host is None:
            leaves.append(old)
            continue
        if tuple(host.shape) != tuple(old.shape):
            name = "/".join(str(k) for k in _path_key(path))
            raise InputError(f"pretrained {name} has shape {host.shape}, the model {old.shape}")
        host = np.asarray(host, old.dtype)
        leaves.append(partitioner.from_host(host, sharding))
        used += 1
    if used != len(given):
        unknown = sorted(set(given) - {_path_key(p) for p, _ in flat})
        raise InputError(f"pretrained parameters not in the model: {unknown[:3]}")
    params = jax.tree_util.tree_unflatten(treedef, leaves)

    def init_opt(p):
        return tx.init(to_views(p, layout.update_layouts))

    opt_state = partitioner.jit(init_opt, out_shardings=layout.state_shardings["opt_state"])(params)
    return {**state, "params": params, "opt_state": opt_state}
