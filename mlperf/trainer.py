"""What init builds for a run: mesh, partitioner, prepared task, optimizer, state layout.

`build_trainer(config)` validates the config, builds the mesh and the data (cached) and
the sharded state layout; the `Trainer` it returns compiles the train step and makes the
initial state. `mlperf/train.py` runs the loop with it; tools (inspect, bench, export,
the sharding tables) use it without training.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np
import optax

from mlperf.evaluate import Evaluator, evaluate_sets
from mlperf.optimizer import build_optimizer
from mlperf.pretrained import Pretrained
from mlperf.steps import batch_abstract, make_train_step, scan_steps
from mlperf.task import EvalPlan, Phase, Task
from mlperf.tasks import get_task
from mlperf.train_state import (
    StateLayout,
    abstract_model,
    build_state_layout,
    init_train_state,
    load_params,
    stacked_leaves,
)
from mlperf.validate import ConfigError, check_cache_dir, check_data_dir, validate
from parallel.data_parallel import GradReduction
from parallel.mesh import MeshShapeError, build_mesh, select_devices
from parallel.partition import Partitioner
from parallel.rules import rules_from_config


@dataclasses.dataclass
class Trainer:
    """Everything built during init: the loop and tools (inspect, bench) use it."""

    config: Any
    task: Task
    partitioner: Partitioner
    phases: tuple[Phase, ...]
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    layout: StateLayout
    _pretrained: Any = dataclasses.field(default=None, init=False, repr=False)

    def pretrained(self) -> Pretrained | None:
        """The task's starting point (`Task.pretrained`: a BERT checkpoint, an ImageNet
        backbone), checked against the model's names and shapes; None: the random init."""
        if self._pretrained is None:
            params = self.layout.abstract_train_state["params"]
            self._pretrained = self.task.pretrained(params) or False
        return self._pretrained or None

    data_prep_s: float = 0.0  # time build_trainer spent preparing the data

    @property
    def eval_plan(self) -> EvalPlan:
        """The in-loop eval's batch (`Task.eval_plan`)."""
        return self.task.eval_plan()

    def jitted_train_step(self, microbatches: int | None = None, steps: int = 1):
        """The train step, jitted with state/batch shardings and state donation; it
        accumulates gradients over `microbatches` (by default the first phase's). `steps`
        > 1: that many steps in one program over batches stacked on a leading axis
        (`scan_steps`, for `train.steps_per_dispatch`), returning every step's metrics."""
        reduction = GradReduction.from_config(self.config.parallel)
        step = make_train_step(
            self.task,
            self.layout,
            self.partitioner,
            self.tx,
            self.schedule,
            microbatches or self.phases[0].microbatches,
            reduction,
        )
        return self.partitioner.jit(
            step if steps == 1 else scan_steps(step),
            in_shardings=(self.layout.state_shardings, None, self.partitioner.replicated()),
            out_shardings=(self.layout.state_shardings, self.partitioner.replicated()),
            donate_argnums=(0,),
        )

    def lower_train_step(self, phase: Phase, platforms: tuple[str, ...] = (), steps: int = 1):
        """Lowers the train step for one phase's global batch shapes (nothing allocated);
        for `platforms` ("cuda", "tpu") instead of the mesh's own, when given: a program
        to read, not to compile here. `steps` > 1: the program of that many steps over
        stacked batches (`jitted_train_step`)."""
        abstract = batch_abstract(
            self.partitioner, self.task.example_spec(phase), phase.global_batch_size, steps
        )
        key = jax.ShapeDtypeStruct(
            (), jax.random.key(0).dtype, sharding=self.partitioner.replicated()
        )
        step = self.jitted_train_step(phase.microbatches, steps)
        traced = step.trace(self.layout.abstract_train_state, abstract, key)
        return traced.lower(lowering_platforms=platforms) if platforms else traced.lower()

    def init_state(self):
        """The sharded initial state: random, then the pretrained parameters if any (a
        BERT checkpoint, an ImageNet backbone), each checked against the model's shapes
        before the random init and written straight into its sharding."""
        pretrained = self.pretrained()
        state = init_train_state(
            self.task.build_model, self.tx, self.layout, self.partitioner, self.config.seed
        )
        if pretrained is not None:
            state = load_params(state, pretrained.read(), self.tx, self.layout, self.partitioner)
        return state

    def eval_data(self, task: Task | None = None) -> list[dict[str, np.ndarray]]:
        """This host's batches of `task`'s eval set (by default the run's own task), of
        the eval plan's global batch size."""
        size = self.eval_plan.global_batch_size
        layout = self.partitioner.data_layout(size)
        return (task or self.task).eval_data(size, layout.shard_index, layout.shard_count)

    def evaluator(self, host_batches: list[dict[str, np.ndarray]]) -> Evaluator:
        """The in-loop eval over this host's `host_batches` (`eval_data()`), compiled."""
        size = self.eval_plan.global_batch_size
        return Evaluator(self.task, self.layout, self.partitioner, host_batches, size)

    def final_eval(self, params) -> dict[str, dict[str, float]]:
        """The metrics of `params` on each of the task's final eval sets
        (`Task.final_eval_sets`), e.g. BLEU on whole test sets, once after training;
        empty for a task without them."""
        return evaluate_sets(
            self.task.final_eval_sets(),
            params,
            self.layout,
            self.partitioner,
            self.eval_plan.global_batch_size,
        )


def build_partitioner(config, devices=None, input_axes=None) -> Partitioner:
    """Mesh and partitioner from config.mesh / config.parallel; `input_axes` the task's
    (`Task.input_axes`: input fields split beyond their rows)."""
    mesh = build_mesh(config.mesh.axes, config.mesh.ici_shape, config.mesh.dcn_shape, devices)
    return Partitioner(
        mesh,
        rules=rules_from_config(config.parallel.get("rules", None)),
        weight_update_sharding=config.parallel.weight_update_sharding,
        fsdp=config.parallel.fsdp,
        input_axes=input_axes,
    )


def build_trainer(config, devices=None, prepare_data: bool = True) -> Trainer:
    """Validates the config, builds mesh, data (cached) and the sharded state layout."""
    devices = list(jax.devices() if devices is None else devices)
    try:
        devices = select_devices(devices, config.mesh.get("num_devices", 0))
    except MeshShapeError as e:
        raise ConfigError(str(e)) from None
    task = get_task(config)
    validate(config, len(devices), task)
    if prepare_data:
        check_data_dir(config)
        check_cache_dir(config)
    partitioner = build_partitioner(config, devices, task.input_axes())
    phases = task.phases()
    prepare_start = time.perf_counter()
    if prepare_data:
        layout0 = partitioner.data_layout(phases[0].global_batch_size)
        task = task.with_data(task.prepare(layout0.shard_index, layout0.shard_count))
    data_prep_s = time.perf_counter() - prepare_start
    schedule = task.schedule()
    model = abstract_model(task.build_model, config.seed)
    tx = build_optimizer(config.optimizer, schedule, stacked_leaves(model))
    layout = build_state_layout(model, tx, partitioner)
    return Trainer(config, task, partitioner, phases, tx, schedule, layout, data_prep_s)
