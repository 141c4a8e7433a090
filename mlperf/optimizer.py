"""Optimizers and learning-rate schedules from config (optax), phase-aware.

The schedule is one function of the global step across training phases: each phase
(e.g. BERT phase 1 at seq 128, phase 2 at seq 512, Lin et al.) gets its own linear
warmup and polynomial decay, joined at the step where the phase starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import optax


@dataclasses.dataclass(frozen=True)
class PhaseSchedule:
    """Learning-rate shape of one phase, in that phase's own steps."""

    learning_rate: float
    warmup_steps: int
    decay_steps: int
    steps: int
    power: float = 1.0
    end_learning_rate: float = 0.0
    # Step drops (Mask R-CNN, SSD): after warmup the rate stays constant and is
    # multiplied by `drop_factor` at each of these phase steps, instead of decaying.
    drop_steps: tuple[int, ...] = ()
    drop_factor: float = 0.1


def phase_schedule(p: PhaseSchedule) -> optax.Schedule:
    """Linear warmup from 0 to lr, then polynomial decay to `end_learning_rate` (or
    step drops when `drop_steps` is set)."""
    warmup = optax.linear_schedule(0.0, p.learning_rate, max(p.warmup_steps, 1))
    if p.drop_steps:
        if any(s <= p.warmup_steps for s in p.drop_steps):
            raise ValueError(
                f"optimizer.lr_drop_steps={tuple(p.drop_steps)} must all come after the "
                f"{p.warmup_steps} warmup steps."
            )
        decay = optax.piecewise_constant_schedule(
            p.learning_rate, {s - p.warmup_steps: p.drop_factor for s in p.drop_steps}
        )
    else:
        decay = optax.polynomial_schedule(
            p.learning_rate, p.end_learning_rate, p.power, max(p.decay_steps - p.warmup_steps, 1)
        )
    if p.warmup_steps <= 0:
        return decay
    return optax.join_schedules([warmup, decay], [p.warmup_steps])


def joined_schedule(phases: Sequence[PhaseSchedule]) -> optax.Schedule:
    """One schedule over global steps: phase i starts after the steps of phases < i."""
    schedules = [phase_schedule(p) for p in phases]
    boundaries, total = [], 0
    for p in phases[:-1]:
        total += p.steps
        boundaries.append(total)
    return schedules[0] if len(schedules) == 1 else optax.join_schedules(schedules, boundaries)


def decay_mask(params) -> object:
    """Weight decay on weight matrices only: not on biases or layer-norm scales (BERT)."""

    def keep(path, _):
        name = str(getattr(path[-1], "key", path[-1]))
        return name not in ("bias", "scale", "mlm_bias")

    return jax.tree_util.tree_map_with_path(keep, params)


def build_optimizer(opt_cfg, schedule: optax.Schedule) -> optax.GradientTransformation:
    """optax transformation named by `opt_cfg.name` (lamb, adamw, adam, sgd, lars)."""
    name = opt_cfg.name
    adam_moments = {"b1": opt_cfg.b1, "b2": opt_cfg.b2, "eps": opt_cfg.eps}
    if name in ("lamb", "adamw"):
        make = optax.lamb if name == "lamb" else optax.adamw
        tx = make(schedule, **adam_moments, weight_decay=opt_cfg.weight_decay, mask=decay_mask)
    elif name == "adam":
        tx = optax.adam(schedule, **adam_moments)
    elif name == "sgd":
        tx = optax.sgd(schedule, momentum=opt_cfg.get("momentum", 0.9))
    elif name == "lars":
        tx = optax.lars(
            schedule, weight_decay=opt_cfg.weight_decay, momentum=opt_cfg.get("momentum", 0.9)
        )
    else:
        raise ValueError(f"optimizer.name={name!r} is unknown; use lamb, adamw, adam, sgd or lars.")
    clip = opt_cfg.get("grad_clip_norm", 0.0)
    return optax.chain(optax.clip_by_global_norm(clip), tx) if clip else tx
