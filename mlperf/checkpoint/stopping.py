"""Why a run stops early: a preemption notice (SIGTERM), or non-finite values.

Either way the loop writes (or keeps) a checkpoint first, so the same command continues.
"""

from __future__ import annotations

import signal
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

PyTree = Any


class PreemptionNotice:
    """SIGTERM (preemption notice) -> save a checkpoint at the next step and stop.

    One process: a signal handler sets a flag. Several processes: JAX's preemption sync
    point (set up by jax.distributed, whose notifier catches SIGTERM) makes every host stop
    at the same step, whichever host got the signal first."""

    def __init__(self):
        self.flag = False
        self._previous = None
        if jax.process_count() == 1:
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.flag = True

    def reached(self, step: int) -> bool:
        """Whether the run must checkpoint after `step` and stop (the same on every host)."""
        if jax.process_count() == 1:
            return self.flag
        try:
            return multihost_utils.reached_preemption_sync_point(step)
        except RuntimeError:  # no preemption service in this cluster
            return False

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


@jax.jit
def all_finite(tree: PyTree) -> jax.Array:
    """Whether every element of every leaf is finite (one device reduction)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
