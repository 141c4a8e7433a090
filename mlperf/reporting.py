"""What a run shows people: progress lines, the closing summary, result.json."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


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

    MFU is model FLOP/s (the task's analytic FLOPs per example x samples/s) over the peak
    of the devices in use (mlperf/peak_flops.py); it is shown when both are known. Set
    `flops_per_example` at each phase start (BERT's phase 2 has longer sequences).
    """

    def __init__(
        self,
        total_steps: int,
        target_metric: str,
        enabled: bool = True,
        peak_flops_per_s: float | None = None,
        flops_per_example: float | None = None,
    ):
        self.total_steps = total_steps
        self.metric = target_metric
        self.enabled = enabled
        self.peak_flops_per_s = peak_flops_per_s
        self.flops_per_example = flops_per_example
        self.start = time.perf_counter()
        self._last_time = self.start
        self._last_samples = 0
        self.last_eval: tuple[int, float] | None = None
        self.samples_per_s = 0.0
        self.mfu: float | None = None
        # Model FLOPs done so far, summed phase by phase, for the run's mean MFU.
        self.model_flops = 0.0

    def log(self, step: int, samples: int, metrics: dict[str, float]) -> None:
        now = time.perf_counter()
        rate = (samples - self._last_samples) / max(now - self._last_time, 1e-9)
        if self.flops_per_example is not None:
            self.model_flops += (samples - self._last_samples) * self.flops_per_example
        self.samples_per_s = rate
        self.mfu = self._mfu(rate)
        self._last_time, self._last_samples = now, samples
        steps_per_s = step / max(now - self.start, 1e-9)
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

    def _mfu(self, samples_per_s: float) -> float | None:
        if not self.peak_flops_per_s or self.flops_per_example is None:
            return None
        return samples_per_s * self.flops_per_example / self.peak_flops_per_s

    def eval_done(self, samples: int, value: float) -> None:
        self.last_eval = (samples, value)

    def result_fields(self, run_time_s: float, samples: int) -> dict[str, Any]:
        """Throughput and MFU over the whole run (evals included), for result.json."""
        if samples > self._last_samples and self.flops_per_example is not None:
            self.model_flops += (samples - self._last_samples) * self.flops_per_example
            self._last_samples = samples
        run_time_s = max(run_time_s, 1e-9)
        mfu = (
            self.model_flops / run_time_s / self.peak_flops_per_s
            if self.peak_flops_per_s and self.flops_per_example is not None
            else None
        )
        return {
            "samples_per_s": samples / run_time_s,
            "model_flops_per_s": self.model_flops / run_time_s,
            "peak_flops_per_s": self.peak_flops_per_s,
            "mfu": mfu,
            "last_mfu": self.mfu,
        }


def write_result(workdir: str, result: dict[str, Any]) -> str:
    """Writes workdir/result.json (process 0 only) and returns its path."""
    path = os.path.join(workdir, "result.json")
    if jax.process_index() == 0:
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
        os.replace(path + ".tmp", path)
    return path


def summary_paragraph(result: dict[str, Any]) -> str:
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
    )


def _mfu_clause(result: dict[str, Any]) -> str:
    if result.get("mfu") is None:
        return ""
    return (
        f"; {result['samples_per_s']:.1f} samples/s, model FLOPs utilisation "
        f"{100 * result['mfu']:.2f}% of {result['peak_flops_per_s']:.3e} FLOP/s peak"
    )
