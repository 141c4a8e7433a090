"""The MLPerf training rules for BERT that depend on the round (`mlperf.round`).

Quality target (masked-LM accuracy on the fixed 10,000-example eval set): 0.712 in v0.7,
0.720 from v1.0 on. Evaluation frequency, from the rules (training_rules.adoc):

    v0.7:  first at 3,000,000 training samples, then every 500,000
    v1.0+: every FLOOR(0.05 * (230.23 * GBS + 3,000,000), 25,000) samples, skipping 0
           (FLOOR(x, 25000) rounds down to a multiple of 25,000)

An eval runs at the first step boundary at or past each due sample count.
"""

from __future__ import annotations

from mlperf.config_error import ConfigError

V07_TARGET = 0.712
V10_TARGET = 0.720


def _round_number(mlperf_round: str) -> float:
    try:
        number = float(mlperf_round)
    except (TypeError, ValueError):
        number = -1.0
    if number < 0.7:
        raise ConfigError(
            f"mlperf.round must be an MLPerf training round with BERT (0.7, 1.0, 1.1, "
            f"2.0, ...), got {mlperf_round!r}"
        )
    return number


def round_target(mlperf_round: str) -> float:
    """The masked-LM accuracy target of the round."""
    return V07_TARGET if _round_number(mlperf_round) < 1.0 else V10_TARGET


def eval_schedule(mlperf_round: str, global_batch_size: int) -> tuple[int, int]:
    """(samples at the first eval, samples between evals) under the round's rules."""
    if _round_number(mlperf_round) < 1.0:
        return 3_000_000, 500_000
    every = int(0.05 * (230.23 * global_batch_size + 3_000_000)) // 25_000 * 25_000
    return every, every
