"""Everything a run records as it goes, behind one object the loop calls.

    log = RunLog(workdir, is_main, resuming)       # opens the MLPerf log (mllog.txt)
    log.open_summaries()                           # TensorBoard, during init
    log.event(keys.SEED, 1); log.start(keys.RUN_START)   # MLPerf events
    log.begin_training(total_steps, "mlm_accuracy", peak_flops_per_s)
    log.train(step, samples, {"loss": ..., "learning_rate": ...})
    log.eval(step, samples, {"mlm_accuracy": ...})
    log.close()

The sinks are the MLPerf log (mlperf/mllog.py), `metrics.jsonl` (one JSON object per
logged step and per eval, for plots and run comparisons), TensorBoard scalars
(mlperf/summaries.py) and the console progress line (mlperf/reporting.py). Only process
0 writes files and prints; a resumed run cuts the two logs back to their sizes at the
checkpoint (`resume`) so that its lines follow on from there. In a work directory in a
bucket the files are written locally and uploaded at every progress line, eval,
checkpoint and at the end (mlperf/staged_files.py).
"""

from __future__ import annotations

import json
import os
from typing import Any

from mlperf.mllog import MlLog, keys
from mlperf.reporting import Progress
from mlperf.staged_files import StagedWorkdir
from mlperf.summaries import SUBDIR as TENSORBOARD
from mlperf.summaries import RunSummaries

MLLOG = "mllog.txt"
METRICS = "metrics.jsonl"
# MLPerf events record the file and line of whoever called `RunLog.event` (one frame
# above MlLog's own caller).
CALLER = 3


def file_size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


class RunLog:
    """The MLPerf log, metrics.jsonl, TensorBoard and the progress line of one run."""

    def __init__(self, workdir: str, is_main: bool, resuming: bool = False):
        self.workdir, self.is_main, self.resuming = workdir, is_main, resuming
        self.staged = StagedWorkdir(workdir)
        # A resumed run starts from the bucket's copies; a new one from none (an earlier
        # run's staged files must not be uploaded into this one).
        if is_main and resuming:
            self.staged.pull(MLLOG, METRICS)
        elif is_main:
            self.staged.discard(MLLOG, METRICS, TENSORBOARD)
        # The files written (local; in the staging folder for a bucket)...
        self.mllog_path = self.staged.path(MLLOG)
        self.metrics_path = self.staged.path(METRICS)
        # ...and where they end up (result.json names this one).
        self.mllog_url = self.staged.url(MLLOG)
        # A resumed run continues the log written so far (reopened by `resume`).
        self._mllog = MlLog(self.mllog_path, enabled=is_main and not resuming, stack_offset=CALLER)
        self._summaries: RunSummaries | None = None
        # The throughput meter behind the progress line: rates, MFU, model FLOPs done
        # (checkpoint metadata and result.json read them).
        self.progress: Progress | None = None

    # ---- the MLPerf log --------------------------------------------------------------------
    def event(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        self._mllog.event(key, value, metadata)

    def start(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        self._mllog.start(key, value, metadata)

    def end(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        self._mllog.end(key, value, metadata)

    def submission_info(self, benchmark: str, platform: str) -> None:
        self._mllog.submission_info(benchmark, platform)

    def hyperparameters(self, params: dict[str, Any], metadata: dict[str, dict]) -> None:
        self._mllog.hyperparameters(params, metadata)

    # ---- a resumed run -----------------------------------------------------------------------
    def resume(self, mllog_bytes: int, metrics_bytes: int) -> None:
        """Both logs as they were when the checkpoint was written: later lines (written
        after it by the run that stopped) are cut; this run's follow on."""
        if self.is_main:
            current = file_size(self.mllog_path)
            if current < mllog_bytes:
                print(
                    f"WARNING: {self.mllog_path} has {current} bytes, fewer than the "
                    f"{mllog_bytes} it had at the checkpoint; the MLPerf log of this run "
                    "will be incomplete.",
                    flush=True,
                )
            else:
                os.truncate(self.mllog_path, mllog_bytes)
            if os.path.exists(self.metrics_path):
                os.truncate(self.metrics_path, min(metrics_bytes, file_size(self.metrics_path)))
        self._mllog.close()
        self._mllog = MlLog(self.mllog_path, enabled=self.is_main, append=True, stack_offset=CALLER)
        self.upload()

    def sizes(self) -> tuple[int, int]:
        """(MLPerf log bytes, metrics.jsonl bytes) now, for a checkpoint's metadata; both
        are uploaded first, so a resume from that checkpoint finds at least those bytes."""
        if not self.is_main:
            return 0, 0
        self.upload()
        return file_size(self.mllog_path), file_size(self.metrics_path)

    def upload(self) -> None:
        """Uploads the changed logs of a work directory in a bucket (no-op for a local
        one); a failure is one warning, and the next call tries again."""
        if self.is_main and self.staged.remote:
            self._mllog.flush()
            if self._summaries is not None:
                self._summaries.flush()
            self.staged.push(MLLOG, METRICS, TENSORBOARD)

    # ---- training ------------------------------------------------------------------------
    def begin_training(
        self,
        total_steps: int,
        target_metric: str,
        peak_flops_per_s: float | None = None,
        last_eval: tuple[int, float] | None = None,
    ) -> None:
        """Opens TensorBoard, metrics.jsonl (empty for a new run) and the progress line;
        `last_eval` (samples, value) is the eval a resumed run's checkpoint holds."""
        self.progress = Progress(
            total_steps, target_metric, enabled=self.is_main, peak_flops_per_s=peak_flops_per_s
        )
        if last_eval is not None:
            self.progress.eval_done(*last_eval)
        self.open_summaries()
        if self.is_main and (not self.resuming or not os.path.exists(self.metrics_path)):
            open(self.metrics_path, "w").close()

    def open_summaries(self) -> None:
        """Opens the TensorBoard writer (once). Init calls it before `run_start`: loading
        tensorboardX takes about a second that is not training."""
        if self._summaries is None:
            self._summaries = RunSummaries(self.staged.path(""), enabled=self.is_main)

    def train(
        self, step: int, samples: int, metrics: dict[str, float], paused_s: float = 0.0
    ) -> None:
        """A logged train step: the progress line, TensorBoard, a metrics.jsonl line;
        `paused_s` as in `ProgressLog.log`."""
        p = self.progress
        p.log(step, samples, metrics, paused_s)
        self._summaries.train(step, metrics, p.samples_per_s, p.mfu)
        perf = {"samples_per_s": p.samples_per_s, "mfu": p.mfu}
        self._record(step, samples, {"kind": "train", **metrics, **perf})
        self.upload()

    def eval(self, step: int, samples: int, metrics: dict[str, Any]) -> None:
        """A finished eval: MLPerf `eval_accuracy` (the target metric), TensorBoard,
        metrics.jsonl, a console line, and the progress line's "last eval"."""
        value = metrics[self.progress.metric]
        self.event(keys.EVAL_ACCURACY, value, metadata={keys.EPOCH_NUM: samples})
        self.progress.eval_done(samples, value)
        self._summaries.eval(step, metrics)
        self._record(step, samples, {"kind": "eval", "eval_samples": samples, **metrics})
        if self.is_main:
            shown = ", ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()
            )
            print(f"eval @ {samples} samples (step {step}): {shown}", flush=True)
        self.upload()

    def _record(self, step: int, samples: int, entry: dict[str, Any]) -> None:
        if self.is_main:
            line = {"step": step, "samples": samples, **entry}
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(line) + "\n")

    def end_training(self) -> None:
        """Closes TensorBoard (its last scalars written); the MLPerf log stays open for
        `run_stop`."""
        if self._summaries is not None:
            self._summaries.close()

    def close(self) -> None:
        """Closes every sink (any number of times), the logs uploaded."""
        self.end_training()
        self._mllog.close()
        pushed = self.staged.push(MLLOG, METRICS, TENSORBOARD, force=True) if self.is_main else True
        if not pushed:
            print(f"WARNING: the logs of this run stay in {self.staged.local}", flush=True)
