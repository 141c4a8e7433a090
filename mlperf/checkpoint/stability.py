"""Loss spikes: when a run's loss leaves its recent range, and which checkpoint was good.

A finite loss is not proof of a healthy run: a diverging run writes finite checkpoints
for a while before its loss overflows. A logged loss more than `factor` times the running
median of the last `window` stable losses starts an instability at that step; it ends when
a loss is back within the factor. Checkpoints written from the start of an instability on
are not "good": the last good checkpoint is the newest one written before it began.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mlperf.config_error import ConfigError
from mlperf.loop_state import LoopState

MIN_HISTORY = 3  # losses needed before a median means anything


@dataclasses.dataclass(frozen=True)
class SpikeRule:
    """A loss above `factor` x the median of the last `window` stable losses is a spike."""

    factor: float = 10.0
    window: int = 20

    @classmethod
    def from_config(cls, config) -> SpikeRule:
        c = config.get("checkpoint", None) or {}
        rule = cls(float(c.get("loss_spike_factor", 10.0)), int(c.get("loss_spike_window", 20)))
        if not rule.factor > 1.0 or rule.window < MIN_HISTORY:
            raise ConfigError(
                f"checkpoint.loss_spike_factor={rule.factor} / loss_spike_window={rule.window}:"
                f" the factor must be > 1 and the window >= {MIN_HISTORY} logged losses."
            )
        return rule

    def observe(self, state: LoopState, step: int, loss: float) -> str | None:
        """Feeds one finite loss into `state`; a message when an instability begins."""
        history = state.loss_history
        spike = False
        if len(history) >= MIN_HISTORY:
            median = float(np.median(history))
            spike = median > 0 and loss > self.factor * median
        if spike:
            if state.unstable_since is None:
                state.unstable_since = step
                return (
                    f"loss spike at step {step}: {loss:.4g} is more than "
                    f"{self.factor:g}x the running median {median:.4g}; checkpoints from "
                    "here on are not counted as good until the loss is back in range."
                )
            return None
        state.unstable_since = None
        history.append(loss)
        del history[: -self.window]
        return None


def last_good(saved: list[tuple[int, str]], unstable_since: int | None) -> str | None:
    """The newest checkpoint path written before the instability began (all: the newest).

    `saved` lists (step, path) of this run's checkpoints, oldest first."""
    good = [path for step, path in saved if unstable_since is None or step < unstable_since]
    return good[-1] if good else None
