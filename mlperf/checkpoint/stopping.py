"""Why a run stops early: a preemption notice (SIGTERM) or Ctrl-C (SIGINT), or non-finite
values.

Either way the loop writes (or keeps) a checkpoint first, so the same command continues.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

PyTree = Any


class PreemptionNotice:
    """SIGTERM (preemption notice) or SIGINT (Ctrl-C) -> save a checkpoint at the next step
    and stop. A second Ctrl-C stops at once, without a checkpoint.

    One process: a signal handler sets a flag. Several processes: JAX's preemption sync
    point (set up by jax.distributed, whose notifier catches SIGTERM) makes every host stop
    at the same step, whichever host got the signal first; SIGINT is passed on to it as
    SIGTERM."""

    def __init__(self):
        self.signum: int | None = None  # the signal that asked the run to stop
        self._previous: dict[int, Any] = {}
        try:
            if jax.process_count() == 1:
                self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            pass

    @property
    def flag(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            # The next Ctrl-C interrupts at once (Python's default handler).
            signal.signal(signal.SIGINT, signal.default_int_handler)
            print(
                "Ctrl-C: writing a checkpoint after this step, then stopping "
                "(Ctrl-C again to stop without one).",
                flush=True,
            )
            if jax.process_count() > 1 and self.signum is None:
                self.signum = signum
                os.kill(os.getpid(), signal.SIGTERM)  # JAX's notifier syncs every host
                return
        if self.signum is None:
            self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum or signal.SIGTERM).name

    def reached(self, step: int) -> bool:
        """Whether the run must checkpoint after `step` and stop (the same on every host)."""
        if jax.process_count() == 1:
            return self.flag
        try:
            return multihost_utils.reached_preemption_sync_point(step)
        except RuntimeError:  # no preemption service in this cluster
            return False

    def close(self) -> None:
        for signum, previous in self._previous.items():
            if previous is not None:
                signal.signal(signum, previous)
        self._previous = {}


@jax.jit
def all_finite(tree: PyTree) -> jax.Array:
    """Whether every element of every leaf is finite (one device reduction)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
