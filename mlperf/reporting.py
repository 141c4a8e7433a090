"""What a run shows people: progress lines, the closing summary, result.json."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from input_pipeline import storage
from mlperf.provenance import code_commit


def params_fingerprint(params: Any) -> str:
    """sha256 over all parameters (fp32 bytes) in sorted path order: equal runs, equal hash."""
    digest = hashlib.sha256()
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, leaf in sorted(flat, key=lambda kv: jax.tree_util.keystr(kv[0])):
        if jax.process_count() > 1 and not leaf.is_fully_addressable:
            value = multihost_utils.process_allgather(leaf, tiled=True)
        else:
            value = jax.device_get(leaf)
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.ascontiguousarray(np.asarray(value, np.float32)).tobytes())
    return digest.hexdigest()


def _fmt_duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Progress:
    """Prints `step | samples/s | MFU | loss | last eval | ETA` lines on process 0.

    MFU is model FLOP/s over the peak of the devices in use (mlperf/peak_flops.py); it is
    shown when both are known. The model FLOPs are counted per batch row, step by step
    (`step_done`): the task's analytic FLOPs per example (`flops_per_row`, set at each
    phase start: BERT's phase 2 has longer sequences) x the rows of the step. A packed
    BERT row holds several samples but costs one row's FLOPs, so samples/s and MFU are
    counted apart.
    """

    def __init__(
        self,
        total_steps: int,
        target_metric: str,
        enabled: bool = True,
        peak_flops_per_s: float | None = None,
        flops_per_row: float | None = None,
    ):
        self.total_steps = total_steps
        self.metric = target_metric
        self.enabled = enabled
        self.peak_flops_per_s = peak_flops_per_s
        self.flops_per_row = flops_per_row
        self.start = time.perf_counter()
        self._last_time = self.start
        self._last_samples = 0
        self._start_step = 0
        self.last_eval: tuple[int, float] | None = None
        self.samples_per_s = 0.0
        self.mfu: float | None = None
        # Model FLOPs done so far, summed step by step, for the run's mean MFU.
        self.model_flops = 0.0
        self._last_flops = 0.0
        self._counted = False  # whether any step's FLOPs were known

    def begin(self, step: int = 0, samples: int = 0, model_flops: float = 0.0) -> None:
        """Starts the clock at the first step this process runs (a resumed run starts at
        its checkpoint's step): rates and the ETA count only steps run since then."""
        self.start = self._last_time = time.perf_counter()
        self._start_step, self._last_samples = step, samples
        self.model_flops = self._last_flops = model_flops

    def step_done(self, rows: int) -> None:
        """Counts one step of `rows` batch rows at the phase's FLOPs per row."""
        if self.flops_per_row is not None:
            self.model_flops += rows * self.flops_per_row
            self._counted = True

    def log(
        self, step: int, samples: int, metrics: dict[str, float], paused_s: float = 0.0
    ) -> None:
        """A progress line; `paused_s`: seconds since the last line spent outside training
        (evals, checkpoint saves), left out of the window's samples/s and MFU."""
        now = time.perf_counter()
        window = max(now - self._last_time - paused_s, 1e-9)
        rate = (samples - self._last_samples) / window
        self.samples_per_s = rate
        self.mfu = self._mfu((self.model_flops - self._last_flops) / window)
        self._last_time, self._last_samples = now, samples
        self._last_flops = self.model_flops
        steps_per_s = (step - self._start_step) / max(now - self.start, 1e-9)
        eta = (self.total_steps - step) / max(steps_per_s, 1e-9)
        last = (
            f"{self.metric} {self.last_eval[1]:.4f} @ {self.last_eval[0]}"
            if self.last_eval
            else "none yet"
        )
        mfu = f" | MFU {100 * self.mfu:5.2f}%" if self.mfu is not None else ""
        if self.enabled:
            print(
                f"step {step:>6}/{self.total_steps} | {rate:8.1f} samples/s{mfu} | "
                f"loss {metrics['loss']:.4f} | lr {metrics['learning_rate']:.2e}"
                f" | last eval: {last} | ETA {_fmt_duration(eta)}",
                flush=True,
            )

    def _mfu(self, model_flops_per_s: float) -> float | None:
        if not self.peak_flops_per_s or not self._counted:
            return None
        return model_flops_per_s / self.peak_flops_per_s

    def eval_done(self, samples: int, value: float) -> None:
        self.last_eval = (samples, value)

    def result_fields(self, run_time_s: float, samples: int) -> dict[str, Any]:
        """Throughput and MFU over the whole run (evals included), for result.json."""
        run_time_s = max(run_time_s, 1e-9)
        return {
            "samples_per_s": samples / run_time_s,
            "model_flops_per_s": self.model_flops / run_time_s,
            "peak_flops_per_s": self.peak_flops_per_s,
            "mfu": self._mfu(self.model_flops / run_time_s),
            "last_mfu": self.mfu,
        }


@dataclasses.dataclass
class RunResult(Mapping):
    """What a run reports (result.json): outcome, speed, where it ran, what it wrote.

    Reads like the dict result.json holds (`result["steps"]`) for callers that treat the
    two alike; `final_eval` is left out when the task has none."""

    benchmark: str
    variant: str
    steps: int
    samples: int
    reached_target: bool
    target_metric: str
    target: float
    status: str
    run_time_s: float
    init_time_s: float
    train_loss: float
    eval: dict[str, Any]
    mesh: dict[str, int]
    devices: int
    platform: str
    processes: int
    params: int
    params_fingerprint: str
    mllog: str
    time_to_target_s: float | None = None
    samples_to_target: int | None = None
    steps_to_target: int | None = None
    samples_per_s: float = 0.0
    model_flops_per_s: float = 0.0
    peak_flops_per_s: float | None = None
    peak_flops_source: str = ""
    mfu: float | None = None
    last_mfu: float | None = None
    resumed_from_step: int | None = None
    last_checkpoint: str | None = None
    # The newest checkpoint written before a loss spike began (the last one when none did).
    last_good_checkpoint: str | None = None
    unstable_since_step: int | None = None
    stop_reason: str | None = None  # one line when the run stopped before its end
    store_unreachable: bool = False  # it stopped because a save found the store unreachable
    stop_signal: str | None = None  # SIGTERM / SIGINT when it stopped for one
    # Config changes on resume: [{key, checkpoint, now, forced}] over the run's restarts.
    config_changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    goodput: dict[str, Any] = dataclasses.field(default_factory=dict)
    # JAX's persistent cache: directory, hits and misses of this process (None: off).
    compilation_cache: dict[str, Any] | None = None
    # The code that ran: HEAD's hash and whether tracked files matched it (None: not a
    # git checkout). Tables written from result.json take their provenance from these.
    commit: str = dataclasses.field(default_factory=lambda: code_commit()[0])
    tree_clean: bool | None = dataclasses.field(default_factory=lambda: code_commit()[1])
    final_eval: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["final_eval"] is None:
            del out["final_eval"]
        return out

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())


def write_result(workdir: str, result: RunResult | Mapping[str, Any]) -> str:
    """Writes workdir/result.json (process 0 only) and returns its path."""
    path = storage.join(workdir, "result.json")
    if jax.process_index() == 0:
        data = result.as_dict() if isinstance(result, RunResult) else dict(result)
        storage.write_text(path, json.dumps(data, indent=2, sort_keys=True))
    return path


def summary_paragraph(result: Mapping[str, Any]) -> str:
    """One paragraph saying whether the run reached its target, how fast, and where."""
    mesh = " x ".join(f"{k}={v}" for k, v in result["mesh"].items())
    metric, target = result["target_metric"], result["target"]
    final = result["eval"].get(metric)
    if result["reached_target"]:
        head = (
            f"{result['benchmark']}:{result['variant']} REACHED its target "
            f"{metric} >= {target} in {result['time_to_target_s']:.1f} s "
            f"({result['samples_to_target']} samples, step {result['steps_to_target']})."
        )
    else:
        head = (
            f"{result['benchmark']}:{result['variant']} did NOT reach its target "
            f"{metric} >= {target} (final {final})."
        )
    return (
        f"{head} It trained {result['steps']} steps / {result['samples']} samples in "
        f"{result['run_time_s']:.1f} s of run time (compile and data preparation took "
        f"{result['init_time_s']:.1f} s before run_start) on {result['devices']} "
        f"{result['platform']} devices in {result['processes']} process(es), mesh {mesh}; "
        f"final eval {json.dumps(result['eval'])}; last train loss "
        f"{result['train_loss']:.4f}{_mfu_clause(result)}. MLPerf log: {result['mllog']}."
        f"{_goodput_clause(result)}"
    )


def _goodput_clause(result: Mapping[str, Any]) -> str:
    g = result.get("goodput") or {}
    if not g.get("total_s"):
        return ""
    parts = ", ".join(
        f"{name[:-2].replace('_', ' ')} {seconds:.1f} s"
        for name, seconds in g.items()
        if name.endswith("_s") and name != "total_s" and seconds >= 0.05
    )
    return (
        f" Goodput: {100 * (g.get('train_fraction') or 0):.1f}% of {g['total_s']:.1f} s wall "
        f"time trained over {g.get('attempts', 1)} attempt(s) ({parts})."
    )


def _mfu_clause(result: Mapping[str, Any]) -> str:
    if result.get("mfu") is None:
        return ""
    return (
        f"; {result['samples_per_s']:.1f} samples/s, model FLOPs utilisation "
        f"{100 * result['mfu']:.2f}% of {result['peak_flops_per_s']:.3e} FLOP/s peak"
    )
