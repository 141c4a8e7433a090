"""The Transformer's learning-rate schedule: linear warmup, then reciprocal square root.

lr(t) = base * min(1, t / warmup) * rsqrt(max(t, warmup)) [* rsqrt(hidden)], with
t = step + 1: "constant * linear_warmup * rsqrt_decay" of Google's Transformer code,
optionally normalised by the model width as in Vaswani et al. (d_model ** -0.5).
The peak, at t = warmup, is base / sqrt(warmup) [/ sqrt(hidden)].
"""

from __future__ import annotations

import jax.numpy as jnp
import optax


def rsqrt_schedule(base: float, warmup_steps: int, hidden_size: int = 0) -> optax.Schedule:
    """The warmup + rsqrt-decay schedule; hidden_size > 0 adds the 1/sqrt(d_model) factor."""
    if warmup_steps < 1:
        raise ValueError(f"the rsqrt schedule needs warmup_steps >= 1, got {warmup_steps}")
    scale = base / (hidden_size**0.5 if hidden_size > 0 else 1.0)

    def schedule(step):
        t = jnp.asarray(step, jnp.float32) + 1.0
        warm = jnp.minimum(1.0, t / warmup_steps)
        return scale * warm * jnp.reciprocal(jnp.sqrt(jnp.maximum(t, float(warmup_steps))))

    return schedule
