"""Several train steps per host dispatch (`train.steps_per_dispatch`, TPUEstimator's
`iterations_per_loop`): which values a config allows, and the stacked host input.

With k > 1 the loop takes k host batches, stacks them on a leading axis, assembles them
into global arrays once (`Partitioner.host_steps_to_global`) and runs one compiled
program of k steps (`mlperf.steps.scan_steps`); the host's per-dispatch work (the
dispatch with the train-state tree, the transfer, the metrics fetch) is paid once per k
steps. The loop's hooks run at dispatch boundaries only, so every step count they act at
must be one: each phase's steps, `train.log_every_steps`, `checkpoint.every_steps`, and
every eval due at a sample count that ends a step. An eval due inside a step (a count
the batch does not divide, or packed BERT rows whose samples vary from step to step)
runs after the first dispatch that reaches it, as with k = 1 it runs after the first
step that does: up to k - 1 steps later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from mlperf.config_error import ConfigError
from mlperf.eval_schedule import due_evals, eval_schedule

if TYPE_CHECKING:
    from mlperf.task import Phase, Task

KEY = "train.steps_per_dispatch"


def steps_per_dispatch(config) -> int:
    """The config's train steps per host dispatch (1: one step at a time; also for the
    config stored in a checkpoint written before the key existed)."""
    return config.train.get("steps_per_dispatch", 1)


def step_counts(config, task: Task) -> list[tuple[str, int]]:
    """(what, step count) of every step the loop's hooks act at, for `check`."""
    phases = task.phases()
    counts = [(_phase_steps(config, p), p.steps) for p in phases]
    log_every = config.train.log_every_steps
    if log_every > 0:
        counts.append((f"train.log_every_steps={log_every}", log_every))
    ckpt = config.get("checkpoint")
    if ckpt is not None and ckpt.get("enabled", False) and ckpt.get("every_steps", 0) > 0:
        counts.append((f"checkpoint.every_steps={ckpt.every_steps}", ckpt.every_steps))
    if any(task.step_samples_vary(p) for p in phases):
        return counts  # evals run at the first dispatch past their due count
    first, every = eval_schedule(config, phases, task)
    for e in due_evals(phases, first, every):
        if e.samples == e.due:  # due at the end of a step: it must end a dispatch
            what = (
                f"the eval due at {e.due} samples (train.eval_every_samples="
                f"{config.train.eval_every_samples}) falls after step {e.step}, which"
            )
            counts.append((what, e.step))
    return counts


def _phase_steps(config, phase: Phase) -> str:
    """A phase's step count as the config key that sets it, where one does."""
    block = config.get(phase.source)
    if block is not None and block.get("steps") == phase.steps:
        return f"{phase.source}.steps={phase.steps}"
    return f"phase {phase.name!r} ({phase.steps} steps)"


def check(config, task: Task) -> None:
    """ConfigError (one line, before anything is built) unless `train.steps_per_dispatch`
    is an integer >= 1 that divides every step count the loop's hooks act at."""
    k = steps_per_dispatch(config)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError(
            f"{KEY}={k!r} must be an integer >= 1 (train steps one host dispatch runs; "
            "1: one step at a time)."
        )
    if k == 1:
        return
    counts = step_counts(config, task)
    fits = math.gcd(*(n for _, n in counts))
    for what, n in counts:
        if n % k:
            raise ConfigError(
                f"{KEY}={k}: {what} is not a multiple of {k} (the loop's hooks run "
                f"between dispatches); use {KEY}={fits}, the largest that divides every "
                "phase's steps, train.log_every_steps, checkpoint.every_steps and the eval "
                "steps, or change the value named."
            )


def check_resume_step(config, step: int | None) -> None:
    """A resumed run continues at a dispatch boundary: ConfigError when the checkpoint's
    step is not a multiple of `train.steps_per_dispatch` (a value changed on resume)."""
    k = steps_per_dispatch(config)
    if step is not None and step % k:
        raise ConfigError(
            f"{KEY}={k}: the checkpoint resumed is at step {step}, not a multiple of {k}; "
            f"resume with {KEY}={math.gcd(step, k)} (or the checkpoint's own value)."
        )


def stack_batches(batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """k host batches -> one host batch of [k, rows, ...] fields (in step order)."""
    return {name: np.stack([b[name] for b in batches]) for name in batches[0]}
