"""Per-step times and steps to target from an MLPerf result log (its `:::MLLOG` events).

A published time to train mixes step time, steps to target, evaluation and start-up; the
planner predicts step time, so it is compared with the step time the log itself gives.
Every MLPerf log marks training blocks with `block_start` / `block_stop`; a block's
length in samples comes from its metadata, in either form the rounds use:

- `samples_count` (later rounds): samples at block_stop minus samples at block_start;
- `first_epoch_num` / `epoch_count` (v0.7): epoch_count epochs, each of the samples
  `mlperf.mllog_pace.samples_per_epoch` gives (`train_samples`; BERT's epochs are steps
  of `global_batch_size`; without either, an "epoch" is taken as one sample).

Steps in a block = its samples / `global_batch_size`; time per step = the block's
wall time / its steps. Steps to target: the samples at `run_stop` (its `samples_count`,
else the epoch of the evaluation that reached the target, else the end of the last block
before `run_stop`) / `global_batch_size`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from mlperf.mllog_pace import logged_value, samples_per_epoch


def _block_samples(start: dict, stop: dict, epoch_samples: float) -> float | None:
    a, b = start.get("metadata") or {}, stop.get("metadata") or {}
    if "samples_count" in a and "samples_count" in b:
        return float(b["samples_count"]) - float(a["samples_count"])
    count = a.get("epoch_count", b.get("epoch_count"))
    return None if count is None else float(count) * epoch_samples


def block_step_times(events: Sequence[dict[str, Any]]) -> list[float]:
    """Seconds per training step of each block of the log (blocks with no samples or no
    matching stop are skipped). Raises ValueError without `global_batch_size`."""
    gbs = logged_value(events, "global_batch_size")
    if not gbs:
        raise ValueError("the log has no global_batch_size: steps cannot be counted.")
    epoch_samples = samples_per_epoch(events) or 1.0
    times, start = [], None
    for e in events:
        if e.get("key") == "block_start":
            start = e
        elif e.get("key") == "block_stop" and start is not None:
            samples = _block_samples(start, e, epoch_samples)
            if samples and samples > 0:
                seconds = (float(e["time_ms"]) - float(start["time_ms"])) / 1000
                times.append(seconds / (samples / float(gbs)))
            start = None
    return times


def steps_to_target(events: Sequence[dict[str, Any]]) -> float | None:
    """Training steps the run took to its target, or None if the log cannot say.

    From `run_stop`'s `samples_count` when it has one; in v0.7 logs from the epoch of the
    last `eval_accuracy` before `run_stop` (the evaluation that reached the target: its
    `epoch_num` counts the epochs trained, steps in BERT's logs); else from the end of
    the last training block that started before `run_stop`. Evaluation runs behind
    training in those logs, so blocks go on after the target was reached (Google's SSD
    logs train 110 epochs before the epoch-80 evaluation that stops the run).
    """
    gbs = logged_value(events, "global_batch_size")
    if not gbs:
        return None
    at = next((i for i, e in enumerate(events) if e.get("key") == "run_stop"), None)
    stop = None if at is None else events[at]
    meta = (stop or {}).get("metadata") or {}
    if "samples_count" in meta:
        return float(meta["samples_count"]) / float(gbs)
    before_stop = events[:at]
    epoch_samples = samples_per_epoch(events) or 1.0
    evals = [
        (e.get("metadata") or {}).get("epoch_num")
        for e in before_stop
        if e.get("key") == "eval_accuracy"
    ]
    if stop is not None and evals and evals[-1] is not None:
        return float(evals[-1]) * epoch_samples / float(gbs)
    starts = [
        e.get("metadata") or {}
        for e in before_stop
        if e.get("key") == "block_start" and "epoch_count" in (e.get("metadata") or {})
    ]
    if not starts:
        return None
    first = min(m.get("first_epoch_num", 0) for m in starts)
    end = max(m.get("first_epoch_num", 0) + m["epoch_count"] for m in starts)
    return (end - first) * epoch_samples / float(gbs)


def step_summary(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median seconds per step over the blocks, the block count and steps to target."""
    times = block_step_times(events)
    return {
        "step_s": statistics.median(times) if times else None,
        "blocks": len(times),
        "steps_to_target": steps_to_target(events),
    }
