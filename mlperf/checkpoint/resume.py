"""Where a resumed run picks up (its input iterator's position), and where a run that
starts from scratch puts the logs of the run before it.

An iterator without checkpointable state (or a checkpoint from another process count) is
moved on by skipping the batches already taken.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import grain

from input_pipeline import storage

if TYPE_CHECKING:
    from mlperf.checkpoint.manager import Restored


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


# What a run writes into its work directory besides checkpoints.
RUN_FILES = ("mllog.txt", "metrics.jsonl", "result.json", "goodput.json", "tensorboard")


def set_aside_previous_run(workdir: str) -> str | None:
    """A run starting from scratch in a work directory that holds another run's logs (its
    checkpoints were deleted or disabled) moves them into WORKDIR/previous_run_<n>/ instead
    of overwriting them; returns the one line saying so (None: nothing to move)."""
    present = [name for name in RUN_FILES if storage.exists(storage.join(workdir, name))]
    if not present:
        return None
    n = 1
    while storage.exists(storage.join(workdir, f"previous_run_{n}")):
        n += 1
    target = storage.join(workdir, f"previous_run_{n}")
    storage.makedirs(target)
    for name in present:
        storage.rename(storage.join(workdir, name), storage.join(target, name))
    return (
        f"{workdir} holds the logs of an earlier run but no checkpoint to continue it: "
        f"moved {', '.join(present)} to {target} and starting from step 0."
    )
