"""The training loop's hooks: the work it does around each step besides the step itself.

`TrainLoop` (mlperf/loop.py) trains; everything else it does at a step boundary (the
progress line, the goodput ledger, the eval, the checkpoint save, the stop at a
preemption notice) is a `Hook` in one ordered list, and the profile window brackets the
step itself. Hooks run in the order they were added, which is part of the contract: the
eval decides whether the target is reached before the save after it, and the MLPerf log's
events come in that order. A hook returns False to stop the run at once (the hooks after
it do not run); one that wants the run to stop after this step's remaining hooks (the eval
reaching the target, so the checkpoint after it is still written) sets `StepEnd.stop`.

    hooks = Hooks()
    hooks.add("eval", run_eval, due=lambda at: at.boundary)
    hooks.add("sample", write_sample, due=every(100))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class StepEnd:
    """What the hooks see after a step: its counters, outputs and what is due."""

    step: int  # steps done, this one included
    state: Any
    metrics: Any  # the step's metrics (several steps per dispatch: each one's, stacked)
    key: Any
    phase_index: int
    phase_run: Any  # mlperf.loop.PhaseRun
    last: bool  # the run's last step
    boundary: bool  # an eval boundary (or the last step)
    save: bool  # a checkpoint is written after this step
    preempted: bool  # a preemption notice or Ctrl-C reached this step
    iterator_state: Any = None  # the input position after this step (when `save`)
    stop: bool = False  # set by a hook: stop once this step's hooks have run


def always(at: StepEnd) -> bool:
    """Due after every step."""
    return True


def every(n: int) -> Callable[[StepEnd], bool]:
    """Due after every n-th step (steps n, 2n, ...); never when n <= 0."""
    return lambda at: n > 0 and at.step % n == 0


@dataclasses.dataclass(frozen=True)
class Hook:
    """A named piece of the loop's work after a step, run when `due`."""

    name: str
    run: Callable[[StepEnd], bool]  # False: the run stops now
    due: Callable[[StepEnd], bool] = always


class Hooks:
    """The loop's hooks, in the order they run."""

    def __init__(self) -> None:
        self.step_end: list[Hook] = []
        self.before_step: list[Callable[[int], None]] = []  # the step's index
        self.dispatched: list[Callable[[int, Any], None]] = []  # index, the step's outputs
        self.closing: list[Callable[[], None]] = []

    def add(self, name: str, run: Callable[[StepEnd], bool], due=always) -> Hook:
        """Appends a hook run after each step where `due(at)` holds."""
        hook = Hook(name, run, due)
        self.step_end.append(hook)
        return hook

    def bracket(self, before: Callable, dispatched: Callable, close: Callable) -> None:
        """Adds work around the step: `before(step)` ahead of it, `dispatched(step,
        outputs)` once it is dispatched (before any step-end hook), `close()` at the end of
        the loop (the profile window)."""
        self.before_step.append(before)
        self.dispatched.append(dispatched)
        self.closing.append(close)

    def names(self) -> list[str]:
        return [h.name for h in self.step_end]

    def run_before(self, step: int) -> None:
        for fn in self.before_step:
            fn(step)

    def run_dispatched(self, step: int, outputs: Any) -> None:
        for fn in self.dispatched:
            fn(step, outputs)

    def run_step_end(self, at: StepEnd) -> bool:
        """Runs the due hooks in order; False when one stopped the run or set `at.stop`."""
        for hook in self.step_end:
            if hook.due(at) and not hook.run(at):
                return False
        return not at.stop

    def close(self) -> None:
        for fn in self.closing:
            fn()
