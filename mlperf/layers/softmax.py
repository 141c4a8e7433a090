"""Softmax over the last axis whose backward pass on CPU keeps only its output.

`jax.nn.softmax` differentiates through `exp(s - max) / sum`: at the Transformer tiny
size XLA:CPU then writes the reciprocal of the sum broadcast to the full `[B, H, Q, K]`
shape once per attention layer (`test_softmax.py`). On CPU `softmax` has the same forward
value and the analytic backward `p * (g - sum(g * p))`, so the only `[B, H, Q, K]`
residual is `p` itself: the Transformer tiny step 1.02x on one core, 1.05x on two, BERT
tiny 1.01x (docs/design.md). Other lowerings (TPU, GPU, AOT compiles for TPU from a
CPU host) get `jax.nn.softmax` as before.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def softmax(scores: jax.Array) -> jax.Array:
    """softmax(scores) over the last axis, in the scores' dtype."""
    return lax.platform_dependent(scores, cpu=_cpu_softmax, default=_plain_softmax)


def _plain_softmax(scores: jax.Array) -> jax.Array:
    return jax.nn.softmax(scores, axis=-1)


# jax.nn.softmax's forward pass; only the backward is ours.
_cpu_softmax = jax.custom_vjp(_plain_softmax)


def _cpu_softmax_fwd(scores: jax.Array):
    probs = _cpu_softmax(scores)
    return probs, probs


def _cpu_softmax_bwd(probs: jax.Array, g: jax.Array):
    return (probs * (g - jnp.sum(g * probs, axis=-1, keepdims=True)),)


_cpu_softmax.defvjp(_cpu_softmax_fwd, _cpu_softmax_bwd)
