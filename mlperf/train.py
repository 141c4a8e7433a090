"""The one generic train/eval loop for every benchmark.

init (validate config, mesh, data, abstract state, shardings, jitted sharded init,
compile every step) happens before mllog `run_start`, as MLPerf counts it; then train
with in-loop evaluation every N samples until the target or the step budget, and
write the MLPerf log, result.json and a closing summary.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import optax

from mlperf.evaluate import Evaluator
from mlperf.mllog import MlLog, keys
from mlperf.optimizer import PhaseSchedule, build_optimizer, joined_schedule
from mlperf.reporting import Progress, params_fingerprint, summary_paragraph, write_result
from mlperf.steps import batch_abstract, make_train_step
from mlperf.task import Phase, Task, target_reached
from mlperf.tasks import get_task
from mlperf.train_state import StateLayout, build_state_layout, init_train_state, param_count
from mlperf.validate import validate
from parallel.data_parallel import GradReduction
from parallel.mesh import build_mesh, mesh_shape
from parallel.partition import DataLayout, Partitioner
from parallel.rules import rules_from_config


@dataclasses.dataclass
class Trainer:
    """Everything built during init: the loop and tools (inspect, bench) use it."""

    config: Any
    task: Task
    partitioner: Partitioner
    phases: list[Phase]
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    layout: StateLayout

    def jitted_train_step(self):
        """The train step, jitted with state/batch shardings and state donation."""
        p = self.config.parallel
        reduction = GradReduction(
            algorithm=p.get("grad_allreduce", "xla"),
            bucket_bytes=p.get("grad_bucket_bytes", 4 << 20),
            num_chunks=p.get("grad_allreduce_chunks", 0) or None,
        )
        step = make_train_step(
            self.task,
            self.layout,
            self.partitioner,
            self.tx,
            self.schedule,
            self.config.train.microbatches,
            reduction,
        )
        return self.partitioner.jit(
            step,
            in_shardings=(self.layout.state_shardings, None, self.partitioner.replicated()),
            out_shardings=(self.layout.state_shardings, self.partitioner.replicated()),
            donate_argnums=(0,),
        )

    def lower_train_step(self, phase: Phase):
        """Lowers the train step for one phase's global batch shapes (nothing allocated)."""
        abstract = batch_abstract(
            self.partitioner, self.task.example_spec(phase), phase.global_batch_size
        )
        key = jax.ShapeDtypeStruct(
            (), jax.random.key(0).dtype, sharding=self.partitioner.replicated()
        )
        return self.jitted_train_step().lower(self.layout.abstract_train_state, abstract, key)

    def init_state(self):
        return init_train_state(
            self.task.build_model, self.tx, self.layout, self.partitioner, self.config.seed
        )


def build_partitioner(config, devices=None) -> Partitioner:
    """Mesh and partitioner from config.mesh / config.parallel."""
    mesh = build_mesh(config.mesh.axes, config.mesh.ici_shape, config.mesh.dcn_shape, devices)
    return Partitioner(
        mesh,
        rules=rules_from_config(config.parallel.get("rules", None)),
        weight_update_sharding=config.parallel.weight_update_sharding,
        fsdp=config.parallel.fsdp,
    )


def build_trainer(config, devices=None, prepare_data: bool = True) -> Trainer:
    """Validates the config, builds mesh, data (cached) and the sharded state layout."""
    devices = list(jax.devices() if devices is None else devices)
    validate(config, len(devices))
    partitioner = build_partitioner(config, devices)
    task = get_task(config)
    phases = task.phases()
    if prepare_data:
        layout0 = partitioner.data_layout(phases[0].global_batch_size)
        task.prepare(layout0.shard_index, layout0.shard_count)
    schedule = joined_schedule(
        [
            PhaseSchedule(
                p.learning_rate,
                p.warmup_steps,
                p.decay_steps,
                p.steps,
                power=config.optimizer.power,
            )
            for p in phases
        ]
    )
    tx = build_optimizer(config.optimizer, schedule)
    layout = build_state_layout(task.build_model, tx, partitioner, config.seed)
    return Trainer(config, task, partitioner, phases, tx, schedule, layout)


def _platform_name() -> str:
    d = jax.devices()[0]
    return f"{jax.device_count()}x{d.device_kind or d.platform}"


def _eval_interval(config, phases: list[Phase]) -> int:
    every = config.train.eval_every_samples
    if every > 0:
        return every
    total = sum(p.steps * p.global_batch_size for p in phases)
    return max(total // 10, phases[0].global_batch_size)


@dataclasses.dataclass
class _PhaseRun:
    """One phase, ready to run: its data layout, iterator, first batch, compiled step."""

    phase: Phase
    layout: DataLayout
    iterator: Iterator[dict[str, np.ndarray]]
    pending: dict[str, np.ndarray]
    step_fn: Any


class _Loop:
    """The training loop's running state: counters, evals, the MLPerf block structure."""

    def __init__(
        self, trainer: Trainer, evaluator: Evaluator, mll: MlLog, is_main: bool, workdir: str
    ):
        self.trainer, self.evaluator, self.mll, self.is_main = trainer, evaluator, mll, is_main
        # One JSON object per logged step and per eval, for plots and run comparisons.
        self.metrics_path = os.path.join(workdir, "metrics.jsonl")
        if is_main:
            open(self.metrics_path, "w").close()
        self.task = trainer.task
        phases = trainer.phases
        self.total_steps = sum(p.steps for p in phases)
        self.eval_every = _eval_interval(trainer.config, phases)
        self.progress = Progress(self.total_steps, self.task.target_metric, enabled=is_main)
        self.step = self.samples = 0
        self.next_eval = self.eval_every
        self.eval_metrics: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.reached = False
        self.to_target: dict[str, Any] = {}
        self.status = keys.SUCCESS
        self._pending_eval = None
        self.start = time.perf_counter()

    def _open_block(self) -> None:
        meta = {keys.FIRST_EPOCH_NUM: self.samples, keys.EPOCH_COUNT: self.eval_every}
        self.mll.start(keys.BLOCK_START, metadata=meta)
        self.mll.start(keys.EPOCH_START, metadata={keys.EPOCH_NUM: self.samples})
        self._block_start = self.samples

    def _close_block(self) -> None:
        self.mll.end(keys.EPOCH_STOP, metadata={keys.EPOCH_NUM: self.samples})
        self.mll.end(keys.BLOCK_STOP, metadata={keys.FIRST_EPOCH_NUM: self._block_start})

    def _evaluate(self, params) -> None:
        """Starts an eval of `params`; its metrics are taken now, or (async tasks) at the
        next eval boundary or the end of training, the same step on every host."""
        samples = self.samples
        self.mll.start(keys.EVAL_START, metadata={keys.EPOCH_NUM: samples})
        metrics_fn = self.evaluator.start(params)
        self.mll.end(keys.EVAL_STOP, metadata={keys.EPOCH_NUM: samples})
        self._pending_eval = (samples, self.step, metrics_fn)
        if not getattr(self.task, "async_finalize", False):
            self._take_eval()

    def _take_eval(self) -> None:
        """Waits for the pending eval's metrics, logs them and checks the target."""
        if self._pending_eval is None:
            return
        samples, step, metrics_fn = self._pending_eval
        self._pending_eval = None
        self.eval_metrics = metrics_fn()
        value = self.eval_metrics[self.task.target_metric]
        self.mll.event(keys.EVAL_ACCURACY, value, metadata={keys.EPOCH_NUM: samples})
        self.progress.eval_done(samples, value)
        self._record({"kind": "eval", "eval_samples": samples, **self.eval_metrics})
        if self.is_main:
            shown = ", ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in self.eval_metrics.items()
            )
            print(f"eval @ {samples} samples (step {step}): {shown}", flush=True)
        if not self.reached and target_reached(self.task, self.eval_metrics):
            self.reached = True
            self.to_target = {
                "time_to_target_s": time.perf_counter() - self.start,
                "samples_to_target": samples,
                "steps_to_target": step,
            }

    def _log(self, metrics) -> bool:
        """Fetches the step metrics and prints progress; False when the loss is not finite."""
        self.last_metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not np.isfinite(self.last_metrics["loss"]):
            self.status = keys.ABORTED
            print(f"loss is {self.last_metrics['loss']} at step {self.step}: stopping.", flush=True)
            return False
        self.progress.log(self.step, self.samples, self.last_metrics)
        self._record(
            {"kind": "train", **self.last_metrics, "samples_per_s": self.progress.samples_per_s}
        )
        return True

    def _record(self, entry: dict[str, Any]) -> None:
        if self.is_main:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps({"step": self.step, "samples": self.samples, **entry}) + "\n")

    def run(self, state, key, phase_runs: list[_PhaseRun]):
        """Trains through every phase until the target (or the step budget)."""
        config = self.trainer.config
        partitioner = self.trainer.partitioner
        metrics = None
        self._open_block()
        for pr in phase_runs:
            for _ in range(pr.phase.steps):
                batch = partitioner.host_to_global(pr.pending, pr.layout)
                state, metrics = pr.step_fn(state, batch, key)
                self.step += 1
                self.samples += pr.phase.global_batch_size
                pr.pending = next(pr.iterator)  # host input overlaps the device step
                last = self.step == self.total_steps
                if (self.step % config.train.log_every_steps == 0 or last) and not self._log(
                    metrics
                ):
                    return state
                if self.samples >= self.next_eval or last:
                    self._close_block()
                    self._take_eval()  # an async eval still running from the last boundary
                    if self.reached and config.train.stop_at_target:
                        return state
                    self._evaluate(state["params"])
                    self.next_eval += self.eval_every
                    if self.reached and config.train.stop_at_target:
                        return state
                    if not last:
                        self._open_block()
        self._take_eval()
        if not self.last_metrics and metrics is not None:
            self._log(metrics)
        return state


def run(config, workdir: str) -> dict[str, Any]:
    """Trains to the target (or the step budget) and returns the result dict."""
    init_wall = time.time()
    os.makedirs(workdir, exist_ok=True)
    is_main = jax.process_index() == 0
    mll = MlLog(os.path.join(workdir, "mllog.txt"), enabled=is_main)
    mll.event(keys.CACHE_CLEAR, True)
    mll.start(keys.INIT_START)

    trainer = build_trainer(config)
    task, partitioner, phases = trainer.task, trainer.partitioner, trainer.phases
    mll.submission_info(task.benchmark, _platform_name())
    mll.event(keys.SEED, config.seed)
    mll.event(keys.GLOBAL_BATCH_SIZE, phases[0].global_batch_size)
    mll.hyperparameters(task.mllog_hparams())

    # Data iterators and compiled steps for every phase, all before run_start.
    phase_runs = []
    for phase in phases:
        layout = partitioner.data_layout(phase.global_batch_size)
        iterator = iter(
            task.train_data(phase, layout.host_batch_size, layout.shard_index, layout.shard_count)
        )
        step_fn = trainer.lower_train_step(phase).compile()
        phase_runs.append(_PhaseRun(phase, layout, iterator, next(iterator), step_fn))
    eval_layout = partitioner.data_layout(config.train.eval_batch_size)
    eval_batches = task.eval_data(
        config.train.eval_batch_size, eval_layout.shard_index, eval_layout.shard_count
    )
    evaluator = Evaluator(
        task, trainer.layout, partitioner, eval_batches, config.train.eval_batch_size
    )
    state = trainer.init_state()
    key = partitioner.replicate(lambda: jax.random.key(config.seed))
    mll.event(keys.TRAIN_SAMPLES, sum(p.steps * p.global_batch_size for p in phases))
    mll.event(keys.EVAL_SAMPLES, task.num_eval_examples())
    mll.end(keys.INIT_STOP)
    init_time = time.time() - init_wall

    mll.start(keys.RUN_START)
    loop = _Loop(trainer, evaluator, mll, is_main, workdir)
    state = loop.run(state, key, phase_runs)
    jax.block_until_ready(state)
    run_time = time.perf_counter() - loop.start
    status = loop.status if loop.reached else keys.ABORTED
    mll.end(keys.RUN_STOP, metadata={keys.STATUS: status})
    mll.close()

    result = {
        "benchmark": task.benchmark,
        "variant": config.variant,
        "steps": loop.step,
        "samples": loop.samples,
        "reached_target": loop.reached,
        "target_metric": task.target_metric,
        "target": task.target_value,
        "time_to_target_s": None,
        "samples_to_target": None,
        "steps_to_target": None,
        **loop.to_target,
        "run_time_s": run_time,
        "init_time_s": init_time,
        "train_loss": loop.last_metrics.get("loss", float("nan")),
        "eval": loop.eval_metrics,
        "mesh": mesh_shape(partitioner.mesh),
        "devices": jax.device_count(),
        "platform": jax.devices()[0].platform,
        "processes": jax.process_count(),
        "params": param_count(trainer.layout),
        "params_fingerprint": params_fingerprint(state["params"]),
        "mllog": os.path.join(workdir, "mllog.txt"),
        "status": status,
    }
    write_result(workdir, result)
    if is_main:
        print(summary_paragraph(result), flush=True)
    return result
