"""The running training loop: steps, in-loop evals, checkpoints, MLPerf blocks, progress.

`mlperf/train.py` builds everything (mesh, data, compiled steps, state) and hands it to
a `TrainLoop`, which trains through the phases until the target or the step budget and
keeps the counters a checkpoint needs to resume exactly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from mlperf.checkpoint import Checkpointer, PreemptionNotice, all_finite, iterator_state_of
from mlperf.evaluate import Evaluator
from mlperf.mllog import MlLog, keys
from mlperf.profiling import ProfileWindow
from mlperf.reporting import Progress
from mlperf.summaries import RunSummaries
from mlperf.task import Phase
from parallel.partition import DataLayout

if TYPE_CHECKING:
    from mlperf.train import Trainer


def eval_interval(config, phases: tuple[Phase, ...]) -> int:
    every = config.train.eval_every_samples
    if every > 0:
        return every
    total = sum(p.steps * p.global_batch_size for p in phases)
    return max(total // 10, phases[0].global_batch_size)


@dataclasses.dataclass
class PhaseRun:
    """One phase, ready to run: its data layout, iterator, first batch, compiled step."""

    phase: Phase
    layout: DataLayout
    iterator: Iterator[dict[str, np.ndarray]]
    pending: dict[str, np.ndarray]
    step_fn: Any
    done: int = 0  # steps of this phase already trained (a resumed run starts past 0)


class TrainLoop:
    """The training loop's running state: counters, evals, the MLPerf block structure."""

    def __init__(
        self,
        trainer: Trainer,
        evaluator: Evaluator,
        mll: MlLog,
        is_main: bool,
        workdir: str,
        checkpointer: Checkpointer | None = None,
        resumed: dict[str, Any] | None = None,
        peak_flops_per_s: float | None = None,
        profile_steps: str = "",
    ):
        self.trainer, self.evaluator, self.mll, self.is_main = trainer, evaluator, mll, is_main
        self.summaries = RunSummaries(workdir, enabled=is_main)
        # Every process traces its own devices (files are named by host).
        self.profile = ProfileWindow(profile_steps, workdir)
        self.checkpointer = checkpointer
        # One JSON object per logged step and per eval, for plots and run comparisons.
        self.metrics_path = os.path.join(workdir, "metrics.jsonl")
        self.task = trainer.task
        phases = trainer.phases
        self.total_steps = sum(p.steps for p in phases)
        self.eval_every = eval_interval(trainer.config, phases)
        self.progress = Progress(
            self.total_steps,
            self.task.target_metric,
            enabled=is_main,
            peak_flops_per_s=peak_flops_per_s,
        )
        self.step = self.samples = 0
        self.next_eval = self.eval_every
        self.eval_metrics: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.reached = False
        self.to_target: dict[str, Any] = {}
        self.status = keys.SUCCESS
        self.block_open = False
        self._block_start = 0
        self._pending_eval = None
        self._evaluated_at = -1
        self.elapsed_before = 0.0  # run time before a restart
        self.last_saved: str | None = None
        self.preemption = PreemptionNotice() if checkpointer is not None else None
        if resumed is not None:
            self._resume(resumed)
        elif is_main:
            open(self.metrics_path, "w").close()
        self.start = time.perf_counter()

    # ---- checkpoints ---------------------------------------------------------------------
    _SAVED = (
        "step samples next_eval eval_metrics last_metrics reached to_target block_open"
    ).split()

    def _resume(self, meta: dict[str, Any]) -> None:
        """Counters, eval schedule and MLPerf block state as they were at the checkpoint."""
        for name in self._SAVED:
            setattr(self, name, meta[name])
        self._block_start = meta["block_start"]
        self.elapsed_before = meta["elapsed_s"]
        self._evaluated_at = meta["evaluated_at"]
        if self.eval_metrics:
            self.progress.eval_done(self._evaluated_at, self.eval_metrics[self.task.target_metric])
        if self.is_main:
            # Lines written after the checkpoint are written again by this run.
            if os.path.exists(self.metrics_path):
                os.truncate(
                    self.metrics_path, min(meta["metrics_bytes"], file_size(self.metrics_path))
                )
            else:
                open(self.metrics_path, "w").close()

    def _meta(self, phase_index: int, done: int, key) -> dict[str, Any]:
        config = self.trainer.config
        return {
            **{name: getattr(self, name) for name in self._SAVED},
            "block_start": self._block_start,
            "evaluated_at": self._evaluated_at,
            "phase": phase_index,
            "phase_step": done,
            "elapsed_s": self.elapsed_before + time.perf_counter() - self.start,
            "mllog_bytes": file_size(self.mll.path) if self.is_main else 0,
            "metrics_bytes": file_size(self.metrics_path) if self.is_main else 0,
            "rng_key": np.asarray(jax.random.key_data(key).addressable_data(0)).tolist(),
            "seed": config.seed,
            "benchmark": self.task.benchmark,
            "variant": config.variant,
            "config": json.loads(config.to_json_best_effort()),  # for launch.export
        }

    def _save_due(self, boundary: bool) -> bool:
        """Whether a checkpoint is written after this step (before the preemption check)."""
        c = self.checkpointer
        if c is None:
            return False
        every = c.cfg.every_steps
        return (every > 0 and self.step % every == 0) or (boundary and c.cfg.at_eval)

    def _save(self, state, key, phase_index: int, pr: PhaseRun, iterator_state, metrics):
        """Writes a checkpoint of a healthy state; False (and status aborted) if not."""
        if not self._healthy(state, metrics):
            return False
        self._take_eval()  # a checkpoint never holds an eval still being computed
        evaluated = self.eval_metrics if self._evaluated_at == self.samples else None
        meta = self._meta(phase_index, pr.done, key)
        self.checkpointer.save(self.step, state, meta, iterator_state, evaluated)
        self.last_saved = self.checkpointer.step_path(self.step)
        return True

    def _healthy(self, state, metrics) -> bool:
        """Loss and parameters finite; otherwise stop, keeping the last good checkpoint."""
        loss = float(jax.device_get(metrics["loss"]))
        if np.isfinite(loss) and bool(jax.device_get(all_finite(state["params"]))):
            return True
        what = f"loss is {loss}" if not np.isfinite(loss) else "parameters are not finite"
        self._abort(what)
        return False

    def _abort(self, what: str) -> None:
        self.status = keys.ABORTED
        kept = self.last_saved or "none (no checkpoint was written before it)"
        print(
            f"{what} at step {self.step}: stopping (mllog run_stop status aborted). "
            f"Last good checkpoint: {kept}",
            flush=True,
        )

    # ---- MLPerf blocks and evals ---------------------------------------------------------
    def _open_block(self) -> None:
        meta = {keys.FIRST_EPOCH_NUM: self.samples, keys.EPOCH_COUNT: self.eval_every}
        self.mll.start(keys.BLOCK_START, metadata=meta)
        self.mll.start(keys.EPOCH_START, metadata={keys.EPOCH_NUM: self.samples})
        self._block_start = self.samples
        self.block_open = True

    def _close_block(self) -> None:
        self.mll.end(keys.EPOCH_STOP, metadata={keys.EPOCH_NUM: self.samples})
        self.mll.end(keys.BLOCK_STOP, metadata={keys.FIRST_EPOCH_NUM: self._block_start})
        self.block_open = False

    def _evaluate(self, params) -> None:
        """Starts an eval of `params`; its metrics are taken now, or (async tasks) at the
        next eval boundary or the end of training, the same step on every host."""
        samples = self.samples
        self.mll.start(keys.EVAL_START, metadata={keys.EPOCH_NUM: samples})
        metrics_fn = self.evaluator.start(params)
        self.mll.end(keys.EVAL_STOP, metadata={keys.EPOCH_NUM: samples})
        self._pending_eval = (samples, self.step, metrics_fn)
        if not self.task.async_finalize:
            self._take_eval()

    def _take_eval(self) -> None:
        """Waits for the pending eval's metrics, logs them and checks the target."""
        if self._pending_eval is None:
            return
        samples, step, metrics_fn = self._pending_eval
        self._pending_eval = None
        self.eval_metrics = metrics_fn()
        self._evaluated_at = samples
        value = self.eval_metrics[self.task.target_metric]
        self.mll.event(keys.EVAL_ACCURACY, value, metadata={keys.EPOCH_NUM: samples})
        self.progress.eval_done(samples, value)
        self.summaries.eval(step, self.eval_metrics)
        self._record({"kind": "eval", "eval_samples": samples, **self.eval_metrics})
        if self.is_main:
            shown = ", ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in self.eval_metrics.items()
            )
            print(f"eval @ {samples} samples (step {step}): {shown}", flush=True)
        if not self.reached and self.task.target_reached(self.eval_metrics):
            self.reached = True
            self.to_target = {
                "time_to_target_s": self.elapsed_before + time.perf_counter() - self.start,
                "samples_to_target": samples,
                "steps_to_target": step,
            }

    def _log(self, metrics) -> bool:
        """Fetches the step metrics and prints progress; False when the loss is not finite."""
        last = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not np.isfinite(last["loss"]):
            self._abort(f"loss is {last['loss']}")
            return False
        self.last_metrics = last
        self.progress.log(self.step, self.samples, self.last_metrics)
        self.summaries.train(
            self.step, self.last_metrics, self.progress.samples_per_s, self.progress.mfu
        )
        self._record(
            {
                "kind": "train",
                **self.last_metrics,
                "samples_per_s": self.progress.samples_per_s,
                "mfu": self.progress.mfu,
            }
        )
        return True

    def _record(self, entry: dict[str, Any]) -> None:
        if self.is_main:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps({"step": self.step, "samples": self.samples, **entry}) + "\n")

    # ---- the loop ------------------------------------------------------------------------
    def run(self, state, key, phase_runs: list[PhaseRun]):
        """Trains through every phase (from where a checkpoint left off) until the target
        or the step budget; stops early at a preemption notice or a non-finite loss."""
        try:
            return self._run(state, key, phase_runs)
        finally:
            self.profile.close()
            self.summaries.close()
            if self.preemption is not None:
                self.preemption.close()

    def _run(self, state, key, phase_runs: list[PhaseRun]):
        config = self.trainer.config
        partitioner = self.trainer.partitioner
        metrics = None
        if not self.block_open and self.step < self.total_steps:
            self._open_block()
        for phase_index, pr in enumerate(phase_runs):
            # Analytic FLOPs of this phase's examples, for MFU (BERT phase 2 is longer).
            self.progress.flops_per_example = self.task.flops_per_example(pr.phase)
            while pr.done < pr.phase.steps:
                batch = partitioner.host_to_global(pr.pending, pr.layout)
                self.profile.before_step(self.step)
                state, metrics = pr.step_fn(state, batch, key)
                self.profile.after_step(self.step, metrics)
                self.step += 1
                pr.done += 1
                self.samples += pr.phase.global_batch_size
                last = self.step == self.total_steps
                boundary = self.samples >= self.next_eval or last
                preempted = self.preemption is not None and self.preemption.reached(self.step)
                save = self._save_due(boundary) or preempted
                # The input position of the next step, taken before it is prefetched.
                iterator_state = iterator_state_of(pr.iterator) if save else None
                pr.pending = next(pr.iterator)  # host input overlaps the device step
                if (self.step % config.train.log_every_steps == 0 or last) and not self._log(
                    metrics
                ):
                    return state
                stop = False
                if boundary:
                    self._close_block()
                    self._take_eval()  # an async eval still running from the last boundary
                    stop = self.reached and config.train.stop_at_target
                    if not stop:
                        self._evaluate(state["params"])
                        self.next_eval += self.eval_every
                        stop = self.reached and config.train.stop_at_target
                    if not stop and not last:
                        self._open_block()
                if save and not self._save(state, key, phase_index, pr, iterator_state, metrics):
                    return state
                if preempted:
                    self.status = "preempted"
                    print(
                        f"preemption notice: checkpoint {self.last_saved} written; stopping. "
                        "Run the same command again to continue.",
                        flush=True,
                    )
                    return state
                if stop:
                    return state
        self._take_eval()
        if not self.last_metrics and metrics is not None:
            self._log(metrics)
        return state


def file_size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0
