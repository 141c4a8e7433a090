"""Measured TPU step times from Google's published MLPerf result logs (device pace).

A step's device pace is the time between two evaluation results over the training steps
between them: a result is only logged once the device has run every step before it, so
this is the device's time per step (plus one evaluation per interval), not how fast the
host issued the steps (`mlperf.mllog_pace`). Where the log's evaluation `epoch_num` counts
steps (v0.7 BERT) or epochs of `train_samples` (v0.7 others) `mllog_pace.step_pace` reads
it; Google's v2.0 BERT logs give it in samples and run each evaluation right after its
block of training steps, so the steps between two results are that block's `epoch_count`.

The figure estimates are compared with (`MeasuredPoint.compared_s`) is that pace, except
where a run's training blocks return only when the device is done: TF's TPUEstimator
training loops of v0.7 SSD and Mask R-CNN on v4. There the blocks' pace is the device's
training pace without the evaluation, which is what the estimates model. Elsewhere the
blocks are not that: JAX's return at host dispatch, Lingvo's (v0.7 Transformer) wrap the
evaluation only, and v0.7 BERT's stop without a step count, each result following its
block's stop at once (so the pace between results is the blocks' own).

The runs are named by their folder in a copy of the MLPerf results repositories
(`v0.7/results/<system>/<benchmark>/result_N.txt`); the caller passes that copy's root.

    points = measured_points("/path/to/mlperf_results")
"""

from __future__ import annotations

import dataclasses
import glob
import os
import statistics
from typing import Any

from mlperf.mllog_pace import events, logged_value, step_pace


@dataclasses.dataclass(frozen=True)
class MeasuredRun:
    """One published system and benchmark: where its logs are and what it ran."""

    folder: str  # relative to the results root
    model: str  # our model name: bert, transformer, ssd, maskrcnn
    generation: str  # TPU generation (parallel/hardware.py key)
    chips: int  # chips (the v4 system names count TensorCores: chips = name / 2)
    framework: str
    differs: str  # how the measured program differs from ours, besides the batch
    steps_from_blocks: bool = False  # evaluation epoch_num in samples (v2.0 BERT)
    device_blocks: bool = False  # training blocks return when the device is done
    packed: bool = False  # several samples per sequence: fewer FLOPs per sample than ours


_V4_TF = "TF (TPUEstimator), data parallel, no model axis"
RUNS: tuple[MeasuredRun, ...] = (
    MeasuredRun(
        "v0.7/results/tpu-v3-8192-JAX/bert", "bert", "v3", 4096, "JAX", "same program family"
    ),
    MeasuredRun(
        "v0.7/results/tpu-v3-8192-JAX/transformer",
        "transformer",
        "v3",
        4096,
        "JAX",
        "same program family",
    ),
    MeasuredRun(
        "v0.7/results/tpu-v3-4096-JAX/ssd", "ssd", "v3", 2048, "JAX", "same program family"
    ),
    *(
        MeasuredRun(
            f"v0.7/results/tpu-v4-{cores}-TF/{model}",
            model,
            "v4",
            cores // 2,
            "TF",
            _V4_TF,
            device_blocks=model in ("ssd", "maskrcnn"),  # TPUEstimator training loops
        )
        for model in ("bert", "transformer", "ssd", "maskrcnn")
        for cores in (16, 128, 512)
    ),
    *(
        MeasuredRun(
            f"v2.0/results/cloud-tpu-v4-{cores}-TF/bert",
            "bert",
            "v4",
            cores // 2,
            "TF 2.8",
            _V4_TF + "; sequences packed (several samples per 512-token row)",
            steps_from_blocks=True,
            packed=True,
        )
        for cores in (6912, 8192)
    ),
)


def block_device_pace(evs: list[dict[str, Any]]) -> list[float]:
    """Seconds per step between consecutive evaluation results, the steps between them
    being the `epoch_count` (steps) of the blocks that stopped in between."""
    steps, count, out, last = 0.0, 0, [], None
    for e in evs:
        key, meta = e.get("key"), e.get("metadata") or {}
        if key == "block_start":
            count = meta.get("epoch_count") or 0
        elif key == "block_stop":
            steps += count
        elif key == "eval_accuracy":
            if last is not None and steps > last[0]:
                out.append((e["time_ms"] - last[1]) / 1000 / (steps - last[0]))
            last = (steps, e["time_ms"])
    return out


def run_pace(log_text: str, steps_from_blocks: bool = False) -> float | None:
    """Median device seconds per step of one run's log, or None if it cannot say."""
    if steps_from_blocks:
        gaps = block_device_pace(events(log_text))
        return statistics.median(gaps) if gaps else None
    ms = step_pace(log_text).get("device_ms_per_step")
    return None if ms is None else ms / 1000


@dataclasses.dataclass(frozen=True)
class MeasuredPoint:
    """A published system's device pace (median over its runs) and global batch."""

    run: MeasuredRun
    step_s: float
    runs: int
    global_batch: int
    # Median time per step inside the training blocks (`mllog_pace`'s dispatch pace):
    # the host's pace for JAX's asynchronous dispatch; for the TF runs, whose blocks
    # return when the device is done, the training steps without the evaluation.
    block_step_s: float | None = None

    @property
    def batch_per_chip(self) -> float:
        return self.global_batch / self.run.chips

    @property
    def compared_s(self) -> float:
        """The device's time per step that estimates are compared with: the training
        blocks' pace where they return when the device is done, else the pace between
        evaluation results."""
        if self.run.device_blocks and self.block_step_s is not None:
            return self.block_step_s
        return self.step_s


def measured_point(root: str, run: MeasuredRun) -> MeasuredPoint:
    """The device pace of `run`'s logs under `root` (median of the runs' medians)."""
    files = sorted(glob.glob(os.path.join(root, run.folder, "result_*.txt")))
    if not files:
        raise FileNotFoundError(f"no result_*.txt under {os.path.join(root, run.folder)}")
    paces, blocks, batch = [], [], None
    for path in files:
        with open(path) as f:
            text = f.read()
        batch = batch or logged_value(events(text), "global_batch_size")
        pace = run_pace(text, run.steps_from_blocks)
        if pace is not None:
            paces.append(pace)
        block_ms = step_pace(text).get("dispatch_ms_per_step")
        if block_ms is not None and not run.steps_from_blocks:
            blocks.append(block_ms / 1000)
    if not paces or not batch:
        raise ValueError(f"{run.folder}: no device pace or global_batch_size in its logs")
    block = statistics.median(blocks) if blocks else None
    return MeasuredPoint(run, statistics.median(paces), len(paces), int(batch), block)


def measured_points(root: str) -> list[MeasuredPoint]:
    """Every run of RUNS whose logs are under `root`."""
    return [measured_point(root, r) for r in RUNS if os.path.isdir(os.path.join(root, r.folder))]
