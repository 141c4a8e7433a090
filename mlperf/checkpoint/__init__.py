"""Checkpoints of a training run: sharded state, input position, loop counters, log offsets.

One step directory per checkpoint, written by orbax's CheckpointManager asynchronously
(training continues while it writes); each holds `state/` (the sharded train state, each
host writing its own shards), `meta/` (JSON: counters, eval schedule, MLPerf block state,
RNG key, log offsets, leaf shapes) and `data/` (per-process grain iterator state).

    manager.py    CheckpointConfig, Checkpointer: save, wait, restore (newest readable first)
    integrity.py  the file manifest, the shapes check, committed steps on disk
    resume.py     the input iterator's position and the reopened MLPerf log
    stopping.py   the preemption notice (SIGTERM) and the finite-values check
"""

from mlperf.checkpoint.integrity import (
    MANIFEST,
    CheckpointMismatchError,
    check_compatible,
    check_manifest,
    checkpoint_metadata,
    committed_steps,
    leaf_shapes,
    write_manifest,
)
from mlperf.checkpoint.manager import (
    CheckpointConfig,
    Checkpointer,
    NoUsableCheckpointError,
    Restored,
)
from mlperf.checkpoint.resume import iterator_state_of, reopen_mllog, resume_position
from mlperf.checkpoint.stopping import PreemptionNotice, all_finite

__all__ = [
    "MANIFEST",
    "CheckpointConfig",
    "CheckpointMismatchError",
    "checkpoint_metadata",
    "Checkpointer",
    "NoUsableCheckpointError",
    "PreemptionNotice",
    "Restored",
    "all_finite",
    "check_compatible",
    "check_manifest",
    "committed_steps",
    "iterator_state_of",
    "leaf_shapes",
    "reopen_mllog",
    "resume_position",
    "write_manifest",
]
