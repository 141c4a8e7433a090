"""Where a run starts: the newest readable checkpoint of its work directory, or the init.

`restore_or_init` restores the newest checkpoint (checking, before anything compiles, that
it is this model's and that the config differs only in keys a resume accepts) or builds
the initial state (random, then the pretrained parameters if any); either way it returns
a `RunStart` with the state, the RNG key and the loop counters to continue from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from mlperf.checkpoint import (
    Checkpointer,
    ConfigChange,
    Restored,
    check_config_change,
    plain_config,
)
from mlperf.goodput import Goodput
from mlperf.loop_state import LoopState
from mlperf.pretrained import Pretrained
from mlperf.trainer import Trainer


@dataclasses.dataclass
class RunStart:
    """The state a run starts from, its RNG key, and what it continues (if anything)."""

    state: Any
    key: Any
    restored: Restored | None = None  # the checkpoint it continues
    loop_state: LoopState | None = None  # the counters stored with it
    changes: list[ConfigChange] = dataclasses.field(default_factory=list)  # vs its config

    @property
    def resumed_step(self) -> int | None:
        return self.restored.step if self.restored is not None else None


def restore_or_init(
    trainer: Trainer,
    checkpointer: Checkpointer | None,
    resuming: bool,
    allowed: set[str],
    goodput: Goodput,
    pretrained: Pretrained | None,
) -> RunStart:
    """The newest readable checkpoint when `resuming` (another model's checkpoint, or a
    config change outside `allowed` that alters the trajectory, fails before compiling),
    else the initial state."""
    config, partitioner = trainer.config, trainer.partitioner
    restored, changes = None, []
    if resuming:

        def check_meta(meta: dict[str, Any], path: str) -> None:
            if "config" in meta:
                changes[:] = check_config_change(
                    meta["config"], plain_config(config), allowed, path
                )

        with goodput.timing("checkpoint_restore_s"):
            restored = checkpointer.restore_latest(trainer.layout.abstract_train_state, check_meta)
    if restored is None:
        state = trainer.init_state()
        key = partitioner.replicate(lambda: jax.random.key(config.seed))
        if pretrained is not None:
            print(f"initialised from {pretrained.describe()}", flush=True)
        return RunStart(state, key)
    loop_state = LoopState.from_meta(restored.meta)
    key_data = np.asarray(loop_state.rng_key, np.uint32)
    key = partitioner.replicate(lambda: jax.random.wrap_key_data(key_data))
    print(f"resuming from {restored.path} (step {restored.step})", flush=True)
    report_changes(changes, restored, loop_state)
    goodput.resumed_at(restored.step)
    return RunStart(restored.state, key, restored, loop_state, changes)


def report_changes(changes: list[ConfigChange], restored: Restored, resumed: LoopState) -> None:
    """One line for the changes that cannot alter the trajectory, one for forced ones;
    forced ones are added to the run's record (saved with its later checkpoints)."""
    neutral = [c for c in changes if c.neutral]
    forced = [c for c in changes if not c.neutral]
    if restored.meta.get("process_count", jax.process_count()) != jax.process_count():
        print(
            f"resuming with {jax.process_count()} process(es); the checkpoint was written by "
            f"{restored.meta['process_count']} (resharded)",
            flush=True,
        )
    if neutral:
        shown = "; ".join(c.describe() for c in neutral)
        print(f"config changes that cannot alter the training trajectory: {shown}", flush=True)
    if forced:
        shown = "; ".join(c.describe() for c in forced)
        print(
            f"WARNING: continuing with config changes that alter the training trajectory "
            f"(--allow_config_change): {shown}; recorded in the MLPerf log and result.json.",
            flush=True,
        )
        resumed.forced_config_changes.extend(
            {**c.as_dict(), "forced": True, "step": restored.step} for c in forced
        )
