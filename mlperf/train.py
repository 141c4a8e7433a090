"""The one generic train/eval loop for every benchmark.

`run` reads top to bottom: check the inputs and take the work directory's lease; init
(validate config, mesh, data, abstract state, shardings, the start state restored or
initialised, every step compiled) before mllog `run_start`, as MLPerf counts it; the
phase runs (`TrainLoop`: training with in-loop evaluation every N samples until the
target or the step budget); the result (MLPerf log, result.json, a closing summary).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Sequence

import jax

from input_pipeline import storage
from mlperf import compilation_cache, dispatch
from mlperf.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    CheckpointSaveError,
    SpikeRule,
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
from mlperf.mllog import keys
from mlperf.peak_flops import Peak, peak_for_devices
from mlperf.preflight import HostView, check_hosts, data_fingerprint
from mlperf.process_sync import wait_for_every_process
from mlperf.profiling import parse_steps
from mlperf.provenance import code_commit
from mlperf.reporting import RunResult, params_fingerprint, summary_paragraph, write_result
from mlperf.run_log import RunLog
from mlperf.run_start import RunStart, restore_or_init
from mlperf.train_state import param_count, stored_state_codec
from mlperf.trainer import Trainer, build_trainer
from mlperf.validate import ConfigError, check_workdir
from parallel.mesh import mesh_shape


def run(
    config, workdir: str, profile_steps: str = "", allow_config_change: Sequence[str] = ()
) -> RunResult:
    """Trains to the target (or the step budget) and returns the result.

    With checkpoints in the work directory (a restart with the same command) the run
    continues from the newest readable one, if the config differs from the checkpoint's
    only in keys that cannot alter the training trajectory or in `allow_config_change`."""
    init_wall = time.time()
    code_commit()  # result.json names the code imported now, not the tree at the end
    parse_steps(profile_steps)  # a bad --profile_steps fails before anything is built
    workdir = _resolve_workdir(workdir)  # absolute, or a bucket URL (input_pipeline.storage)
    ckpt_cfg = CheckpointConfig.from_config(config, workdir)
    SpikeRule.from_config(config)  # so do bad checkpoint settings
    allowed = _allowed_changes(allow_config_change, config)
    _check_room(workdir, ckpt_cfg)
    # One run per work directory (mlperf/lease.py); what it holds is read once it is ours.
    # It is held until result.json is written, and freed on every way out.
    lease = hold_workdir(workdir)
    try:
        init = initialise(config, workdir, ckpt_cfg, allowed, init_wall)
        begin_run(init)
        loop = train_loop(init, profile_steps)
        state = train(init, loop)
        status, run_time = close_run(init, loop)
        result = run_result(init, loop, state, status, run_time)
        if loop.status == keys.SUCCESS:
            # After run_stop, so outside the timed run: e.g. BLEU on whole test sets, where
            # the in-loop eval decodes a subset.
            result.final_eval = init.trainer.final_eval(state["params"]) or None
        report(result, init)
        return result
    finally:
        lease.release()


@dataclasses.dataclass
class Init:
    """Everything init builds before mllog run_start."""

    workdir: str
    trainer: Trainer
    log: RunLog  # the MLPerf log, metrics.jsonl, TensorBoard and the progress line
    goodput: Goodput  # the time ledger, continued over restarts
    checkpointer: Checkpointer | None
    start: RunStart  # the state restored or initialised, and what it continues
    phase_runs: list[PhaseRun]  # every phase's data iterator and compiled step
    evaluator: Evaluator  # the in-loop eval, compiled
    peak: Peak  # the devices' peak FLOP/s, for MFU
    initial_eval: bool  # an eval of a pretrained whole model before the first step
    time_s: float  # init's wall time
    is_main: bool  # process 0


def initialise(
    config, workdir: str, ckpt_cfg: CheckpointConfig, allowed: set[str], init_wall: float
) -> Init:
    """Init, as MLPerf counts it (from `init_wall` to mllog init_stop): the trainer, the
    start state, every phase's data and compiled step, the compiled eval."""
    newest = newest_checkpoint(ckpt_cfg)
    resuming = newest is not None
    is_main = jax.process_index() == 0
    if not resuming and is_main and (moved := set_aside_previous_run(workdir)):
        print(moved, flush=True)
    goodput = (Goodput.read(workdir) if resuming else None) or Goodput()
    booked_before = _init_buckets(goodput)  # earlier attempts' share
    # A resumed run continues the logs written so far (cut back to the checkpoint once
    # restored).
    log = RunLog(workdir, is_main, resuming)
    log.event(keys.CACHE_CLEAR, True)
    log.start(keys.INIT_START)

    trainer = build_trainer(config)
    goodput.add("data_prep_s", trainer.data_prep_s)
    # Before compiling: every host runs the same code, config and data, in the same work
    # directory, and sees the same newest checkpoint (so all resume, or none).
    mesh = trainer.partitioner.mesh
    check_hosts(config, data_fingerprint(trainer.task), mesh.size, HostView(workdir, newest))
    # A pretrained checkpoint that does not fit the model fails here, before compiling.
    pretrained = None if resuming else trainer.pretrained()
    _log_settings(log, trainer)
    checkpointer = _checkpointer(ckpt_cfg, trainer)
    start = restore_or_init(trainer, checkpointer, resuming, allowed, goodput, pretrained)
    phase_runs = prepare_phases(trainer, start, goodput)
    with goodput.timing("data_prep_s"):
        eval_batches = trainer.eval_data()
    evaluator = trainer.evaluator(eval_batches)
    log.event(keys.TRAIN_SAMPLES, sum(p.steps * p.global_batch_size for p in trainer.phases))
    log.event(keys.EVAL_SAMPLES, trainer.task.num_eval_examples())
    peak = peak_for_devices()  # measured once on CPU: part of init, not of the run
    log.open_summaries()  # loading the TensorBoard writer is init too
    # Every host ends init and starts step 1 together (see mlperf.process_sync).
    wait_for_every_process("init_stop")
    log.end(keys.INIT_STOP)
    init_time = time.time() - init_wall
    # What init spent outside the buckets already booked for this attempt.
    goodput.add("init_s", max(init_time - (_init_buckets(goodput) - booked_before), 0.0))
    initial_eval = pretrained is not None and pretrained.whole_model
    return Init(
        workdir,
        trainer,
        log,
        goodput,
        checkpointer,
        start,
        phase_runs,
        evaluator,
        peak,
        initial_eval,
        init_time,
        is_main,
    )


def prepare_phases(trainer: Trainer, start: RunStart, goodput: Goodput) -> list[PhaseRun]:
    """Each phase's data iterator (at the restored position) and compiled train step (of
    `train.steps_per_dispatch` steps a call, and of one step where a dispatch must be
    shorter: `dispatch.marks`)."""
    k = dispatch.steps_per_dispatch(trainer.config)
    marks = dispatch.marks(trainer.config, trainer.task) if k > 1 else ()
    phase_runs = []
    first_step = 0
    for i, phase in enumerate(trainer.phases):
        layout = trainer.partitioner.data_layout(phase.global_batch_size)
        with goodput.timing("data_prep_s"):
            iterator = iter(
                trainer.task.train_data(
                    phase, layout.host_batch_size, layout.shard_index, layout.shard_count
                )
            )
        with goodput.timing("compile_s"):
            step_fn = trainer.lower_train_step(phase, steps=k).compile()
        pr = PhaseRun(
            phase, layout, iterator, [], step_fn, steps_per_dispatch=k,
            first_step=first_step, marks=marks,
        )  # fmt: skip
        with goodput.timing("data_prep_s"):
            pr.done = resume_position(start.restored, i, phase.steps, iterator)
        if dispatch.needs_single_steps(k, marks, first_step + pr.done, first_step + phase.steps):
            with goodput.timing("compile_s"):
                pr.single_fn = trainer.lower_train_step(phase).compile()
        if pr.done < phase.steps:
            with goodput.timing("data_prep_s"):
                pr.fetch()
        phase_runs.append(pr)
        first_step += phase.steps
    return phase_runs


def begin_run(init: Init) -> None:
    """mllog run_start; a resumed run instead continues its logs, cut back to the
    checkpoint, and logs the config changes forced with --allow_config_change."""
    start, log = init.start, init.log
    if start.restored is None:
        log.start(keys.RUN_START)
        return
    log.resume(start.loop_state.mllog_bytes, start.loop_state.metrics_bytes)
    for change in start.changes:
        if not change.neutral:
            log.event(MLLOG_CONFIG_CHANGE, change.as_dict(), {"step": start.resumed_step})


def train_loop(init: Init, profile_steps: str) -> TrainLoop:
    """The loop over the phases (mlperf/loop.py), at the start state's counters."""
    loop = TrainLoop(
        init.trainer,
        init.evaluator,
        init.log,
        init.is_main,
        init.workdir,
        init.checkpointer,
        init.start.loop_state,
        peak_flops_per_s=init.peak.flops_per_s,
        profile_steps=profile_steps,
        initial_eval=init.initial_eval,
        goodput=init.goodput,
    )
    if init.start.restored is not None:
        loop.last_saved = init.start.restored.path
    return loop


def train(init: Init, loop: TrainLoop):
    """The phase runs from the start state; every checkpoint started is committed on
    the way out. The trained state."""
    start = init.start
    try:
        state = loop.run(start.state, start.key, init.phase_runs)
        jax.block_until_ready(state)
    finally:
        if init.checkpointer is not None:
            with init.goodput.timing("checkpoint_save_s"):
                try:
                    init.checkpointer.close()  # every started checkpoint committed
                except CheckpointSaveError as e:
                    if loop.status != keys.ABORTED:
                        loop.save_failed(e)
    return state


def close_run(init: Init, loop: TrainLoop) -> tuple[str, float]:
    """The run's status and run time; mllog run_stop (not for a preempted run, whose log
    its restart continues), the logs closed and the goodput ledger written."""
    run_time = loop.elapsed_before + time.perf_counter() - loop.start
    status = loop.status if loop.s.reached or loop.status == "preempted" else keys.ABORTED
    checkpointer = init.checkpointer
    if checkpointer is not None and checkpointer.failed and status == "preempted":
        status = keys.ABORTED  # the preemption checkpoint was not written
    if status != "preempted":
        init.log.end(keys.RUN_STOP, metadata={keys.STATUS: status})
    init.log.close()
    if init.is_main:
        with contextlib.suppress(OSError):
            init.goodput.write(init.workdir)
    return status, run_time


def run_result(init: Init, loop: TrainLoop, state, status: str, run_time: float) -> RunResult:
    """What result.json records of the run."""
    s, task, mesh = loop.s, init.trainer.task, init.trainer.partitioner.mesh
    changes = init.start.changes
    return RunResult(
        benchmark=task.benchmark,
        variant=init.trainer.config.variant,
        steps=s.step,
        samples=s.samples,
        reached_target=s.reached,
        target_metric=task.target_metric,
        target=task.target_value,
        status=status,
        run_time_s=run_time,
        init_time_s=init.time_s,
        train_loss=s.last_metrics.get("loss", float("nan")),
        eval=s.eval_metrics,
        mesh=mesh_shape(mesh),
        devices=mesh.devices.size,
        platform=jax.devices()[0].platform,
        processes=jax.process_count(),
        params=param_count(init.trainer.layout),
        params_fingerprint=params_fingerprint(state["params"]),
        mllog=init.log.mllog_url,
        **s.to_target,
        **init.log.progress.result_fields(run_time, s.samples),
        peak_flops_source=init.peak.source,
        resumed_from_step=init.start.resumed_step,
        last_checkpoint=loop.last_saved,
        last_good_checkpoint=loop.last_good(),
        unstable_since_step=s.unstable_since,
        stop_reason=loop.stop_reason,
        store_unreachable=loop.store_unreachable,
        stop_signal=loop.preemption.signal_name if status == "preempted" else None,
        config_changes=s.forced_config_changes
        + [{**c.as_dict(), "forced": False} for c in changes if c.neutral],
        goodput=init.goodput.as_dict(),
        compilation_cache=compilation_cache.stats_dict(),
    )


def report(result: RunResult, init: Init) -> None:
    """result.json (a store that is gone leaves the summary below) and the summary."""
    try:
        write_result(init.workdir, result)
    except OSError as e:
        print(f"WARNING: result.json not written: {e}", flush=True)
    if init.is_main:
        print(summary_paragraph(result), flush=True)
        if result.final_eval:
            print(f"final eval after training: {json.dumps(result.final_eval)}", flush=True)


def _log_settings(log: RunLog, trainer: Trainer) -> None:
    """The MLPerf log's submission, seed, batch and hyperparameter events."""
    task, config = trainer.task, trainer.config
    log.submission_info(task.benchmark, _platform_name(trainer.partitioner.mesh))
    log.event(keys.SEED, config.seed)
    log.event(keys.GLOBAL_BATCH_SIZE, trainer.phases[0].global_batch_size)
    log.hyperparameters(task.mllog_hparams(), task.mllog_metadata())


def _checkpointer(ckpt_cfg: CheckpointConfig, trainer: Trainer) -> Checkpointer | None:
    """The run's checkpointer (None: checkpoints disabled); flat update views are stored
    in parameter shapes."""
    if not ckpt_cfg.enabled:
        return None
    checkpointer = Checkpointer(ckpt_cfg, trainer.task.target_metric)
    checkpointer.codec = stored_state_codec(trainer.layout, trainer.tx, trainer.partitioner)
    return checkpointer


def _check_room(workdir: str, ckpt_cfg: CheckpointConfig) -> None:
    """Room for the next checkpoint (as large as the newest one) and the logs."""
    need = free_space_needed(ckpt_cfg.directory) if ckpt_cfg.enabled else FIRST_RUN_BYTES
    check_workdir(workdir, ckpt_cfg.directory if ckpt_cfg.enabled else None, -(-need // (1 << 20)))


def _platform_name(mesh) -> str:
    """`<devices in the mesh>x<device kind>`, e.g. 8xcpu or 4096xTPU v4."""
    d = mesh.devices.flat[0]
    return f"{mesh.devices.size}x{d.device_kind or d.platform}"


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
