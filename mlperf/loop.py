"""The running training loop: steps, in-loop evals, checkpoints, MLPerf blocks, progress.

`mlperf/train.py` builds everything (mesh, data, compiled steps, state) and hands it to
a `TrainLoop`, which trains through the phases until the target or the step budget. Its
counters are a `LoopState` (mlperf/loop_state.py), which is also the checkpoint metadata.
It stops early, always with one line saying why, at a preemption notice or Ctrl-C (after
a checkpoint), a non-finite loss (naming the last good checkpoint) or a failed save.

The step loop itself only trains; the work at step boundaries is the hooks
(mlperf/loop_hooks.py) that `standard_hooks` registers, run in this order after a step:

    profile window   brackets the step (starts before step a, stops once b-1 is dispatched)
    progress         logged steps: fetch the metrics, stop at a non-finite loss, print
    goodput          logged steps: book the loop time into the ledger and write it
    saves_ok         logged steps (every step on one process): stop if a save failed
    eval             eval boundaries: close the MLPerf block, eval, check the target
    checkpoint       saves due (every_steps, at_eval, preemption): write one
    preemption       a preemption notice or Ctrl-C: stop, the checkpoint written

The eval runs before the save so the checkpoint holds its metrics and the run stops at
the target only after that save; the MLPerf log events follow this order.

With `train.steps_per_dispatch` = k > 1 (mlperf/dispatch.py) one call of the compiled
step runs k steps on k stacked batches: the counters, samples and progress advance step
by step, and the hooks run once the dispatch's last step is counted. Every step they act
at ends a dispatch: single steps run up to a phase end or an eval closer than k steps,
and the config check before anything is built makes sure of the logging and checkpoint
cadences. The profile window then spans the dispatches holding its steps.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from mlperf.checkpoint import (
    Checkpointer,
    CheckpointSaveError,
    PreemptionNotice,
    SpikeRule,
    all_finite,
    iterator_state_of,
    last_good,
    plain_config,
)
from mlperf.checkpoint.manager import all_hosts_ok
from mlperf.dispatch import dispatch_length, stack_batches
from mlperf.eval_schedule import eval_schedule
from mlperf.evaluate import Evaluator
from mlperf.goodput import Goodput, LoopLedger
from mlperf.loop_hooks import Hooks, StepEnd, every
from mlperf.loop_state import LoopState
from mlperf.mllog import keys
from mlperf.profiling import ProfileWindow
from mlperf.run_log import RunLog
from mlperf.task import Phase
from mlperf.trainer import Trainer
from parallel.partition import DataLayout, Partitioner


@dataclasses.dataclass
class PhaseRun:
    """One phase, ready to run: its data layout, iterator, next input, compiled steps.

    `step_fn` runs `steps_per_dispatch` steps a call (mlperf/dispatch.py): one step on a
    host batch, or several on that many batches stacked on a leading axis. Where a mark
    (`dispatch.marks`: a phase end, an eval) comes sooner than that, the dispatch is one
    step of `single_fn`, the one-step program."""

    phase: Phase
    layout: DataLayout
    iterator: Iterator[dict[str, np.ndarray]]
    pending: list[dict[str, np.ndarray]]  # the next dispatch's host batches, in order
    step_fn: Any
    done: int = 0  # steps of this phase already trained (a resumed run starts past 0)
    steps_per_dispatch: int = 1
    single_fn: Any = None  # the one-step program, where some dispatch needs it
    first_step: int = 0  # global steps before this phase
    marks: tuple[int, ...] = ()  # global steps a dispatch must end at

    def fetch(self) -> None:
        """Takes the next dispatch's host batches from the iterator."""
        n = dispatch_length(self.first_step + self.done, self.steps_per_dispatch, self.marks)
        self.pending = [next(self.iterator) for _ in range(n)]

    def global_batch(self, partitioner: Partitioner) -> dict[str, jax.Array]:
        """The pending host batches as the step function's global input: one transfer."""
        if len(self.pending) == 1:
            return partitioner.host_to_global(self.pending[0], self.layout)
        return partitioner.host_steps_to_global(stack_batches(self.pending), self.layout)

    def program(self):
        """The compiled program for the pending batches."""
        if len(self.pending) == self.steps_per_dispatch:
            return self.step_fn
        if self.single_fn is None:  # dispatch.needs_single_steps said none would be
            raise RuntimeError(f"no one-step program for the dispatch at step {self.done}")
        return self.single_fn


def last_step(value) -> float:
    """A fetched metric of the last step dispatched (a dispatch of several steps returns
    each step's value, in order)."""
    return float(np.asarray(value).reshape(-1)[-1])


def _agreed_failure(error: CheckpointSaveError | None) -> CheckpointSaveError | None:
    """Several processes: None when every host's save is fine; otherwise this host's error
    (or one saying another host failed), transient only if every host that failed found
    its store unreachable, so that every host exits with the same code."""
    if all_hosts_ok(error is None):
        return None
    transient = all_hosts_ok(error is None or error.transient)
    if error is None:
        return CheckpointSaveError("a checkpoint save failed on another process", transient)
    error.transient = transient
    return error


class TrainLoop:
    """The training loop's running state: counters, evals, the MLPerf block structure."""

    def __init__(
        self,
        trainer: Trainer,
        evaluator: Evaluator,
        log: RunLog,
        is_main: bool,
        workdir: str,
        checkpointer: Checkpointer | None = None,
        resumed: LoopState | None = None,
        peak_flops_per_s: float | None = None,
        profile_steps: str = "",
        initial_eval: bool = False,
        goodput: Goodput | None = None,
    ):
        self.trainer, self.evaluator, self.log, self.is_main = trainer, evaluator, log, is_main
        self.workdir = workdir
        # Every process traces its own devices (files are named by host).
        self.profile = ProfileWindow(profile_steps, workdir)
        self.checkpointer = checkpointer
        self.task = trainer.task
        config = trainer.config
        phases = trainer.phases
        self.total_steps = sum(p.steps for p in phases)
        first_eval, self.eval_every = eval_schedule(config, phases, self.task)
        self.spike_rule = SpikeRule.from_config(config)
        last_eval = None
        if resumed is not None and resumed.eval_metrics:
            last_eval = (resumed.evaluated_at, resumed.eval_metrics[self.task.target_metric])
        log.begin_training(self.total_steps, self.task.target_metric, peak_flops_per_s, last_eval)
        self.goodput = goodput if goodput is not None else Goodput()
        self.ledger = LoopLedger(self.goodput, workdir, is_main)
        # The counters a checkpoint holds; it always records this run's own config.
        self.s = resumed if resumed is not None else LoopState(next_eval=first_eval)
        self.s.config = plain_config(config)
        self.s.seed, self.s.variant = config.seed, config.variant
        self.s.benchmark = self.task.benchmark
        self.status = keys.SUCCESS
        self.stop_reason: str | None = None
        self.store_unreachable = False  # a save failed only because the store was not there
        self._pending_eval = None
        self._watched = -1  # the last step whose loss went to the spike check
        self.elapsed_before = self.s.elapsed_s  # run time before a restart
        self.last_saved: str | None = None
        self.preemption = PreemptionNotice() if checkpointer is not None else None
        # An eval of the starting point (a pretrained checkpoint) before the first step.
        self.initial_eval = initial_eval and resumed is None
        if resumed is not None and checkpointer is not None:
            checkpointer.protected.unstable_since = self.s.unstable_since
        self.hooks = standard_hooks(self)
        self.start = time.perf_counter()

    # ---- checkpoints ---------------------------------------------------------------------
    def _meta(self, phase_index: int, done: int, key) -> dict[str, Any]:
        s = self.s
        s.phase, s.phase_step = phase_index, done
        s.elapsed_s = self.elapsed_before + time.perf_counter() - self.start
        s.model_flops = self.log.progress.model_flops
        s.mllog_bytes, s.metrics_bytes = self.log.sizes()
        s.rng_key = np.asarray(jax.random.key_data(key).addressable_data(0)).tolist()
        return s.to_meta()

    def _save_due(self, boundary: bool) -> bool:
        """Whether a checkpoint is written after this step (before the preemption check)."""
        c = self.checkpointer
        if c is None:
            return False
        every = c.cfg.every_steps
        return (every > 0 and self.s.step % every == 0) or (boundary and c.cfg.at_eval)

    def _save(self, state, key, phase_index: int, pr: PhaseRun, iterator_state, metrics):
        """Writes a checkpoint of a healthy state; False (and status aborted) if not."""
        if not self._healthy(state, metrics):
            return False
        with self.goodput.timing("eval_s"):
            self._take_eval()  # a checkpoint never holds an eval still being computed
        s = self.s
        evaluated = s.eval_metrics if s.evaluated_at == s.samples else None
        meta = self._meta(phase_index, pr.done, key)
        try:
            with self.goodput.timing("checkpoint_save_s"):
                self._agree_ready_to_save(s.step)
                self.checkpointer.save(s.step, state, meta, iterator_state, evaluated)
        except CheckpointSaveError as e:
            self.save_failed(e)
            return False
        self.last_saved = self.checkpointer.step_path(s.step)
        return True

    def _agree_ready_to_save(self, step: int) -> None:
        """Several processes: raises CheckpointSaveError on every host unless every host
        can start this save (its previous save written, room in its directory), so that a
        full disk on one host stops all of them at the same step."""
        if jax.process_count() == 1:
            return  # checkpointer.save makes the same checks
        error = None
        try:
            self.checkpointer.ready_to_save(step)
        except CheckpointSaveError as e:
            error = e
        agreed = _agreed_failure(error)
        if agreed is not None:
            raise agreed

    def save_failed(self, error: CheckpointSaveError) -> None:
        """A failed save stops the run: one line with the path, the errno, what is kept.
        A store that was only unreachable (`error.transient`) sets `store_unreachable`:
        the run exits 69, which a supervisor starts again."""
        self.status = keys.ABORTED
        self.store_unreachable = error.transient
        kept = self.checkpointer.steps() if self.checkpointer else []
        then = (
            "The same command continues once the store answers (exit code 69: a supervisor "
            "starts it again)."
            if error.transient
            else "Free space or fix the directory, then run the same command again to continue."
        )
        self.stop_reason = (
            f"{error} at step {self.s.step}: stopping (mllog run_stop status aborted); "
            f"complete checkpoints kept: {kept or 'none'}. {then}"
        )
        print(self.stop_reason, flush=True)

    def _saves_ok(self) -> bool:
        """False (run stopped) when a background save has failed. Several processes agree
        first (every host stops at the same step)."""
        c = self.checkpointer
        if c is None:
            return True
        error = None
        try:
            c.check()
        except CheckpointSaveError as e:
            error = e
        if jax.process_count() > 1:
            error = _agreed_failure(error)
        if error is None:
            return True
        self.save_failed(error)
        return False

    def _healthy(self, state, metrics) -> bool:
        """Loss and parameters finite; otherwise stop, keeping the last good checkpoint."""
        loss = last_step(jax.device_get(metrics["loss"]))
        if np.isfinite(loss) and bool(jax.device_get(all_finite(state["params"]))):
            self._watch(loss)
            return True
        what = f"loss is {loss}" if not np.isfinite(loss) else "parameters are not finite"
        self._abort(what)
        return False

    def _watch(self, loss: float) -> None:
        """Feeds a finite loss to the spike check (which protects the last good checkpoint
        from retention while the loss is out of range)."""
        if self._watched == self.s.step:  # logged and checked at a save: once
            return
        self._watched = self.s.step
        message = self.spike_rule.observe(self.s, self.s.step, loss)
        if message and self.is_main:
            print(f"WARNING: {message}", flush=True)
        if self.checkpointer is not None:
            self.checkpointer.protected.unstable_since = self.s.unstable_since

    def last_good(self) -> str | None:
        """The newest checkpoint written before the current loss spike began (the newest
        when the loss is in range), among those on disk."""
        if self.checkpointer is None:
            return None
        c = self.checkpointer
        return last_good([(step, c.step_path(step)) for step in c.steps()], self.s.unstable_since)

    def _abort(self, what: str) -> None:
        self.status = keys.ABORTED
        kept = self.last_good() or "none (no checkpoint was written before it)"
        since = self.s.unstable_since
        spike = f" (the loss has been out of range since step {since})" if since else ""
        self.stop_reason = (
            f"{what} at step {self.s.step}: stopping (mllog run_stop status aborted). "
            f"Last good checkpoint: {kept}{spike}"
        )
        print(self.stop_reason, flush=True)

    # ---- MLPerf blocks and evals ---------------------------------------------------------
    def _open_block(self) -> None:
        meta = {keys.FIRST_EPOCH_NUM: self.s.samples, keys.EPOCH_COUNT: self.eval_every}
        self.log.start(keys.BLOCK_START, metadata=meta)
        self.log.start(keys.EPOCH_START, metadata={keys.EPOCH_NUM: self.s.samples})
        self.s.block_start = self.s.samples
        self.s.block_open = True

    def _close_block(self) -> None:
        self.log.end(keys.EPOCH_STOP, metadata={keys.EPOCH_NUM: self.s.samples})
        self.log.end(keys.BLOCK_STOP, metadata={keys.FIRST_EPOCH_NUM: self.s.block_start})
        self.s.block_open = False

    def _evaluate(self, params) -> None:
        """Starts an eval of `params`; its metrics are taken now, or (async tasks) at the
        next eval boundary or the end of training, the same step on every host."""
        samples = self.s.samples
        self.log.start(keys.EVAL_START, metadata={keys.EPOCH_NUM: samples})
        metrics_fn = self.evaluator.start(params)
        self.log.end(keys.EVAL_STOP, metadata={keys.EPOCH_NUM: samples})
        self._pending_eval = (samples, self.s.step, metrics_fn)
        if not self.task.async_finalize:
            self._take_eval()

    def _take_eval(self) -> None:
        """Waits for the pending eval's metrics, logs them and checks the target."""
        if self._pending_eval is None:
            return
        samples, step, metrics_fn = self._pending_eval
        self._pending_eval = None
        self.s.eval_metrics = metrics_fn()
        self.s.evaluated_at = samples
        self.log.eval(step, samples, self.s.eval_metrics)
        if not self.s.reached and self.task.target_reached(self.s.eval_metrics):
            self.s.reached = True
            self.s.to_target = {
                "time_to_target_s": self.elapsed_before + time.perf_counter() - self.start,
                "samples_to_target": samples,
                "steps_to_target": step,
            }

    def _eval_boundary(self, state, metrics, last: bool) -> bool:
        """At an eval boundary: closes the MLPerf block, takes the pending eval, starts
        this one and opens the next block; True when the run stops at the target."""
        stop_at_target = self.trainer.config.train.stop_at_target
        # The steps dispatched so far finish first: their time is training's, not the
        # eval's, in the goodput ledger and the progress line.
        jax.block_until_ready(metrics)
        with self.goodput.timing("eval_s"):
            self._close_block()
            self._take_eval()  # an async eval still running from the last one
            stop = self.s.reached and stop_at_target
            if not stop:
                self._evaluate(state["params"])
                while self.s.next_eval <= self.s.samples:  # one eval per boundary
                    self.s.next_eval += self.eval_every
                stop = self.s.reached and stop_at_target
            if not stop and not last:
                self._open_block()
        return stop

    def _stop_preempted(self) -> None:
        """Status preempted, with one line saying why and that the checkpoint is written."""
        self.status = "preempted"
        what = "Ctrl-C" if self.preemption.signal_name == "SIGINT" else "preemption notice"
        self.stop_reason = (
            f"{what}: checkpoint {self.last_saved} written; stopping. "
            "Run the same command again to continue."
        )
        print(self.stop_reason, flush=True)

    def _log(self, metrics) -> bool:
        """Fetches the step metrics and prints progress; False when the loss is not finite."""
        last = {k: last_step(v) for k, v in jax.device_get(metrics).items()}
        if not np.isfinite(last["loss"]):
            self._abort(f"loss is {last['loss']}")
            return False
        self.s.last_metrics = last
        self._watch(last["loss"])
        # Evals and saves since the last line are not part of its samples/s.
        self.log.train(self.s.step, self.s.samples, self.s.last_metrics, self.ledger.paused_s())
        return True

    # ---- the loop ------------------------------------------------------------------------
    def run(self, state, key, phase_runs: list[PhaseRun]):
        """Trains through every phase (from where a checkpoint left off) until the target
        or the step budget; stops early at a preemption notice or a non-finite loss."""
        # Rates, ETA and the ledger count from here: the steps this process runs.
        self.log.progress.begin(self.s.step, self.s.samples, self.s.model_flops)
        self.ledger.begin(self.s.step)
        try:
            return self._steps(state, key, phase_runs)
        finally:
            self.ledger.book(self.s.step)
            self.hooks.close()
            self.log.end_training()
            if self.preemption is not None:
                self.preemption.close()

    def _steps(self, state, key, phase_runs: list[PhaseRun]):
        if not self._initial_eval(state):
            return state
        if not self.s.block_open and self.s.step < self.total_steps:
            self._open_block()
        metrics = None
        for phase_index, pr in enumerate(phase_runs):
            # Analytic FLOPs of this phase's batch rows, for MFU (BERT phase 2 is longer).
            self.log.progress.flops_per_row = self.task.flops_per_example(pr.phase)
            while pr.done < pr.phase.steps:
                # One dispatch: one step, or train.steps_per_dispatch of them (the
                # counters, samples and progress advance step by step; the hooks run
                # once the dispatch's last step is counted).
                samples = [self.task.step_samples(b, pr.phase) for b in pr.pending]
                batch = pr.global_batch(self.trainer.partitioner)
                steps = range(self.s.step, self.s.step + len(samples))
                for step in steps:
                    self.hooks.run_before(step)
                state, metrics = pr.program()(state, batch, key)
                for step in steps:
                    self.hooks.run_dispatched(step, metrics)
                for step_samples in samples:
                    self.s.step += 1
                    pr.done += 1
                    self.s.samples += step_samples
                    self.log.progress.step_done(pr.phase.global_batch_size)
                at = self._step_end(state, metrics, key, phase_index, pr)
                # The input position of the next step, taken before it is prefetched.
                at.iterator_state = iterator_state_of(pr.iterator) if at.save else None
                pr.fetch()  # host input overlaps the device steps
                if not self.hooks.run_step_end(at):
                    return state
        with self.goodput.timing("eval_s"):
            self._take_eval()
        if not self.s.last_metrics and metrics is not None:
            self._log(metrics)
        return state

    def _initial_eval(self, state) -> bool:
        """The eval of the starting point (a pretrained checkpoint) before the first step,
        when asked for; False when it already reaches the target (the run stops)."""
        if not (self.initial_eval and self.s.step == 0):
            return True
        self.initial_eval = False
        self._evaluate(state["params"])  # eval_accuracy at epoch_num 0
        self._take_eval()
        return not (self.s.reached and self.trainer.config.train.stop_at_target)

    def _step_end(self, state, metrics, key, phase_index: int, pr: PhaseRun) -> StepEnd:
        """What is due after the step just counted: eval boundary, save, preemption."""
        last = self.s.step == self.total_steps
        boundary = self.s.samples >= self.s.next_eval or last
        preempted = self.preemption is not None and self.preemption.reached(self.s.step)
        save = self._save_due(boundary) or preempted
        return StepEnd(
            self.s.step, state, metrics, key, phase_index, pr, last, boundary, save, preempted
        )


def standard_hooks(loop: TrainLoop) -> Hooks:
    """The loop's hooks in their order (see the module docstring)."""
    hooks = Hooks()
    hooks.bracket(loop.profile.before_step, loop.profile.after_step, loop.profile.close)
    log_every = every(loop.trainer.config.train.log_every_steps)

    def logged(at: StepEnd) -> bool:
        return log_every(at) or at.last

    def book(at: StepEnd) -> bool:
        loop.ledger.book(at.step)
        return True

    def eval_boundary(at: StepEnd) -> bool:
        at.stop = loop._eval_boundary(at.state, at.metrics, at.last)
        return True

    def save(at: StepEnd) -> bool:
        pr = at.phase_run
        return loop._save(at.state, at.key, at.phase_index, pr, at.iterator_state, at.metrics)

    def stop_preempted(at: StepEnd) -> bool:
        loop._stop_preempted()
        return False

    hooks.add("progress", lambda at: loop._log(at.metrics), due=logged)
    hooks.add("goodput", book, due=logged)
    # A background save that failed stops the run (several processes agree at logged
    # steps only: it takes a collective).
    one_process = jax.process_count() == 1
    hooks.add("saves_ok", lambda at: loop._saves_ok(), due=lambda at: one_process or logged(at))
    hooks.add("eval", eval_boundary, due=lambda at: at.boundary)
    hooks.add("checkpoint", save, due=lambda at: at.save)
    hooks.add("preemption", stop_preempted, due=lambda at: at.preempted)
    return hooks
