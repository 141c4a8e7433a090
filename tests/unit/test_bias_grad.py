"""`add_bias` is `x + bias` with the bias gradient computed as a matrix-vector product:
same values and gradients as the broadcast add, on one device and sharded over a 2 x 4
mesh, and the backward holds a dot where autodiff of the add holds a column sum."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mlperf.layers.bias import add_bias


def _grads(add, x, bias, cotangent):
    return jax.jit(jax.grad(lambda x, b: jnp.sum(add(x, b) * cotangent), argnums=(0, 1)))(x, bias)


@pytest.mark.parametrize("shape", [(40, 300), (8, 5, 300)])
def test_values_and_gradients_equal_the_broadcast_add(shape):
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], shape)
    bias = jax.random.normal(keys[1], shape[-1:])
    cotangent = jax.random.normal(keys[2], shape)
    np.testing.assert_array_equal(add_bias(x, bias), x + bias)
    gx, gb = _grads(add_bias, x, bias, cotangent)
    ref_gx, ref_gb = _grads(lambda x, b: x + b, x, bias, cotangent)
    np.testing.assert_array_equal(gx, ref_gx)
    assert gb.shape == bias.shape and gb.dtype == bias.dtype
    np.testing.assert_allclose(gb, ref_gb, rtol=1e-5, atol=1e-5)
    assert float(jnp.max(jnp.abs(gb))) > 1.0  # a real sum, not zeros


def test_a_bfloat16_input_gets_gradients_in_its_own_and_the_bias_dtype():
    x = jax.random.normal(jax.random.key(1), (16, 64)).astype(jnp.bfloat16)
    bias = jnp.zeros((64,), jnp.float32)
    gx, gb = _grads(add_bias, x, bias, jnp.ones((16, 64), jnp.bfloat16))
    assert gx.dtype == jnp.bfloat16 and gb.dtype == jnp.float32
    np.testing.assert_array_equal(gb, np.full(64, 16.0))


def test_sharded_over_a_mesh_gives_the_same_gradients():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    rows_by_columns = NamedSharding(mesh, PartitionSpec("data", "model"))
    keys = jax.random.split(jax.random.key(2), 3)
    x = jax.random.normal(keys[0], (16, 64))
    bias = jax.random.normal(keys[1], (64,))
    cotangent = jax.random.normal(keys[2], (16, 64))
    gx, gb = _grads(
        add_bias,
        jax.device_put(x, rows_by_columns),
        jax.device_put(bias, NamedSharding(mesh, PartitionSpec("model"))),
        jax.device_put(cotangent, rows_by_columns),
    )
    np.testing.assert_allclose(gb, jnp.sum(cotangent, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(gx, cotangent)


def test_the_backward_sums_with_a_dot_not_a_reduction():
    def backward_primitives(add):
        x, bias, cotangent = jnp.ones((32, 100)), jnp.ones((100,)), jnp.ones((32, 100))
        _, pullback = jax.vjp(add, x, bias)
        jaxpr = jax.make_jaxpr(pullback)(cotangent)
        return {str(eqn.primitive) for eqn in jaxpr.eqns}

    assert "reduce_sum" in backward_primitives(lambda x, b: x + b)
    ours = backward_primitives(add_bias)
    assert "dot_general" in ours and "reduce_sum" not in ours
