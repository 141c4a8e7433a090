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
from typing import Any

import jax
import numpy as np
import optax

from mlperf.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    committed_steps,
    reopen_mllog,
    resume_position,
)
from mlperf.evaluate import Evaluator
from mlperf.loop import PhaseRun, TrainLoop
from mlperf.mllog import MlLog, keys
from mlperf.optimizer import build_optimizer
from mlperf.peak_flops import peak_for_devices
from mlperf.profiling import parse_steps
from mlperf.reporting import params_fingerprint, summary_paragraph, write_result
from mlperf.steps import batch_abstract, make_train_step
from mlperf.task import Phase, Task
from mlperf.tasks import get_task
from mlperf.train_state import (
    StateLayout,
    abstract_model,
    build_state_layout,
    init_train_state,
    param_count,
    stacked_leaves,
)
from mlperf.validate import check_workdir, validate
from parallel.data_parallel import GradReduction
from parallel.mesh import build_mesh, mesh_shape
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
        task = task.with_data(task.prepare(layout0.shard_index, layout0.shard_count))
    schedule = task.schedule()
    model = abstract_model(task.build_model, config.seed)
    tx = build_optimizer(config.optimizer, schedule, stacked_leaves(model))
    layout = build_state_layout(model, tx, partitioner)
    return Trainer(config, task, partitioner, phases, tx, schedule, layout)


def _platform_name() -> str:
    d = jax.devices()[0]
    return f"{jax.device_count()}x{d.device_kind or d.platform}"


def run(config, workdir: str, profile_steps: str = "") -> dict[str, Any]:
    """Trains to the target (or the step budget) and returns the result dict.

    With checkpoints in the work directory (a restart with the same command) the run
    continues from the newest readable one."""
    init_wall = time.time()
    parse_steps(profile_steps)  # a bad --profile_steps fails before anything is built
    ckpt_cfg = CheckpointConfig.from_config(config, workdir)
    check_workdir(workdir, ckpt_cfg.directory if ckpt_cfg.enabled else None)
    resuming = ckpt_cfg.enabled and bool(committed_steps(ckpt_cfg.directory))
    is_main = jax.process_index() == 0
    mllog_path = os.path.join(workdir, "mllog.txt")
    # A resumed run continues the log written so far (reopened once restored).
    mll = MlLog(mllog_path, enabled=is_main and not resuming)
    mll.event(keys.CACHE_CLEAR, True)
    mll.start(keys.INIT_START)

    trainer = build_trainer(config)
    task, partitioner, phases = trainer.task, trainer.partitioner, trainer.phases
    mll.submission_info(task.benchmark, _platform_name())
    mll.event(keys.SEED, config.seed)
    mll.event(keys.GLOBAL_BATCH_SIZE, phases[0].global_batch_size)
    mll.hyperparameters(task.mllog_hparams(), task.mllog_metadata())

    checkpointer = Checkpointer(ckpt_cfg, task.target_metric) if ckpt_cfg.enabled else None
    restored = None
    if resuming:
        # Before compiling: another model's checkpoint is an error right away.
        restored = checkpointer.restore_latest(trainer.layout.abstract_train_state)
    if restored is not None:
        state = restored.state
        key_data = np.asarray(restored.meta["rng_key"], np.uint32)
        key = partitioner.replicate(lambda: jax.random.wrap_key_data(key_data))
        print(f"resuming from {restored.path} (step {restored.step})", flush=True)
    else:
        state = trainer.init_state()
        key = partitioner.replicate(lambda: jax.random.key(config.seed))

    # Data iterators and compiled steps for every phase, all before run_start.
    phase_runs = []
    for i, phase in enumerate(phases):
        layout = partitioner.data_layout(phase.global_batch_size)
        iterator = iter(
            task.train_data(phase, layout.host_batch_size, layout.shard_index, layout.shard_count)
        )
        step_fn = trainer.lower_train_step(phase).compile()
        pr = PhaseRun(phase, layout, iterator, {}, step_fn)
        pr.done = resume_position(restored, i, phase.steps, iterator)
        if pr.done < phase.steps:
            pr.pending = next(iterator)
        phase_runs.append(pr)
    eval_layout = partitioner.data_layout(config.train.eval_batch_size)
    eval_batches = task.eval_data(
        config.train.eval_batch_size, eval_layout.shard_index, eval_layout.shard_count
    )
    evaluator = Evaluator(
        task, trainer.layout, partitioner, eval_batches, config.train.eval_batch_size
    )
    mll.event(keys.TRAIN_SAMPLES, sum(p.steps * p.global_batch_size for p in phases))
    mll.event(keys.EVAL_SAMPLES, task.num_eval_examples())
    peak = peak_for_devices()  # measured once on CPU: part of init, not of the run
    mll.end(keys.INIT_STOP)
    init_time = time.time() - init_wall

    if restored is None:
        mll.start(keys.RUN_START)
    else:
        mll = reopen_mllog(mllog_path, restored.meta["mllog_bytes"], is_main)
    loop = TrainLoop(
        trainer,
        evaluator,
        mll,
        is_main,
        workdir,
        checkpointer,
        restored.meta if restored is not None else None,
        peak_flops_per_s=peak.flops_per_s,
        profile_steps=profile_steps,
    )
    if restored is not None:
        loop.last_saved = restored.path
    try:
        state = loop.run(state, key, phase_runs)
        jax.block_until_ready(state)
    finally:
        if checkpointer is not None:
            checkpointer.close()  # every started checkpoint committed
    run_time = loop.elapsed_before + time.perf_counter() - loop.start
    status = loop.status if loop.reached or loop.status == "preempted" else keys.ABORTED
    if status != "preempted":  # a preempted run's log is continued by its restart
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
        **loop.progress.result_fields(run_time, loop.samples),
        "peak_flops_source": peak.source,
        "train_loss": loop.last_metrics.get("loss", float("nan")),
        "eval": loop.eval_metrics,
        "mesh": mesh_shape(partitioner.mesh),
        "devices": jax.device_count(),
        "platform": jax.devices()[0].platform,
        "processes": jax.process_count(),
        "params": param_count(trainer.layout),
        "params_fingerprint": params_fingerprint(state["params"]),
        "mllog": mllog_path,
        "status": status,
        "resumed_from_step": restored.step if restored is not None else None,
        "last_checkpoint": loop.last_saved,
    }
    if loop.status == keys.SUCCESS:
        # After run_stop, so outside the timed run: e.g. BLEU on whole test sets, where
        # the in-loop eval decodes a subset.
        final_eval = task.final_eval(state["params"], trainer.layout, partitioner)
        if final_eval:
            result["final_eval"] = final_eval
    write_result(workdir, result)
    if is_main:
        print(summary_paragraph(result), flush=True)
        if result.get("final_eval"):
            print(f"final eval after training: {json.dumps(result['final_eval'])}", flush=True)
    return result
