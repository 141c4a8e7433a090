"""A `jax.profiler` trace of a window of train steps: `launch.train --profile_steps=a:b`,
and `trace_steps` for `launch.bench.step --profile_dir`.

    window = ProfileWindow("10:13", workdir)      # steps 10, 11, 12 (half-open, like a slice)
    for step in ...:                                # step = index of the step about to run
        window.before_step(step)
        state, metrics = train_step(state, batch, key)
        window.after_step(step, metrics)
    window.close()                                  # stops a trace the run ended inside

The trace goes to workdir/profile (TensorBoard's profile plugin or Perfetto / xprof
read it). Steps are dispatched asynchronously, so the window blocks on the last
step's outputs before stopping: the trace then holds the device work of every step
in the window, not only its dispatch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax

from mlperf.config_error import ConfigError
from mlperf.staged_files import StagedWorkdir

SUBDIR = "profile"


def parse_steps(spec: str) -> tuple[int, int] | None:
    """'a:b' -> (a, b) with 0 <= a < b; '' -> None (no profiling)."""
    if not spec:
        return None
    parts = spec.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start, stop = int(parts[0]), int(parts[1])
    except ValueError:
        raise ConfigError(
            f"--profile_steps={spec!r} is not 'a:b'; give two step numbers, e.g. 10:13 "
            "to trace steps 10, 11 and 12."
        ) from None
    if not 0 <= start < stop:
        raise ConfigError(f"--profile_steps={spec!r} needs 0 <= a < b (steps a..b-1 are traced).")
    return start, stop


class ProfileWindow:
    """Starts a `jax.profiler` trace before step a and stops it after step b-1."""

    def __init__(self, spec: str, workdir: str, enabled: bool = True):
        self.window = parse_steps(spec)
        # Written locally (the profiler appends), uploaded for a work directory in a bucket.
        self.staged = StagedWorkdir(workdir)
        self.logdir = self.staged.path(SUBDIR)
        self.enabled = enabled and self.window is not None
        self.active = False
        self.done = False

    def before_step(self, step: int) -> None:
        """Call with the index of the step about to run."""
        if self.enabled and not self.active and not self.done and step == self.window[0]:
            os.makedirs(self.logdir, exist_ok=True)
            jax.profiler.start_trace(self.logdir)
            self.active = True

    def after_step(self, step: int, outputs: Any = None) -> None:
        """Call with the same index once the step is dispatched; pass its outputs so the
        trace waits for their device work."""
        if self.active and step >= self.window[1] - 1:
            self._stop(outputs)

    def close(self, outputs: Any = None) -> None:
        """Stops a trace still running (the run ended inside the window)."""
        if self.active:
            self._stop(outputs)

    def _stop(self, outputs: Any) -> None:
        if outputs is not None:
            jax.block_until_ready(outputs)
        jax.profiler.stop_trace()
        self.active = False
        self.done = True
        self.staged.push(SUBDIR)

    def trace_files(self) -> list[str]:
        """The trace files written so far (xplane protobufs)."""
        found = []
        for root, _, files in os.walk(self.logdir):
            found += [os.path.join(root, f) for f in files if f.endswith(".xplane.pb")]
        return sorted(found)


def trace_steps(
    workdir: str,
    steps: int,
    run_step: Callable[[Any], tuple[Any, Any]],
    carry: Any,
    report: Callable[[str], None],
) -> str | None:
    """Runs `carry, outputs = run_step(carry)` `steps` times in a `ProfileWindow` of
    those steps (the trace goes to workdir/profile) and says how it went through
    `report`. Returns the trace folder, or None when the profiler failed (say, a GPU
    without CUPTI): a caller that timed steps before keeps its measurement."""
    window = ProfileWindow(f"0:{steps}", workdir)
    try:
        for step in range(steps):
            window.before_step(step)
            carry, outputs = run_step(carry)
            window.after_step(step, outputs)
    except Exception as e:  # noqa: BLE001 - any profiler failure: report it, go on
        report(f"no trace written to {window.logdir}: {type(e).__name__}: {e}")
        return None
    report(f"wrote a trace of {steps} steps to {window.logdir}")
    return window.logdir
