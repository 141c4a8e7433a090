"""The one generic train/eval loop for every benchmark.

init (validate config, mesh, data, abstract state, shardings, jitted sharded init,
compile every step) happens before mllog `run_start`, as MLPerf counts it; then train
with in-loop evaluation every N samples until the target or the step budget, and
write the MLPerf log, result.json and a closing summary.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from input_pipeline import storage
from mlperf import compilation_cache
from mlperf.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    CheckpointSaveError,
    ConfigChange,
    SpikeRule,
    check_config_change,
    committed_steps,
    free_space_needed,
    plain_config,
    resume_position,
)
from mlperf.checkpoint.config_change import unknown_allowed_keys
from mlperf.checkpoint.integrity import FIRST_RUN_BYTES
from mlperf.checkpoint.resume import set_aside_previous_run
from mlperf.evaluate import Evaluator
from mlperf.goodput import Goodput
from mlperf.lease import hold_workdir
from mlperf.loop import PhaseRun, TrainLoop
from mlperf.loop_state import LoopState
from mlperf.mllog import keys
from mlperf.peak_flops import peak_for_devices
from mlperf.preflight import HostView, check_hosts, data_fingerprint
from mlperf.process_sync import wait_for_every_process
from mlperf.profiling import parse_steps
from mlperf.reporting import RunResult, params_fingerprint, summary_paragraph, write_result
from mlperf.run_log import RunLog
from mlperf.train_state import (
    param_count,
    stored_state_codec,
)
from mlperf.trainer import build_trainer
from mlperf.validate import ConfigError, check_workdir
from parallel.mesh import mesh_shape


def _platform_name(mesh) -> str:
    """`<devices in the mesh>x<device kind>`, e.g. 8xcpu or 4096xTPU v4."""
    d = mesh.devices.flat[0]
    return f"{mesh.devices.size}x{d.device_kind or d.platform}"


def run(
    config, workdir: str, profile_steps: str = "", allow_config_change: Sequence[str] = ()
) -> RunResult:
    """Trains to the target (or the step budget) and returns the result.

    With checkpoints in the work directory (a restart with the same command) the run
    continues from the newest readable one, if the config differs from the checkpoint's
    only in keys that cannot alter the training trajectory or in `allow_config_change`."""
    init_wall = time.time()
    parse_steps(profile_steps)  # a bad --profile_steps fails before anything is built
    workdir = _resolve_workdir(workdir)  # absolute, or a bucket URL (input_pipeline.storage)
    ckpt_cfg = CheckpointConfig.from_config(config, workdir)
    SpikeRule.from_config(config)  # so do bad checkpoint settings
    allowed = _allowed_changes(allow_config_change, config)
    # Room for the next checkpoint (as large as the newest one) and the logs.
    need = free_space_needed(ckpt_cfg.directory) if ckpt_cfg.enabled else FIRST_RUN_BYTES
    check_workdir(workdir, ckpt_cfg.directory if ckpt_cfg.enabled else None, -(-need // (1 << 20)))
    # One run per work directory (mlperf/lease.py); what it holds is read once it is ours.
    # It is held until result.json is written, and freed on every way out.
    lease = hold_workdir(workdir)
    try:
        return _run_holding_lease(config, workdir, ckpt_cfg, allowed, profile_steps, init_wall)
    finally:
        lease.release()


def _run_holding_lease(config, workdir, ckpt_cfg, allowed, profile_steps, init_wall):
    newest = newest_checkpoint(ckpt_cfg)
    resuming = newest is not None
    is_main = jax.process_index() == 0
    if not resuming and is_main and (moved := set_aside_previous_run(workdir)):
        print(moved, flush=True)
    goodput = (Goodput.read(workdir) if resuming else None) or Goodput()
    booked_before = _init_buckets(goodput)  # earlier attempts' share
    # The MLPerf log, metrics.jsonl, TensorBoard and the progress line; a resumed run
    # continues the logs written so far (cut back to the checkpoint once restored).
    log = RunLog(workdir, is_main, resuming)
    log.event(keys.CACHE_CLEAR, True)
    log.start(keys.INIT_START)

    trainer = build_trainer(config)
    goodput.add("data_prep_s", trainer.data_prep_s)
    task, partitioner, phases = trainer.task, trainer.partitioner, trainer.phases
    # Before compiling: every host runs the same code, config and data, in the same work
    # directory, and sees the same newest checkpoint (so all resume, or none).
    seen = HostView(workdir, newest)
    check_hosts(config, data_fingerprint(task), partitioner.mesh.size, seen)
    # A pretrained checkpoint that does not fit the model fails here, before compiling.
    pretrained = None if resuming else trainer.pretrained()
    log.submission_info(task.benchmark, _platform_name(partitioner.mesh))
    log.event(keys.SEED, config.seed)
    log.event(keys.GLOBAL_BATCH_SIZE, phases[0].global_batch_size)
    log.hyperparameters(task.mllog_hparams(), task.mllog_metadata())

    checkpointer = Checkpointer(ckpt_cfg, task.target_metric) if ckpt_cfg.enabled else None
    if checkpointer is not None:  # flat update views are stored in parameter shapes
        checkpointer.codec = stored_state_codec(trainer.layout, trainer.tx, partitioner)
    restored, changes = None, []
    if resuming:
        # Before compiling: another model's checkpoint, or a config change that alters the
        # trajectory, is an error right away.
        def check_meta(meta: dict[str, Any], path: str) -> None:
            if "config" in meta:
                changes[:] = check_config_change(
                    meta["config"], plain_config(config), allowed, path
                )

        with goodput.timing("checkpoint_restore_s"):
            restored = checkpointer.restore_latest(trainer.layout.abstract_train_state, check_meta)
    resumed_state = None
    if restored is not None:
        state = restored.state
        resumed_state = LoopState.from_meta(restored.meta)
        key_data = np.asarray(resumed_state.rng_key, np.uint32)
        key = partitioner.replicate(lambda: jax.random.wrap_key_data(key_data))
        print(f"resuming from {restored.path} (step {restored.step})", flush=True)
        _report_changes(changes, restored, resumed_state)
        goodput.resumed_at(restored.step)
    else:
        state = trainer.init_state()
        key = partitioner.replicate(lambda: jax.random.key(config.seed))
        if pretrained is not None:
            print(f"initialised from {pretrained.describe()}", flush=True)

    # Data iterators and compiled steps for every phase, all before run_start.
    phase_runs = []
    for i, phase in enumerate(phases):
        layout = partitioner.data_layout(phase.global_batch_size)
        with goodput.timing("data_prep_s"):
            iterator = iter(
                task.train_data(
                    phase, layout.host_batch_size, layout.shard_index, layout.shard_count
                )
            )
        with goodput.timing("compile_s"):
            step_fn = trainer.lower_train_step(phase).compile()
        pr = PhaseRun(phase, layout, iterator, {}, step_fn)
        with goodput.timing("data_prep_s"):
            pr.done = resume_position(restored, i, phase.steps, iterator)
            if pr.done < phase.steps:
                pr.pending = next(iterator)
        phase_runs.append(pr)
    eval_layout = partitioner.data_layout(config.train.eval_batch_size)
    with goodput.timing("data_prep_s"):
        eval_batches = task.eval_data(
            config.train.eval_batch_size, eval_layout.shard_index, eval_layout.shard_count
        )
    evaluator = Evaluator(
        task, trainer.layout, partitioner, eval_batches, config.train.eval_batch_size
    )
    log.event(keys.TRAIN_SAMPLES, sum(p.steps * p.global_batch_size for p in phases))
    log.event(keys.EVAL_SAMPLES, task.num_eval_examples())
    peak = peak_for_devices()  # measured once on CPU: part of init, not of the run
    log.open_summaries()  # loading the TensorBoard writer is init too
    # Every host ends init and starts step 1 together (see mlperf.process_sync).
    wait_for_every_process("init_stop")
    log.end(keys.INIT_STOP)
    init_time = time.time() - init_wall
    # What init spent outside the buckets already booked for this attempt.
    goodput.add("init_s", max(init_time - (_init_buckets(goodput) - booked_before), 0.0))

    if restored is None:
        log.start(keys.RUN_START)
    else:
        log.resume(resumed_state.mllog_bytes, resumed_state.metrics_bytes)
        for change in changes:
            if not change.neutral:  # forced with --allow_config_change
                log.event(MLLOG_CONFIG_CHANGE, change.as_dict(), {"step": restored.step})
    loop = TrainLoop(
        trainer,
        evaluator,
        log,
        is_main,
        workdir,
        checkpointer,
        resumed_state,
        peak_flops_per_s=peak.flops_per_s,
        profile_steps=profile_steps,
        initial_eval=pretrained is not None and pretrained.whole_model,
        goodput=goodput,
    )
    if restored is not None:
        loop.last_saved = restored.path
    try:
        state = loop.run(state, key, phase_runs)
        jax.block_until_ready(state)
    finally:
        if checkpointer is not None:
            with goodput.timing("checkpoint_save_s"):
                try:
                    checkpointer.close()  # every started checkpoint committed
                except CheckpointSaveError as e:
                    if loop.status != keys.ABORTED:
                        loop.save_failed(e)
    s = loop.s
    run_time = loop.elapsed_before + time.perf_counter() - loop.start
    status = loop.status if s.reached or loop.status == "preempted" else keys.ABORTED
    if checkpointer is not None and checkpointer.failed and status == "preempted":
        status = keys.ABORTED  # the preemption checkpoint was not written
    if status != "preempted":  # a preempted run's log is continued by its restart
        log.end(keys.RUN_STOP, metadata={keys.STATUS: status})
    log.close()
    if is_main:
        with contextlib.suppress(OSError):
            goodput.write(workdir)

    result = RunResult(
        benchmark=task.benchmark,
        variant=config.variant,
        steps=s.step,
        samples=s.samples,
        reached_target=s.reached,
        target_metric=task.target_metric,
        target=task.target_value,
        status=status,
        run_time_s=run_time,
        init_time_s=init_time,
        train_loss=s.last_metrics.get("loss", float("nan")),
        eval=s.eval_metrics,
        mesh=mesh_shape(partitioner.mesh),
        devices=partitioner.mesh.devices.size,
        platform=jax.devices()[0].platform,
        processes=jax.process_count(),
        params=param_count(trainer.layout),
        params_fingerprint=params_fingerprint(state["params"]),
        mllog=log.mllog_url,
        **s.to_target,
        **log.progress.result_fields(run_time, s.samples),
        peak_flops_source=peak.source,
        resumed_from_step=restored.step if restored is not None else None,
        last_checkpoint=loop.last_saved,
        last_good_checkpoint=loop.last_good(),
        unstable_since_step=s.unstable_since,
        stop_reason=loop.stop_reason,
        stop_signal=loop.preemption.signal_name if status == "preempted" else None,
        config_changes=s.forced_config_changes
        + [{**c.as_dict(), "forced": False} for c in changes if c.neutral],
        goodput=goodput.as_dict(),
        compilation_cache=compilation_cache.stats_dict(),
    )
    if loop.status == keys.SUCCESS:
        # After run_stop, so outside the timed run: e.g. BLEU on whole test sets, where
        # the in-loop eval decodes a subset.
        result.final_eval = task.final_eval(state["params"], trainer.layout, partitioner) or None
    try:
        write_result(workdir, result)
    except OSError as e:  # the store may be gone: the result is in the summary below
        print(f"WARNING: result.json not written: {e}", flush=True)
    if is_main:
        print(summary_paragraph(result), flush=True)
        if result.final_eval:
            print(f"final eval after training: {json.dumps(result.final_eval)}", flush=True)
    return result


def _resolve_workdir(workdir: str) -> str:
    try:
        return storage.resolve(workdir)
    except storage.StorageError as e:
        raise ConfigError(f"--workdir {workdir}: {e}") from None


def newest_checkpoint(ckpt_cfg: CheckpointConfig) -> int | None:
    """The newest committed checkpoint step this host sees (None: none, or disabled)."""
    if not ckpt_cfg.enabled:
        return None
    steps = committed_steps(ckpt_cfg.directory)
    return steps[-1] if steps else None


def _init_buckets(goodput: Goodput) -> float:
    return goodput.data_prep_s + goodput.compile_s + goodput.checkpoint_restore_s


# The MLPerf log key of a config change forced on resume (--allow_config_change).
MLLOG_CONFIG_CHANGE = "multipod_config_change"


def _allowed_changes(keys_: Sequence[str], config) -> set[str]:
    """--allow_config_change keys, each one a key of this config (a typo is an error)."""
    allowed = {k.strip() for k in keys_ if k.strip()}
    unknown = unknown_allowed_keys(allowed, plain_config(config))
    if unknown:
        raise ConfigError(
            f"--allow_config_change names {', '.join(unknown)}, not a key of this config; "
            "give dotted keys such as optimizer.learning_rate."
        )
    return allowed


def _report_changes(changes: list[ConfigChange], restored, resumed: LoopState) -> None:
    """One line for the changes that cannot alter the trajectory, one for forced ones;
    forced ones are added to the run's record (saved with its later checkpoints)."""
    neutral = [c for c in changes if c.neutral]
    forced = [c for c in changes if not c.neutral]
    if restored.meta.get("process_count", jax.process_count()) != jax.process_count():
        print(
            f"resuming with {jax.process_count()} process(es); the checkpoint was written by "
            f"{restored.meta['process_count']} (resharded)",
            flush=True,
        )
    if neutral:
        shown = "; ".join(c.describe() for c in neutral)
        print(f"config changes that cannot alter the training trajectory: {shown}", flush=True)
    if forced:
        shown = "; ".join(c.describe() for c in forced)
        print(
            f"WARNING: continuing with config changes that alter the training trajectory "
            f"(--allow_config_change): {shown}; recorded in the MLPerf log and result.json.",
            flush=True,
        )
        resumed.forced_config_changes.extend(
            {**c.as_dict(), "forced": True, "step": restored.step} for c in forced
        )
