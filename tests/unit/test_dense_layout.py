"""DenseGeneral's 2-D matmul: same values as the einsum it replaces, and a weight
gradient that XLA:CPU computes without a transpose copy of the cotangent."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mlperf.layers.linear import DenseGeneral


def _einsum_reference(x, kernel, bias, n_in):
    batch = "abcdefghijklm"[: x.ndim - n_in]
    ins = "nopqr"[:n_in]
    outs = "stuvw"[: kernel.ndim - n_in]
    return jnp.einsum(f"{batch}{ins},{ins}{outs}->{batch}{outs}", x, kernel) + bias


@pytest.mark.parametrize(
    "in_shape,out_shape,axes",
    [
        ((16,), (24,), ("embed", "mlp")),
        ((16,), (4, 6), ("embed", "heads", "kv")),
        ((4, 6), (16,), ("heads", "kv", "embed")),
    ],
)
def test_values_and_gradients_match_einsum(in_shape, out_shape, axes):
    layer = DenseGeneral(in_shape, out_shape, axes, rngs=nnx.Rngs(0))
    layer.bias[...] = jnp.linspace(-1.0, 1.0, np.prod(out_shape)).reshape(out_shape)
    x = jax.random.normal(jax.random.key(1), (3, 5, *in_shape))
    kernel, bias = layer.kernel[...], layer.bias[...]

    graphdef, _ = nnx.split(layer)

    def ours(x, kernel, bias):
        state = nnx.State({"kernel": nnx.Param(kernel), "bias": nnx.Param(bias)})
        return jnp.sum(jnp.sin(nnx.merge(graphdef, state)(x)))

    def ref(x, kernel, bias):
        return jnp.sum(jnp.sin(_einsum_reference(x, kernel, bias, len(in_shape))))

    got = jax.grad(ours, argnums=(0, 1, 2))(x, kernel, bias)
    want = jax.grad(ref, argnums=(0, 1, 2))(x, kernel, bias)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert layer.kernel[...].shape == (*in_shape, *out_shape)  # parameters keep their shape


def test_weight_gradient_has_no_transpose_copy():
    """The regression this layer's 2-D form fixes: with an einsum over [B, L, K], XLA:CPU
    built dW from a transposed copy of the [B, L, N] cotangent."""
    layer = DenseGeneral((32,), (64,), ("embed", "mlp"), rngs=nnx.Rngs(0), use_bias=False)
    x = jnp.ones((8, 16, 32))

    graphdef, _ = nnx.split(layer)

    def loss(kernel):
        model = nnx.merge(graphdef, nnx.State({"kernel": nnx.Param(kernel)}))
        return jnp.sum(jnp.square(model(x)))

    hlo = jax.jit(jax.grad(loss)).lower(layer.kernel[...]).compile().as_text()
    assert " transpose(" not in hlo and " copy(" not in hlo, hlo
