"""Optimizers and learning-rate schedules from config (optax), phase-aware.

The schedule is one function of the global step across training phases: each phase
(e.g. BERT phase 1 at seq 128, phase 2 at seq 512, Lin et al.) gets its own linear
warmup and polynomial decay, joined at the step where the phase starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from mlperf.config_error import ConfigError


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
            raise ConfigError(
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


def scale_by_layer_trust_ratio(stacked: Any) -> optax.GradientTransformation:
    """LAMB's trust ratio ||w|| / ||u|| per layer: over a whole leaf, except that a
    leaf whose leading dimension is a scanned layer stack (`stacked` is True for it)
    gets one ratio per layer, its norms taken over the other dimensions. Without this
    a stacked leaf would share one ratio across all its layers, another optimizer
    than the unrolled model's. The state is optax's (checkpoints are unchanged)."""

    def norm(x, axes):
        return jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=axes, keepdims=True))

    def ratio(update, param, is_stacked):
        axes = tuple(range(1, update.ndim)) if is_stacked and update.ndim > 1 else None
        p_norm, u_norm = norm(param, axes), norm(update, axes)
        # A zero weight or a zero update keeps the update as it is (ratio 1).
        zero = jnp.logical_or(p_norm == 0.0, u_norm == 0.0)
        safe = jnp.where(zero, jnp.ones_like(p_norm), p_norm / jnp.where(zero, 1.0, u_norm))
        return update * safe.astype(update.dtype)

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("the trust ratio needs the parameters: tx.update(u, s, params)")
        return jax.tree.map(ratio, updates, params, stacked), state

    return optax.GradientTransformation(lambda _: optax.ScaleByTrustRatioState(), update_fn)


OPTIMIZERS = ("lamb", "adamw", "adam", "sgd", "lars")


def build_optimizer(
    opt_cfg, schedule: optax.Schedule, stacked: Any = None
) -> optax.GradientTransformation:
    """optax transformation named by `opt_cfg.name` (lamb, adamw, adam, sgd, lars).

    `stacked`: a params-shaped tree of bools, True for leaves whose leading dimension is
    a scanned layer stack; LAMB then takes its trust ratios per layer.
    """
    name = opt_cfg.name
    adam_moments = {"b1": opt_cfg.b1, "b2": opt_cfg.b2, "eps": opt_cfg.eps}
    has_stack = stacked is not None and any(jax.tree.leaves(stacked))
    if name == "lamb" and has_stack:
        # optax.lamb's chain with the per-layer trust ratio in place of the per-leaf one
        # (the same state tree).
        tx = optax.chain(
            optax.scale_by_adam(**adam_moments),
            optax.add_decayed_weights(opt_cfg.weight_decay, decay_mask),
            scale_by_layer_trust_ratio(stacked),
            optax.scale_by_learning_rate(schedule),
        )
    elif name == "lars" and has_stack:
        raise ConfigError(
            "optimizer.name=lars with a scanned layer stack (model.scan_layers) is not "
            "supported: its trust ratios would span all layers. Use lamb, or scan_layers=False."
        )
    elif name in ("lamb", "adamw"):
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
        raise ConfigError(
            f"optimizer.name={name!r} is unknown; use one of {', '.join(OPTIMIZERS)}."
        )
    clip = opt_cfg.get("grad_clip_norm", 0.0)
    return optax.chain(optax.clip_by_global_norm(clip), tx) if clip else tx
