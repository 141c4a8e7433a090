"""The Transformer's learning-rate schedule: linear warmup, then reciprocal square root.

lr(t) = base * min(1, t / warmup) / sqrt(max(t, warmup)) [/ sqrt(hidden)], with t the
optimizer's update count (0 at the first update, whose rate is therefore 0): the
"constant * linear_warmup * rsqrt_decay * rsqrt_hidden_size" factors of Google's MLPerf
v0.7 JAX Transformer, which evaluates them at its optimizer's step count, with
hidden = the attention width (1024 for the big model). The peak, at t = warmup, is
base / sqrt(warmup) [/ sqrt(hidden)]: 3.3092157691415953 / sqrt(664) / sqrt(1024) = 4.01e-3
for the v0.7 values.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from mlperf.config_error import ConfigError


def rsqrt_schedule(base: float, warmup_steps: int, hidden_size: int = 0) -> optax.Schedule:
    """The warmup + rsqrt-decay schedule; hidden_size > 0 adds the 1/sqrt(hidden) factor."""
    if warmup_steps < 1:
        raise ConfigError(f"the rsqrt schedule needs warmup_steps >= 1, got {warmup_steps}")
    scale = base / (hidden_size**0.5 if hidden_size > 0 else 1.0)

    def schedule(step):
        t = jnp.asarray(step, jnp.float32)
        warm = jnp.minimum(1.0, t / warmup_steps)
        return scale * warm * jnp.reciprocal(jnp.sqrt(jnp.maximum(t, float(warmup_steps))))

    return schedule
