"""Several train steps per host dispatch (`train.steps_per_dispatch`, TPUEstimator's
`iterations_per_loop`): which values a config allows, how long each dispatch is, and the
stacked host input.

With k > 1 the loop takes k host batches, stacks them on a leading axis, assembles them
into global arrays once (`Partitioner.host_steps_to_global`) and runs one compiled
program of k steps (`mlperf.steps.scan_steps`); the host's per-dispatch work (the
dispatch with the train-state tree, the transfer, the metrics fetch) is paid once per k
steps. The loop's hooks run at dispatch boundaries only, so a dispatch must end at every
step they act at:

- a k-step dispatch runs steps jk + 1 to (j + 1)k, so the cadences the user picks
  (`train.log_every_steps`, `checkpoint.every_steps`) must be multiples of k, checked
  before anything is built;
- steps the run fixes (each phase's end, each in-loop eval of a run whose steps train a
  fixed batch) are *marks*: where one falls inside a stretch of k, the loop runs single
  steps up to it and on to the next multiple of k (a second compiled program of one
  step, built only when some dispatch needs it, as TPUEstimator runs a shorter last
  loop). A run resumed off a multiple of k does the same.

An eval of packed BERT rows, whose samples vary from step to step, runs after the first
dispatch that reaches its due count, as with k = 1 it runs after the first step that
does: up to k - 1 steps later.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from mlperf.config_error import ConfigError
from mlperf.eval_schedule import due_evals, eval_schedule

if TYPE_CHECKING:
    from mlperf.task import Task

KEY = "train.steps_per_dispatch"


def steps_per_dispatch(config) -> int:
    """The config's train steps per host dispatch (1: one step at a time; also for the
    config stored in a checkpoint written before the key existed)."""
    return config.train.get("steps_per_dispatch", 1)


def cadences(config) -> list[tuple[str, int]]:
    """(config key, step count) of every cadence the loop's hooks act at, for `check`."""
    counts = []
    log_every = config.train.log_every_steps
    if log_every > 0:
        counts.append((f"train.log_every_steps={log_every}", log_every))
    ckpt = config.get("checkpoint")
    if ckpt is not None and ckpt.get("enabled", False) and ckpt.get("every_steps", 0) > 0:
        counts.append((f"checkpoint.every_steps={ckpt.every_steps}", ckpt.every_steps))
    return counts


def marks(config, task: Task) -> tuple[int, ...]:
    """The global step counts a dispatch must end at, in order: each phase's last step
    and, when every step trains its phase's global batch, the step each in-loop eval
    follows (`due_evals`)."""
    phases = task.phases()
    out = set(np.cumsum([p.steps for p in phases]).tolist())
    if not any(task.step_samples_vary(p) for p in phases):
        first, every = eval_schedule(config, phases, task)
        out.update(e.step for e in due_evals(phases, first, every))
    return tuple(sorted(int(m) for m in out))


def dispatch_length(step: int, k: int, ends: Sequence[int]) -> int:
    """Steps the dispatch starting after global step `step` runs: k where it fills one
    stretch of the k-step grid (steps jk + 1 to (j + 1)k, so the cadences that are
    multiples of k end dispatches) and no mark in `ends` falls inside it; else 1 (the loop
    runs single steps up to the mark, and on to the grid)."""
    if k == 1 or step % k:
        return 1
    i = bisect.bisect_right(ends, step)
    if i < len(ends) and ends[i] - step < k:
        return 1
    return k


def needs_single_steps(k: int, ends: Sequence[int], start: int, stop: int) -> bool:
    """Whether any dispatch from global step `start` to `stop` runs a single step (so the
    one-step program must be compiled besides the k-step one)."""
    if k == 1:
        return False
    step = start
    while step < stop:
        n = dispatch_length(step, k, ends)
        if n < k:
            return True
        step += n
    return False


def check(config) -> None:
    """ConfigError (one line, before anything is built) unless `train.steps_per_dispatch`
    is an integer >= 1 that divides `train.log_every_steps` and `checkpoint.every_steps`
    (each phase's end and each eval are marks the dispatches stop at by themselves)."""
    k = steps_per_dispatch(config)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError(
            f"{KEY}={k!r} must be an integer >= 1 (train steps one host dispatch runs; "
            "1: one step at a time)."
        )
    if k == 1:
        return
    counts = cadences(config)
    for what, n in counts:
        if n % k:
            fits = math.gcd(*(c for _, c in counts))
            raise ConfigError(
                f"{KEY}={k}: {what} is not a multiple of {k} (the progress line and the "
                f"checkpoints are written between dispatches); use {KEY}={fits}, the "
                "largest that divides train.log_every_steps and checkpoint.every_steps, or "
                "change the value named."
            )


def stack_batches(batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """k host batches -> one host batch of [k, rows, ...] fields (in step order)."""
    return {name: np.stack([b[name] for b in batches]) for name in batches[0]}
