"""TensorBoard summaries of a run (tensorboardX: event files without TensorFlow).

    summaries = RunSummaries(workdir, enabled=is_main)
    summaries.train(step, {"loss": ..., "learning_rate": ...}, samples_per_s, mfu)
    summaries.eval(step, {"mlm_accuracy": ...})
    summaries.close()

Scalars go to workdir/tensorboard under train/*, eval/* and perf/* tags;
`tensorboard --logdir WORKDIR/tensorboard` shows them. `read_scalars` reads them back
(tests, launch.report) with tensorboardX's own protobufs.
"""

from __future__ import annotations

import glob
import math
import os
import struct
from collections.abc import Mapping
from typing import Any

SUBDIR = "tensorboard"


def _scalar(value: Any) -> float | None:
    """A finite float, or None for non-numeric values (e.g. strings in eval metrics)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy / jax scalars
        except (TypeError, ValueError):
            return None
    value = float(value)
    return value if math.isfinite(value) else None


class RunSummaries:
    """A tensorboardX writer for one run; a no-op on processes other than 0."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.logdir = os.path.join(workdir, SUBDIR)
        self._writer = None
        if enabled:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(logdir=self.logdir, flush_secs=30)

    def _write(self, prefix: str, step: int, values: Mapping[str, Any]) -> None:
        if self._writer is None:
            return
        for name, value in values.items():
            v = _scalar(value)
            if v is not None:
                self._writer.add_scalar(f"{prefix}/{name}", v, global_step=step)

    def train(
        self,
        step: int,
        metrics: Mapping[str, Any],
        samples_per_s: float | None = None,
        mfu: float | None = None,
    ) -> None:
        """Train metrics (loss, learning_rate, grad_norm, task aux) and throughput/MFU."""
        self._write("train", step, metrics)
        perf = {"samples_per_s": samples_per_s, "mfu": mfu}
        self._write("perf", step, {k: v for k, v in perf.items() if v is not None})

    def eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Eval metrics at a train step."""
        self._write("eval", step, metrics)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _records(path: str):
    """The payloads of a TFRecord file (length, crc, data, crc), as TensorBoard writes."""
    with open(path, "rb") as f:
        while header := f.read(12):
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            data = f.read(length)
            f.read(4)
            if len(data) < length:
                return  # a record still being written
            yield data


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value), ...] from every event file under `logdir`."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(
        glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True)
    ):
        for data in _records(path):
            event = event_pb2.Event.FromString(data)
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
    return out
