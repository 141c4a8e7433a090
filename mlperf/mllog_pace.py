"""Per-step pace of a training run from its MLPerf log (`:::MLLOG {...}` lines).

Two clocks are in such a log, and they differ for a program dispatched asynchronously:

- `block_start` / `block_stop` around `epoch_count` steps: how fast the host *issued*
  the steps. With asynchronous dispatch (JAX, TF on TPU) the host runs ahead of the
  device, so this can be far under the device's time per step.
- `eval_accuracy` lines, one per evaluation at `epoch_num`: a result can only be logged
  after the device has run every step before it, so the time between two results over
  the steps between them is the device's pace (train steps plus one evaluation).

Epoch numbers are steps in Google's v0.7 BERT logs; in the others (SSD, Transformer,
Mask R-CNN, ResNet) an epoch is a pass over `train_samples` at `global_batch_size`
examples per step, and paces are divided by those steps per epoch.

    pace = step_pace(open("result_0.txt").read())
    pace["dispatch_ms_per_step"], pace["device_ms_per_step"]
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

PREFIX = ":::MLLOG "


def events(log_text: str) -> list[dict[str, Any]]:
    """The JSON events of the `:::MLLOG` lines, in order (other lines are skipped)."""
    out = []
    for line in log_text.splitlines():
        if PREFIX in line:
            try:
                out.append(json.loads(line.split(PREFIX, 1)[1]))
            except json.JSONDecodeError:
                continue  # a truncated line: the rest of the log still counts
    return out


# Benchmarks whose logs number epochs in steps (Google's v0.7 BERT: blocks of 62).
EPOCHS_ARE_STEPS = ("bert",)


def logged_value(evs: Sequence[dict[str, Any]], key: str) -> Any:
    """The value of the log's first `key` event, or None."""
    return next((e.get("value") for e in evs if e.get("key") == key), None)


def samples_per_epoch(evs: Sequence[dict[str, Any]]) -> float | None:
    """Samples per logged epoch: `global_batch_size` for EPOCHS_ARE_STEPS benchmarks,
    else `train_samples`; None where the log lacks the value."""
    key = (
        "global_batch_size"
        if logged_value(evs, "submission_benchmark") in EPOCHS_ARE_STEPS
        else "train_samples"
    )
    value = logged_value(evs, key)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def steps_per_epoch(evs: list[dict[str, Any]]) -> float:
    """Train steps per logged epoch (1 where the log cannot say)."""
    samples, batch = samples_per_epoch(evs), logged_value(evs, "global_batch_size")
    numbers = samples is not None and isinstance(batch, (int, float)) and batch > 0
    return samples / batch if numbers else 1.0


def step_pace(log_text: str) -> dict[str, Any]:
    """Host dispatch pace (median over blocks) and device pace (between consecutive
    eval results) in ms per step, each with its every value (`..._each`), the run's
    length, the steps at each eval and the steps per logged epoch.

    A key is missing when the log lacks its events (no blocks, fewer than two evals).
    """
    evs = events(log_text)
    per_epoch = steps_per_epoch(evs)
    blocks, evals, times = [], [], {}
    start = None
    for e in evs:
        key, meta = e.get("key"), e.get("metadata") or {}
        if key == "block_start":
            start = e["time_ms"]
        elif key == "block_stop" and start is not None and meta.get("epoch_count"):
            blocks.append((e["time_ms"] - start) / (meta["epoch_count"] * per_epoch))
            start = None
        elif key == "eval_accuracy" and "epoch_num" in meta:
            evals.append((meta["epoch_num"] * per_epoch, e["time_ms"]))
        elif key in ("run_start", "run_stop"):
            times[key] = e["time_ms"]
    out: dict[str, Any] = {"eval_steps": [s for s, _ in evals], "steps_per_epoch": per_epoch}
    if blocks:
        out["dispatch_ms_per_step"] = statistics.median(blocks)
        out["dispatch_ms_per_step_each"] = blocks
    pairs = zip(evals, evals[1:], strict=False)
    gaps = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in pairs if s1 > s0]
    if gaps:
        out["device_ms_per_step"] = statistics.median(gaps)
        out["device_ms_per_step_each"] = gaps
    if len(times) == 2:
        out["run_s"] = (times["run_stop"] - times["run_start"]) / 1e3
    return out
