"""Attention scores and softmax in bfloat16 (`model.attention_softmax_dtype`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs.bert import get_config
from mlperf.layers.attention import SelfAttention
from mlperf.validate import ConfigError, validate


def _attention(softmax_dtype):
    return SelfAttention(64, 4, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, softmax_dtype=softmax_dtype)


def _inputs():
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 64), jnp.bfloat16)
    mask = jnp.ones((2, 16), jnp.int32).at[1, 12:].set(0)
    return x, mask


def _score_dtypes(layer, x, mask):
    """dtypes of the [B, H, L, L] tensors in the layer's program."""
    jaxpr = jax.make_jaxpr(lambda x, m: layer(x, m))(x, mask)
    return {
        str(v.aval.dtype)
        for eqn in jaxpr.jaxpr.eqns
        for v in eqn.outvars
        if getattr(v.aval, "shape", ()) == (2, 4, 16, 16)
    }


def test_bf16_softmax_keeps_the_score_tensors_in_bf16_and_close_to_fp32():
    x, mask = _inputs()
    f32, bf16 = _attention(jnp.float32), _attention(jnp.bfloat16)
    assert "float32" in _score_dtypes(f32, x, mask)
    assert _score_dtypes(bf16, x, mask) == {"bfloat16"}
    a = np.asarray(f32(x, mask), np.float32)
    b = np.asarray(bf16(x, mask), np.float32)
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()


def test_an_unknown_softmax_dtype_is_one_clear_error():
    config = get_config("tiny")
    config.model.attention_softmax_dtype = "float16"
    with pytest.raises(ConfigError, match="attention_softmax_dtype='float16'"):
        validate(config, 8)
