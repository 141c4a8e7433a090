"""mlperf/layers/softmax.py: jax.nn.softmax's values and gradients, no [B, H, Q, K]
broadcast of the sum's reciprocal on CPU, and the plain softmax for other platforms."""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import mlperf.layers.attention_core as attention_core
import mlperf.layers.cached_attention as cached_attention
from mlperf.layers.softmax import softmax


def _plain(scores):
    return jax.nn.softmax(scores, axis=-1)


def _scores():
    s = jax.random.normal(jax.random.key(0), (2, 3, 8, 16), jnp.float32) * 4
    keep = jnp.arange(16) < jnp.array([16, 9, 1])[None, :, None, None]
    return jnp.where(keep, s, -1e9)  # masked keys, down to a single key per row


def _loss(fn):
    weights = jax.random.normal(jax.random.key(1), (2, 3, 8, 16), jnp.float32)
    return lambda s: jnp.sum(jnp.sin(fn(s) * weights))


def test_values_and_gradients_are_jax_nn_softmax():
    s = _scores()
    np.testing.assert_allclose(jax.jit(softmax)(s), _plain(s), rtol=1e-6, atol=1e-7)
    ours = jax.jit(jax.grad(_loss(softmax)))(s)
    ref = jax.jit(jax.grad(_loss(_plain)))(s)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(ours)[:, 2, :, 1:] == 0)  # masked keys get no gradient


def test_bf16_scores_stay_bf16():
    s = _scores().astype(jnp.bfloat16)
    assert softmax(s).dtype == jnp.bfloat16
    assert jax.grad(lambda s: jnp.sum(softmax(s).astype(jnp.float32)))(s).dtype == jnp.bfloat16


def _full_shape_broadcasts(softmax_fn, monkeypatch) -> int:
    """Two causal self-attention layers at the Transformer tiny peer's size, differentiated
    and compiled for CPU, the attention core whole: how many fusions only broadcast
    something to [B, H, Q, K]."""
    monkeypatch.setattr(attention_core, "softmax", softmax_fn)
    batch, length, dim, heads = 32, 64, 64, 4
    layers = [
        cached_attention.MultiHeadAttention(dim, heads, rngs=nnx.Rngs(i), cpu_block_bytes=0)
        for i in (0, 1)
    ]
    graphdef, params = nnx.split(layers)
    mask = cached_attention.causal_mask(length)

    def loss(params, x):
        for layer in nnx.merge(graphdef, params):
            x = x + layer(x, x, mask)
        return jnp.sum(jnp.sin(x))

    x = jax.random.normal(jax.random.key(0), (batch, length, dim), jnp.float32)
    hlo = jax.jit(jax.grad(loss)).lower(params, x).compile().as_text()
    shape = rf"f32\[{batch},{heads},{length},{length}\]"
    return len(re.findall(rf"%wrapped_broadcast[.\d]* = {shape}", hlo.split("ENTRY")[1]))


def test_cpu_backward_writes_no_full_shape_reciprocal(monkeypatch):
    assert _full_shape_broadcasts(_plain, monkeypatch) == 2  # one per layer
    assert _full_shape_broadcasts(softmax, monkeypatch) == 0


def test_other_platforms_lower_jax_nn_softmax():
    s = _scores()
    for platform in ("tpu", "cuda"):
        ops = {}
        for name, fn in (("ours", softmax), ("plain", _plain)):
            text = jax.jit(jax.grad(_loss(fn))).trace(s).lower(lowering_platforms=(platform,))
            found = re.findall(r"stablehlo\.(\w+)", text.as_text())
            # platform_dependent's selector: a `case` on a constant index.
            selector = ("case", "return", "constant")
            ops[name] = collections.Counter(o for o in found if o not in selector)
        assert ops["ours"] == ops["plain"], platform
