"""The goodput ledger: where a run's wall time went, summed over its restarts.

Each attempt of a run (the first start and every resume with the same command) adds its
seconds to the buckets below; `WORKDIR/goodput.json` holds the sums so far and is
rewritten at every logged step, so a killed attempt loses at most the time since its last
progress line. A resume moves the time the previous attempt spent on steps after the
restored checkpoint (they are trained again) from `train_s` to `restart_lost_s`.

A supervisor that restarts the run (`launch.tpu supervise`, `launch.local --supervise`)
writes `WORKDIR/supervisor.json`: the attempt it is starting and, for each restart, the
seconds between the end of one attempt and the start of the next, and how many of them
passed without machines (preempted TPU VMs being deleted, recreated and waited for). A
resume folds the restarts it has not counted yet into the ledger: the time without
machines into `no_machines_s`, the rest of the wait into `restart_lost_s`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from input_pipeline import storage

FILE = "goodput.json"
SUPERVISOR_FILE = "supervisor.json"
BUCKETS = (
    "init_s",  # set-up other than the buckets below (mesh, state init, peak measurement)
    "data_prep_s",  # preparing the data and building the input iterators
    "compile_s",  # lowering and compiling the train steps
    "checkpoint_restore_s",
    "train_s",  # train steps (host input and progress lines included)
    "eval_s",
    "checkpoint_save_s",  # the part of saves that blocks training (the rest overlaps)
    "restart_lost_s",  # steps redone after a resume, and the wait between attempts
    "no_machines_s",  # between attempts, without machines (recreating preempted TPU VMs)
)


@dataclasses.dataclass
class Goodput:
    """Seconds per bucket, summed over the run's attempts (see the module docstring)."""

    init_s: float = 0.0
    data_prep_s: float = 0.0
    compile_s: float = 0.0
    checkpoint_restore_s: float = 0.0
    train_s: float = 0.0
    eval_s: float = 0.0
    checkpoint_save_s: float = 0.0
    restart_lost_s: float = 0.0
    no_machines_s: float = 0.0
    attempts: int = 1
    supervised_restarts: int = 0  # the supervisor's restarts folded in so far
    train_steps: int = 0  # steps trained over all attempts (redone ones counted twice)
    last_step: int = 0  # the step the latest attempt had reached when last written

    @property
    def total_s(self) -> float:
        return sum(getattr(self, name) for name in BUCKETS)

    def add(self, bucket: str, seconds: float) -> None:
        setattr(self, bucket, getattr(self, bucket) + seconds)

    @contextmanager
    def timing(self, bucket: str) -> Iterator[None]:
        """Adds the wall time of the `with` block to `bucket`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(bucket, time.perf_counter() - start)

    def resumed_at(self, step: int) -> None:
        """A new attempt resuming from the checkpoint at `step`: the earlier attempt's
        steps after it count as lost (at that attempt's mean step time)."""
        redone = max(self.last_step - step, 0)
        if redone and self.train_steps:
            lost = min(self.train_s, redone * self.train_s / self.train_steps)
            self.train_s -= lost
            self.restart_lost_s += lost
        self.attempts += 1
        self.last_step = step

    def as_dict(self) -> dict[str, Any]:
        """The ledger for result.json: buckets, total and the fraction spent training."""
        total = self.total_s
        out: dict[str, Any] = {name: round(getattr(self, name), 3) for name in BUCKETS}
        out.update(
            total_s=round(total, 3),
            train_fraction=round(self.train_s / total, 4) if total > 0 else None,
            attempts=self.attempts,
        )
        return out

    def write(self, workdir: str) -> None:
        """Writes WORKDIR/goodput.json atomically (call on process 0 only)."""
        text = json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)
        storage.write_text(storage.join(workdir, FILE), text)  # atomic, local or object

    @classmethod
    def read(cls, workdir: str) -> Goodput | None:
        """The ledger of the run's earlier attempts; None when there is none (or it cannot
        be read: it is bookkeeping, never a reason to stop a run)."""
        try:
            saved = json.loads(storage.read_text(storage.join(workdir, FILE)))
        except (OSError, ValueError):
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        ledger = cls(**{k: v for k, v in saved.items() if k in names})
        ledger.fold_supervisor(read_supervisor(workdir))
        return ledger

    def fold_supervisor(self, record: dict[str, Any] | None) -> None:
        """Adds the supervisor's restarts not counted yet (see the module docstring); the
        attempts so far are at least the ones the supervisor started before this one."""
        if not record:
            return
        restarts = record.get("restarts") or []
        for gap in restarts[self.supervised_restarts :]:
            no_machines = max(float(gap.get("no_machines_s", 0.0)), 0.0)
            self.no_machines_s += no_machines
            self.restart_lost_s += max(float(gap.get("seconds", 0.0)) - no_machines, 0.0)
        self.supervised_restarts = max(self.supervised_restarts, len(restarts))
        self.attempts = max(self.attempts, int(record.get("attempt", 1)) - 1)


class LoopLedger:
    """The train loop's side of the ledger: between two `book` calls, the loop time that
    evals and saves did not take was training. `book` also writes the ledger (process 0),
    so a killed attempt loses at most the time since its last progress line."""

    def __init__(self, goodput: Goodput, workdir: str, is_main: bool):
        self.goodput, self.workdir, self.is_main = goodput, workdir, is_main
        self._mark = time.perf_counter()
        self._booked = self._paused_total()

    def _paused_total(self) -> float:
        return self.goodput.eval_s + self.goodput.checkpoint_save_s

    def begin(self, step: int) -> None:
        """The loop starts (or resumes) at `step`: rates and the ledger count from here."""
        self._mark, self._booked = time.perf_counter(), self._paused_total()
        self.goodput.last_step = step

    def paused_s(self) -> float:
        """Seconds of evals and saves since the last `book` (not part of its samples/s)."""
        return self._paused_total() - self._booked

    def book(self, step: int) -> None:
        """Books the loop time since the last call, up to `step`, and writes the ledger."""
        g = self.goodput
        now = time.perf_counter()
        booked = self._paused_total()
        g.train_s += max(now - self._mark - (booked - self._booked), 0.0)
        g.train_steps += step - g.last_step
        g.last_step = step
        self._mark, self._booked = now, booked
        if self.is_main:
            # Bookkeeping only: a full disk is reported by the saves.
            with contextlib.suppress(OSError):
                g.write(self.workdir)


def read_supervisor(workdir: str) -> dict[str, Any] | None:
    """WORKDIR/supervisor.json, or None (absent or unreadable: bookkeeping only)."""
    try:
        record = json.loads(storage.read_text(storage.join(workdir, SUPERVISOR_FILE)))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
