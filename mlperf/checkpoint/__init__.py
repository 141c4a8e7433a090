"""Checkpoints of a training run: sharded state, input position, loop counters, log offsets.

One step directory per checkpoint, written by orbax's CheckpointManager asynchronously
(training continues while it writes); each holds `state/` (the sharded train state, each
host writing its own shards), `meta/` (JSON: counters, eval schedule, MLPerf block state,
RNG key, log offsets, leaf shapes) and `data/` (per-process grain iterator state).

    manager.py          CheckpointConfig, Checkpointer: save, wait, restore (newest
                        readable first), retention, failed saves as one line
    integrity.py        the file manifest, the shapes check, committed steps on disk,
                        the free space a resume needs
    config_change.py    which config changes a resume accepts (trajectory-neutral keys)
    stability.py        loss spikes and the last good checkpoint
    iterator_state.py   the input iterator's checkpointable state
    resume.py           the input iterator's position and the reopened MLPerf log
    stopping.py         the preemption notice (SIGTERM, SIGINT) and the finite-values check
    process_settings.py process-wide orbax settings, made once at program start
"""

from mlperf.checkpoint.config_change import (
    ConfigChange,
    ConfigChangeError,
    check_config_change,
    plain_config,
)
from mlperf.checkpoint.integrity import (
    MANIFEST,
    CheckpointMismatchError,
    check_compatible,
    check_manifest,
    checkpoint_metadata,
    committed_steps,
    free_space_needed,
    leaf_shapes,
    write_manifest,
)
from mlperf.checkpoint.iterator_state import iterator_state_of
from mlperf.checkpoint.manager import (
    CheckpointConfig,
    Checkpointer,
    CheckpointSaveError,
    NoUsableCheckpointError,
    Restored,
)
from mlperf.checkpoint.process_settings import configure_checkpointing
from mlperf.checkpoint.resume import resume_position
from mlperf.checkpoint.stability import SpikeRule, last_good
from mlperf.checkpoint.stopping import PreemptionNotice, all_finite

__all__ = [
    "MANIFEST",
    "CheckpointConfig",
    "CheckpointSaveError",
    "ConfigChange",
    "ConfigChangeError",
    "SpikeRule",
    "check_config_change",
    "configure_checkpointing",
    "free_space_needed",
    "last_good",
    "plain_config",
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
    "resume_position",
    "write_manifest",
]
