"""Where a resumed run picks up: the input iterator's position and the MLPerf log.

The loop prefetches one batch ahead, so the iterator state saved with a checkpoint is the
one taken before the next batch was read; an iterator without checkpointable state (or a
checkpoint from another process count) is moved on by skipping the batches already taken.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import grain

from mlperf.mllog import MlLog

if TYPE_CHECKING:
    from mlperf.checkpoint.manager import Restored


def iterator_state_of(iterator) -> bytes | None:
    """The grain iterator's checkpointable state; None for an iterator without one (its
    position is then restored by skipping the batches already taken)."""
    get_state = getattr(iterator, "get_state", None)
    if get_state is None:
        return None
    state = get_state()
    return state if isinstance(state, bytes) else json.dumps(state).encode()


class FrozenIteratorState:
    """An iterator stand-in for grain's checkpoint handler: it holds the state captured
    when the batch after the checkpointed step was still unread."""

    def __init__(self, state: bytes | None = None):
        self.state = state

    def get_state(self) -> bytes:
        return b"null" if self.state is None else self.state

    def set_state(self, state: bytes) -> None:
        self.state = state

    def start_prefetch(self) -> None:  # grain's handler calls this after set_state
        pass


def resume_position(restored: Restored | None, phase_index: int, phase_steps: int, iterator) -> int:
    """Steps of a phase already trained at the checkpoint; moves the phase's fresh
    iterator to the first batch those steps had not taken."""
    if restored is None or phase_index > restored.meta["phase"]:
        return 0
    if phase_index < restored.meta["phase"]:
        return phase_steps  # an earlier phase: finished
    done = restored.meta["phase_step"]
    if restored.iterator_state is not None and hasattr(iterator, "set_state"):
        state = restored.iterator_state
        # grain's DataLoader iterators take bytes, its Dataset iterators a dict.
        iterator.set_state(
            json.loads(state) if isinstance(iterator, grain.DatasetIterator) else state
        )
    else:
        # Written by another process count (or no iterator state): this host's rows of the
        # same global batches follow from the number of batches taken (GlobalOrderHostRows).
        for _ in range(done):
            next(iterator)
    return done


def reopen_mllog(path: str, size: int, enabled: bool) -> MlLog:
    """An MlLog appending to `path` cut back to `size` bytes: the log as it was when the
    checkpoint was written, so the resumed run's events follow on (one log per run)."""
    if enabled:
        current = os.path.getsize(path) if os.path.exists(path) else 0
        if current < size:
            print(
                f"WARNING: {path} has {current} bytes, fewer than the {size} it had at the "
                "checkpoint; the MLPerf log of this run will be incomplete.",
                flush=True,
            )
        else:
            os.truncate(path, size)
    return MlLog(path, enabled=enabled, append=True)
