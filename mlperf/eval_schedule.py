"""When the in-loop evals fall: in samples (the config), and in steps (fixed batches).

The loop evaluates after the first step whose samples reach the next due count
(mlperf/loop.py); `due_evals` says which steps those are when every step trains its
phase's global batch (no packing), for checks made before anything is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from mlperf.task import Phase, Task


def eval_schedule(config, phases: Sequence[Phase], task: Task) -> tuple[int, int]:
    """(samples at the first eval, samples between evals).

    train.eval_every_samples > 0: every that many samples; 0: ten evals over the run;
    -1: the MLPerf rules of the task's round (`Task.rules_eval_schedule`)."""
    every = config.train.eval_every_samples
    if every < 0:
        return task.rules_eval_schedule(phases)
    if every > 0:
        return every, every
    total = sum(p.steps * p.global_batch_size for p in phases)
    every = max(total // 10, phases[0].global_batch_size)
    return every, every


class DueEval(NamedTuple):
    """One in-loop eval: the sample count it is due at, the step it runs after, and the
    samples trained by then (equal to `due` when the count ends a step)."""

    due: int
    step: int
    samples: int


def due_evals(phases: Sequence[Phase], first: int, every: int) -> list[DueEval]:
    """The evals of a run whose steps train their phase's global batch each (one eval per
    step at most, as the loop runs them), up to the last step."""
    out: list[DueEval] = []
    steps = samples = 0
    due = first
    for phase in phases:
        batch = phase.global_batch_size
        end = samples + phase.steps * batch
        while due <= end:
            into = max(1, -(-(due - samples) // batch))  # steps into this phase
            at = DueEval(due, steps + into, samples + into * batch)
            out.append(at)
            while due <= at.samples:
                due += max(every, 1)
        steps, samples = steps + phase.steps, end
    return out
