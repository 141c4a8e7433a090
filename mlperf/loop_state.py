"""The training loop's counters: one dataclass that is also a checkpoint's metadata.

Everything a resumed run needs to continue exactly where the checkpoint was written
(step, samples, eval schedule, MLPerf block state, log offsets, RNG key) plus what it
needs to judge the resume (the resolved config, the loss history behind the spike check).
`to_meta` is what `Checkpointer.save` stores; `from_meta` reads it back (keys a checkpoint
does not have take their defaults; keys this class does not know, such as the leaf shapes
the checkpointer adds, are ignored).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class LoopState:
    """Counters of a run, saved with every checkpoint (see the module docstring)."""

    step: int = 0
    samples: int = 0
    next_eval: int = 0  # samples at which the next eval runs
    eval_metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    last_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    reached: bool = False
    to_target: dict[str, Any] = dataclasses.field(default_factory=dict)
    block_open: bool = False  # an MLPerf block_start without its block_stop yet
    block_start: int = 0  # samples at the open block's start
    evaluated_at: int = -1  # samples of the last eval taken
    phase: int = 0  # index of the phase being trained
    phase_step: int = 0  # steps of that phase done
    elapsed_s: float = 0.0  # run time (from run_start) up to the checkpoint
    model_flops: float = 0.0  # model FLOPs done up to the checkpoint (the run's mean MFU)
    mllog_bytes: int = 0  # the MLPerf log's and metrics.jsonl's sizes at the checkpoint
    metrics_bytes: int = 0
    rng_key: list[int] = dataclasses.field(default_factory=list)
    seed: int = 0
    benchmark: str = ""
    variant: str = ""
    config: dict[str, Any] = dataclasses.field(default_factory=dict)  # resolved, as JSON
    # Recent finite losses (the spike check's running median) and the step the current
    # loss spike began (None: stable).
    loss_history: list[float] = dataclasses.field(default_factory=list)
    unstable_since: int | None = None
    # Config changes forced with --allow_config_change over the run's restarts.
    forced_config_changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def to_meta(self) -> dict[str, Any]:
        """The checkpoint metadata (JSON-ready apart from numpy scalars in metrics)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> LoopState:
        """The state stored in a checkpoint's metadata."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in meta.items() if k in names})
