"""The jitted train and eval steps shared by every task.

Train step: per-replica gradients with accumulation over K microbatches (loss
normalisers taken from the whole global batch, so K microbatches give the same update
as one batch), reduced over the data axis into the weight-update-sharded layout
(reduce-scatter), the optimizer update on those shards, then parameters constrained
back to their own layout (all-gather). Parameters with no dimension the data size
divides take part through a flat zero-padded view (parallel/weight_update.py): the
update runs on the view, whose parameter copy is sliced locally, and the new values
are gathered and reshaped back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from mlperf.task import Task
from mlperf.train_state import (
    UPDATED_MODEL_STATE,
    StateLayout,
    frozen_template,
    model_state_template,
)
from parallel.data_parallel import (
    ANNOTATIONS,
    GradReduction,
    annotated_value_and_grad,
    data_parallel_value_and_grad,
)
from parallel.partition import Partitioner, is_logical_leaf
from parallel.weight_update import from_views, is_layout, to_views

PyTree = Any
# aux key carrying updated non-trainable model state (batch-norm running statistics)
# from the loss to the step; never reported as a metric.
MODEL_STATE_KEY = "__model_state__"


def _subtree(tree: PyTree, template: PyTree) -> PyTree:
    """The leaves of `tree` at the paths of the nested dict `template`."""
    if not isinstance(template, dict):
        return tree
    return {k: _subtree(tree[k], v) for k, v in template.items()}


def _overwrite(tree: PyTree, updates: PyTree) -> PyTree:
    """`tree` with the leaves present in the nested dict `updates` replaced."""
    if not isinstance(updates, dict):
        return updates
    return {k: _overwrite(v, updates[k]) if k in updates else v for k, v in tree.items()}


def _split_microbatches(batch: PyTree, k: int) -> PyTree:
    """[b, ...] -> [K, b/K, ...]: K microbatches of this replica's rows."""
    return jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), batch)


def _split_global_microbatches(batch: PyTree, k: int, partitioner: Partitioner) -> PyTree:
    """[B, ...] -> [K, B/K, ...] for the global batch: microbatch i holds each replica's
    i-th block of rows (the shard_map path's microbatch i on every replica), so each
    device keeps its own rows and the split moves no data."""
    replicas = partitioner.data_size

    def one(x, name=None):
        rows = x.shape[0] // (replicas * k)
        y = x.reshape(replicas, k, rows, *x.shape[1:]).swapaxes(0, 1)
        y = y.reshape(k, replicas * rows, *x.shape[1:])
        spec = partitioner.input_spec(name, y.shape, steps=True)
        return jax.lax.with_sharding_constraint(y, partitioner.sharding(spec))

    if isinstance(batch, dict):  # an input field keeps its own split (input_axes)
        return {name: one(x, name) for name, x in batch.items()}
    return jax.tree.map(one, batch)


def make_train_step(
    task: Task,
    layout: StateLayout,
    partitioner: Partitioner,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    microbatches: int,
    grad_reduction: GradReduction | None = None,
) -> Callable:
    """Returns train_step(state, batch, key) -> (state, metrics), not yet jitted."""
    update_shardings = partitioner.to_shardings(layout.update_specs)
    param_shardings = layout.state_shardings["params"]
    # Where parameters live while computing gradients: never split over data (FSDP
    # gathers them here).
    compute_shardings = partitioner.to_shardings(
        jax.tree.map(partitioner.spec, layout.logical, is_leaf=is_logical_leaf)
    )

    has_model_state = model_state_template(layout) is not None
    # Frozen weights keep their values whatever the optimizer does to them (decoupled
    # weight decay would otherwise move them; their gradients are zero).
    frozen = frozen_template(layout)
    # Each replica and microbatch returns its own updated running statistics (an EMA
    # step from the same old value); their mean is one EMA step with the mean statistics.
    reduction = grad_reduction or GradReduction()
    annotated = reduction.path == ANNOTATIONS
    # (Annotation path: the statistics come from the global batch, not summed replicas.)
    model_state_scale = 1.0 / ((1 if annotated else partitioner.data_size) * microbatches)

    def loss_fn(params, batch, denominators, rng):
        model = layout.model(params)
        loss, aux = task.loss(model, batch, denominators, rng)
        if has_model_state:
            stats = nnx.to_pure_dict(nnx.state(model, UPDATED_MODEL_STATE))
            aux = {**aux, MODEL_STATE_KEY: stats}
        return loss, aux

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def local_grads(params, batch, denominators, rng):
        """One replica's loss, aux sums and gradient over its rows (K microbatches);
        on the annotation path, the same over the global batch."""
        if microbatches == 1:
            (loss, aux), grads = grad_fn(params, batch, denominators, rng)
            return loss, aux, grads
        if annotated:
            micro = _split_global_microbatches(batch, microbatches, partitioner)
        else:
            micro = _split_microbatches(batch, microbatches)

        def one(i):
            mb = jax.tree.map(lambda x: x[i], micro)
            (loss, aux), grads = grad_fn(params, mb, denominators, jax.random.fold_in(rng, i))
            return loss, aux, grads

        def body(carry, i):
            return jax.tree.map(jnp.add, carry, one(i)), None

        # The first microbatch seeds the accumulators (same types as the loop's values).
        total, _ = jax.lax.scan(body, one(0), jnp.arange(1, microbatches))
        return total

    if annotated:
        value_and_grads = annotated_value_and_grad(local_grads, layout.update_layouts)
    else:
        value_and_grads = data_parallel_value_and_grad(
            local_grads, partitioner, layout.update_layouts, reduction
        )
    # A flat view is all-gathered as a view (then unpadding and reshaping are local);
    # other leaves go straight to their parameter layout.
    gathered_shardings = jax.tree.map(
        lambda lay, param_sharding: (
            partitioner.sharding(lay.gathered_spec(partitioner.data_axis))
            if lay.flat
            else param_sharding
        ),
        layout.update_layouts,
        param_shardings,
        is_leaf=is_layout,
    )

    def train_step(state, batch, key):
        params = state["params"]
        rng = jax.random.fold_in(key, state["step"])
        denominators = task.denominators(batch)
        compute_params = jax.lax.with_sharding_constraint(params, compute_shardings)
        loss, aux, grads = value_and_grads(compute_params, batch, denominators, rng)
        # Weight-update sharding: each data replica updates only its slice.
        grads = jax.lax.with_sharding_constraint(grads, update_shardings)
        params_view = to_views(params, layout.update_layouts)
        params_view = jax.lax.with_sharding_constraint(params_view, update_shardings)
        updates, opt_state = tx.update(grads, state["opt_state"], params_view)
        updates = jax.lax.with_sharding_constraint(updates, update_shardings)
        new_view = optax.apply_updates(params_view, updates)
        new_view = jax.lax.with_sharding_constraint(new_view, gathered_shardings)
        new_params = from_views(new_view, layout.update_layouts)
        if frozen is not None:
            new_params = _overwrite(new_params, _subtree(params, frozen))
        if has_model_state:
            stats = jax.tree.map(lambda x: x * model_state_scale, aux.pop(MODEL_STATE_KEY))
            new_params = _overwrite(new_params, stats)
        new_params = jax.lax.with_sharding_constraint(new_params, param_shardings)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": schedule(state["step"]),
            **aux,
        }
        new_state = {"step": state["step"] + 1, "params": new_params, "opt_state": opt_state}
        return new_state, metrics

    return train_step


def scan_steps(train_step: Callable) -> Callable:
    """train_steps(state, batches, key) -> (state, metrics): `train_step` over batches
    stacked on a leading axis, one after the other in one program (`jax.lax.scan`), for
    `train.steps_per_dispatch`. Each step is the single step's own computation: its RNG
    and learning rate follow the state's step counter, so k steps here are the k steps
    one at a time. The metrics are every step's, stacked ([steps])."""

    def train_steps(state, batches, key):
        return jax.lax.scan(lambda carry, batch: train_step(carry, batch, key), state, batches)

    return train_steps


def make_eval_step(task_fn: Callable, layout: StateLayout) -> Callable:
    """Returns eval_step(params, batch) -> task_fn(model, batch): `Task.eval_sums` (sums
    over the batch's real examples) or `Task.eval_outputs` (per-example outputs)."""

    def eval_step(params, batch):
        return task_fn(layout.model(params), batch)

    return eval_step


def batch_abstract(
    partitioner: Partitioner, example_spec: dict, global_batch_size: int, steps: int = 1
) -> dict:
    """ShapeDtypeStructs (with batch shardings) of a global batch from per-example specs;
    `steps` > 1: that many batches stacked on a leading, unsharded axis (`scan_steps`)."""
    out = {}
    for name, (shape, dtype) in example_spec.items():
        full = (global_batch_size, *shape) if steps == 1 else (steps, global_batch_size, *shape)
        spec = partitioner.input_spec(name, full, steps=steps > 1)
        out[name] = jax.ShapeDtypeStruct(full, dtype, sharding=partitioner.sharding(spec))
    return out


def spec_of(host_batch: dict) -> dict:
    """Per-example (shape, dtype) of a host batch."""
    return {name: (x.shape[1:], x.dtype) for name, x in host_batch.items()}
