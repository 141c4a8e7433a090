"""mlperf/layers/matmul.py and the fp32-summed bias: the same values and gradients as the
plain dot, XLA:CPU's fast form only where it is meant, and remat keeping the outputs."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mlperf.bert.model import REMAT_POLICIES
from mlperf.layers.bias import add_bias_fp32_sum
from mlperf.layers.matmul import matmul, matmul_transposed


def _operands(dtype):
    x = jax.random.normal(jax.random.key(0), (64, 48), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (48, 80), jnp.float32) / 8
    return x.astype(dtype), w.astype(dtype)


def _plain(x, w):
    return x @ w


def _loss(fn):
    return lambda x, w: jnp.sum(jnp.sin(fn(x, w).astype(jnp.float32)))


def test_fp32_values_and_gradients_are_the_plain_dots():
    x, w = _operands(jnp.float32)
    np.testing.assert_array_equal(jax.jit(matmul)(x, w), jax.jit(_plain)(x, w))
    ours = jax.jit(jax.grad(_loss(matmul), (0, 1)))(x, w)
    ref = jax.jit(jax.grad(_loss(_plain), (0, 1)))(x, w)
    for a, b in zip(ours, ref, strict=True):
        np.testing.assert_array_equal(a, b)


def test_bf16_gradients_match_fp32_to_bf16_rounding():
    x, w = _operands(jnp.bfloat16)
    y = jax.jit(matmul)(x, w)
    assert y.dtype == jnp.bfloat16
    ref_y = _plain(x.astype(jnp.float32), w.astype(jnp.float32))
    np.testing.assert_allclose(y.astype(jnp.float32), ref_y, rtol=2e-2, atol=2e-2)
    grads = jax.jit(jax.grad(_loss(matmul), (0, 1)))(x, w)
    ref = jax.grad(_loss(_plain), (0, 1))(x.astype(jnp.float32), w.astype(jnp.float32))
    for g, r, operand in zip(grads, ref, (x, w), strict=True):
        assert g.dtype == jnp.bfloat16 and g.shape == operand.shape
        scale = float(jnp.max(jnp.abs(r)))
        # bf16 products, fp32 sums: a few bf16 ulps of the largest entry.
        np.testing.assert_allclose(g.astype(jnp.float32), r, atol=0.05 * scale)


def test_cpu_bf16_weight_gradient_takes_the_transposed_operand_on_ynnpack():
    """On CPU the bf16 backward carries the one-trip transpose loop and all three dots
    run as YNNPACK fusions; an fp32 backward has no loop; a TPU or GPU lowering neither."""
    x, w = _operands(jnp.bfloat16)
    grad = jax.jit(jax.grad(_loss(matmul), (0, 1)))
    cpu_hlo = grad.lower(x, w).compile().as_text()
    assert re.search(r"\bwhile\(", cpu_hlo)
    assert cpu_hlo.count('"kind":"__ynn_fusion"') >= 3
    # Every dot sits in a YNNPACK fusion: XLA:CPU's fallback is a dot of the operands
    # converted to fp32, issued from the entry computation.
    assert cpu_hlo.count(" dot(") == 3
    assert " dot(" not in cpu_hlo.split("ENTRY")[1]
    x32, w32 = _operands(jnp.float32)
    fp32_hlo = grad.lower(x32, w32).compile().as_text()
    assert not re.search(r"\bwhile\(", fp32_hlo)
    for platform in ("tpu", "cuda"):  # TPU and GPU programs get the plain dots
        text = grad.trace(x, w).lower(lowering_platforms=(platform,)).as_text()
        assert "stablehlo.while" not in text, platform
        assert "stablehlo.dot_general" in text, platform


def test_cpu_fp32_weight_gradient_into_a_narrow_result_is_computed_wide():
    """`[M, P]^T @ [M, Q]` with a narrow Q (a dense layer that narrows, such as the MLP's
    output projection) is the dot with a column-major result on CPU, the wide `[Q, P]`
    in memory, and the same gradient as the plain dot's to fp32 rounding; a layer that
    widens keeps the plain row-major dot."""
    x = jax.random.normal(jax.random.key(0), (512, 256), jnp.float32)
    grad = jax.jit(jax.grad(_loss(matmul), (0, 1)))
    for w_shape, layout in (((256, 64), "{0,1}"), ((256, 512), "{1,0}")):
        w = jax.random.normal(jax.random.key(1), w_shape, jnp.float32) / 16
        hlo = grad.lower(x, w).compile().as_text()
        weight_grad_dots = re.findall(rf"f32\[{w_shape[0]},{w_shape[1]}\](\{{[01,]+\}}) dot\(", hlo)
        assert weight_grad_dots == [layout], (w_shape, weight_grad_dots)
        ours = grad(x, w)
        ref = jax.jit(jax.grad(_loss(_plain), (0, 1)))(x, w)
        for a, b in zip(ours, ref, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_inside_shard_map_the_cpu_path_matches_the_unsharded_gradient():
    """The loop's carry takes x's manual-axis type, so the bf16 path traces inside a
    shard_map (check_vma on) and each replica's gradient is its own rows'."""
    mesh = jax.make_mesh((8,), ("data",))
    x, w = _operands(jnp.bfloat16)

    def per_replica(x, w):
        g = jax.grad(_loss(matmul), 1)(x, jax.lax.pcast(w, "data", to="varying"))
        return jax.lax.psum(g.astype(jnp.float32), "data")

    sharded = jax.jit(
        jax.shard_map(per_replica, mesh=mesh, in_specs=(P("data"), P()), out_specs=P())
    )(jax.device_put(x, NamedSharding(mesh, P("data"))), w)
    whole = jax.jit(jax.grad(_loss(matmul), 1))(x, w).astype(jnp.float32)
    np.testing.assert_allclose(sharded, whole, atol=0.05 * float(jnp.max(jnp.abs(whole))))


@pytest.mark.parametrize("policy", ["dots", "dots_no_batch"])
def test_remat_dot_policies_keep_the_matmul_outputs(policy):
    """Under jax.checkpoint with the models' dot policies the backward does not redo the
    forward matmul: three matmuls' FLOPs (forward, input and weight gradients), not four."""
    x, w = _operands(jnp.bfloat16)

    def layer(x, w):
        return jnp.tanh(matmul(x, w))

    def loss(x, w):
        f = jax.checkpoint(layer, policy=REMAT_POLICIES[policy])
        return jnp.sum(f(x, w).astype(jnp.float32))

    flops = jax.jit(jax.grad(loss, (0, 1))).lower(x, w).compile().cost_analysis()["flops"]
    one_matmul = 2 * 64 * 48 * 80
    assert 3 * one_matmul <= flops < 4 * one_matmul


def test_bias_gradient_is_an_fp32_sum_for_bf16():
    rows = jnp.zeros((4096, 3), jnp.bfloat16)
    bias = jnp.zeros((3,), jnp.bfloat16)

    def loss(b):
        return jnp.sum(add_bias_fp32_sum(rows, b).astype(jnp.float32) / 3.0)

    g_bias = jax.grad(loss)(bias)
    # Each row's cotangent is bf16(1/3) = 0.333984375; 4096 of them sum to 1368 exactly
    # in fp32 (a bf16 running sum would stall near 256, where its step is 2).
    assert g_bias.dtype == jnp.bfloat16
    np.testing.assert_array_equal(g_bias, jnp.full((3,), 1368.0, jnp.bfloat16))
    x = jax.random.normal(jax.random.key(2), (6, 5, 4, 3), jnp.float32)
    b = jax.random.normal(jax.random.key(3), (4, 3), jnp.float32)
    ours = jax.grad(lambda x, b: jnp.sum(jnp.sin(add_bias_fp32_sum(x, b))), (0, 1))(x, b)
    ref = jax.grad(lambda x, b: jnp.sum(jnp.sin(x + b)), (0, 1))(x, b)
    for a, r in zip(ours, ref, strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-6, atol=1e-6)


def test_bad_operands_are_clear_errors():
    x = jnp.ones((4, 3), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"matmul takes \[M, K\] @ \[K, N\], got \(4, 3\)"):
        matmul(x, jnp.ones((4, 5), jnp.bfloat16))
    with pytest.raises(ValueError, match="must share a dtype"):
        matmul(x, jnp.ones((3, 5), jnp.float32))


def _einsum_transposed(x, w):
    return jnp.einsum("...k,nk->...n", x, w)


def _dot_operand_types(hlo: str) -> set[str]:
    """Element types of the parameters of every computation that holds a dot (XLA:CPU
    wraps each dot in a fusion whose parameters are its operands)."""
    types = set()
    for computation in hlo.split("\n\n"):
        if " dot(" in computation:
            types |= set(re.findall(r"%param_[\d.]+ = (\w+)\[", computation))
    return types


def test_tied_projection_is_the_einsum_in_value_and_gradient_and_fast_on_cpu_bf16():
    """matmul_transposed (Embed.attend): x [B, L, K] @ w [N, K]^T. fp32 is the einsum;
    bf16 on CPU gives the einsum's values and gradients (both round fp32 sums once) from
    dots in YNNPACK fusions, with the loop for g^T; TPU and GPU lowerings are the einsum."""
    x = jax.random.normal(jax.random.key(0), (4, 16, 48), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (96, 48), jnp.float32) / 8
    for dtype in (jnp.float32, jnp.bfloat16):
        xd, wd = x.astype(dtype), w.astype(dtype)
        y = jax.jit(matmul_transposed)(xd, wd)
        assert y.dtype == dtype and y.shape == (4, 16, 96)
        np.testing.assert_array_equal(y, jax.jit(_einsum_transposed)(xd, wd))
        ours = jax.jit(jax.grad(_loss(matmul_transposed), (0, 1)))(xd, wd)
        ref = jax.jit(jax.grad(_loss(_einsum_transposed), (0, 1)))(xd, wd)
        for a, b in zip(ours, ref, strict=True):
            assert a.dtype == dtype
            np.testing.assert_array_equal(a, b)
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    grad = jax.jit(jax.grad(_loss(matmul_transposed), (0, 1)))
    cpu_hlo = grad.lower(xb, wb).compile().as_text()
    assert re.search(r"\bwhile\(", cpu_hlo)
    assert _dot_operand_types(cpu_hlo) == {"bf16"}
    # The plain einsum's dots take operands converted to fp32 (XLA:CPU's slow bf16 path).
    plain = jax.jit(jax.grad(_loss(_einsum_transposed), (0, 1))).lower(xb, wb).compile()
    assert "f32" in _dot_operand_types(plain.as_text())
    for platform in ("tpu", "cuda"):
        text = grad.trace(xb, wb).lower(lowering_platforms=(platform,)).as_text()
        assert "stablehlo.while" not in text, platform


def test_tied_projection_bad_operands_are_clear_errors():
    with pytest.raises(ValueError, match=r"takes \[\.\.\., K\] @ \[N, K\]\^T"):
        matmul_transposed(jnp.ones((2, 3)), jnp.ones((4, 5)))
    with pytest.raises(ValueError, match="must share a dtype"):
        matmul_transposed(jnp.ones((2, 3)), jnp.ones((4, 3), jnp.bfloat16))
