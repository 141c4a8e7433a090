"""The 2-D matmul of dense layers, with a backward pass that XLA:CPU runs on its fast
kernels in bf16.

`matmul(x, w)` is `x @ w` for `x: [M, K]`, `w: [K, N]` of one dtype. Its three dots
(forward, input gradient, weight gradient) take the operands in that dtype and return
that dtype, as the plain dot and its autodiff do; fp32 operands get exactly those dots.

Why, for bf16 on CPU: XLA:CPU runs a bf16 dot on YNNPACK (AMX tiles on CPUs that have
them) only when the dot asks for an fp32 result and its left operand is row-major with
the contracted dimension last. Otherwise it converts the operands to fp32 and runs its
own dot: on one core of this project's CPU machine, `[1024, 768] @ [768, 3072]` takes
8 ms on YNNPACK against 36 ms converted (docs/design.md). So on CPU every bf16 dot
asks for fp32 and rounds once, and the weight gradient `x^T @ g`, which autodiff writes
as a contraction over both operands' first dimension, gets `x^T` materialised first.
XLA folds a plain transpose back into the dot (and expands optimisation barriers before
it decides), so the transpose is the body of a one-trip loop whose trip count XLA cannot
see. `lax.platform_dependent` applies this on CPU only, per lowering platform: an AOT
compile for TPU on a CPU host gets the plain dots, which the TPU compiler accumulates in
fp32 already (an fp32 result there is an extra [M, N] write and convert: 7.6% on a
BERT-large step compiled for v3, docs/design.md).

A remat policy cannot see into custom_vjp functions: the output is named
`MATMUL_OUTPUT` (`jax.ad_checkpoint.checkpoint_name`) so that the models' dot policies
save it by name.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

# The name of `matmul`'s output: without it a dots remat policy recomputes the matmul in
# the backward pass (+29% FLOPs on BERT-large compiled for v3).
MATMUL_OUTPUT = "matmul_output"

_CONTRACT_LAST_FIRST = (((1,), (0,)), ((), ()))  # [M, K] @ [K, N]
_CONTRACT_LAST_LAST = (((1,), (1,)), ((), ()))  # [M, N] @ [K, N]^T
_CONTRACT_FIRST_FIRST = (((0,), (0,)), ((), ()))  # [M, K]^T @ [M, N]


def _dot(a: jax.Array, b: jax.Array, dims) -> jax.Array:
    """One dot of same-dtype operands, its result in their dtype: a bf16 dot asks for the
    fp32 result (XLA:CPU's fast path) and rounds it once."""
    if a.dtype == jnp.float32:
        return lax.dot_general(a, b, dims)
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32).astype(a.dtype)


def _transpose_in_loop(x: jax.Array) -> jax.Array:
    """`x.T` as the result of a one-trip while loop: XLA cannot fold it into the dot that
    consumes it, so the dot sees a row-major operand. The trip count is 1 whatever `x`
    holds (`min(bits | 1, 1)` of x's first element, which XLA does not evaluate), and
    the loop's only carried array is written by its body."""
    bits = lax.bitcast_convert_type(x.reshape(-1)[0].astype(jnp.float32), jnp.uint32)
    trips = jnp.minimum(bits | jnp.uint32(1), jnp.uint32(1)).astype(jnp.int32)

    def body(i, _):
        return x.T

    # zeros_like keeps x's type, so inside shard_map the carry varies as x.T does.
    init = jnp.zeros_like(x, shape=x.shape[::-1])
    return lax.fori_loop(0, trips, body, init)


def _a_transposed_times_b(a: jax.Array, b: jax.Array) -> jax.Array:
    """`a^T @ b` for `a: [M, P]`, `b: [M, Q]`, the weight gradient's contraction. A bf16
    `a^T` is materialised first (see the module docstring); XLA:CPU's own fp32 dot takes
    the transposed operand as fast as YNNPACK does, but not into a narrow result: with
    Q <= `_NARROW_RESULT` < P it computes `(b^T @ a)^T`, the dot's result kept wide."""
    if a.dtype == jnp.float32:
        if b.shape[1] <= _NARROW_RESULT < a.shape[1]:
            return _transposed_result(lax.dot_general(b, a, _CONTRACT_FIRST_FIRST))
        return lax.dot_general(a, b, _CONTRACT_FIRST_FIRST)
    return _dot(_transpose_in_loop(a), b, _CONTRACT_LAST_FIRST)


# XLA:CPU's fp32 dot into a result of at most this many columns, `[M, P]^T @ [M, Q]`,
# runs at about half the rate of the same contraction into the wide `[Q, P]` (49-57
# against 80-105 GFLOP/s for Q = 64, 128 and M from 160 to 2048 on one core of an AMD
# EPYC); at Q = 768 the two are within ~10% and the result's transpose costs the
# difference (docs/design.md).
_NARROW_RESULT = 128


def _transposed_result(product: jax.Array) -> jax.Array:
    """`product.T`, its transpose kept apart from the dot until layout assignment: the
    algebraic simplifier would fold it into the narrow-result dot, while layout assignment
    gives that dot a column-major result, the wide product in memory
    (`test_matmul.py`)."""
    return lax.optimization_barrier(product).T


def _check(x: jax.Array, w: jax.Array) -> None:
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"matmul takes [M, K] @ [K, N], got {x.shape} and {w.shape}.")
    _check_dtypes(x, w)


def _check_dtypes(x: jax.Array, w: jax.Array) -> None:
    if x.dtype != w.dtype:
        raise ValueError(f"matmul operands must share a dtype, got {x.dtype} and {w.dtype}.")


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x @ w` for `[M, K] @ [K, N]` operands of one dtype, in that dtype. A lowering for
    CPU runs the custom_vjp below; every other lowering gets the plain dot and its
    autodiff, outside any custom_vjp: BERT-large's scanned, rematerialised v3 step was
    estimated 2.4% slower with the custom_vjp's plain dots (docs/design.md)."""
    _check(x, w)
    return checkpoint_name(
        lax.platform_dependent(x, w, cpu=_cpu_matmul, default=jnp.dot), MATMUL_OUTPUT
    )


def _cpu_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    return _matmul(x, w, False)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(x: jax.Array, w: jax.Array, w_transposed: bool) -> jax.Array:
    """`x @ w` for `w: [K, N]`, or `x @ w.T` for `w: [N, K]` when `w_transposed`."""
    return _dot(x, w, _CONTRACT_LAST_LAST if w_transposed else _CONTRACT_LAST_FIRST)


def _matmul_fwd(x: jax.Array, w: jax.Array, w_transposed: bool):
    return _matmul(x, w, w_transposed), (x, w)


def _matmul_bwd(w_transposed: bool, residuals, g: jax.Array):
    x, w = residuals
    g = g.astype(x.dtype)
    if w_transposed:  # y = x @ w.T: dx = g @ w, dw = g^T @ x
        dx = _dot(g, w, _CONTRACT_LAST_FIRST)
        dw = _a_transposed_times_b(g, x)
    else:  # y = x @ w: dx = g @ w.T, dw = x^T @ g
        dx = _dot(g, w, _CONTRACT_LAST_LAST)
        dw = _a_transposed_times_b(x, g)
    return dx, dw.astype(w.dtype)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul_transposed(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x @ w.T` for `x: [..., K]`, `w: [N, K]` of one dtype (a tied output projection),
    in that dtype. A bf16 lowering for CPU runs its three dots in XLA:CPU's fast forms,
    as `matmul` does; every other lowering, AOT compiles for TPU from a CPU host included,
    gets the plain einsum and its autodiff, so TPU and GPU programs stay as they were
    (through `matmul`'s 2-D form they did not: +1.7% on the Transformer-big v3 step)."""
    if x.ndim < 1 or w.ndim != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"matmul_transposed takes [..., K] @ [N, K]^T, got {x.shape}, {w.shape}.")
    _check_dtypes(x, w)
    if x.dtype == jnp.float32:
        return _einsum_transposed(x, w)
    return lax.platform_dependent(x, w, cpu=_cpu_matmul_transposed, default=_einsum_transposed)


def _einsum_transposed(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.einsum("...k,nk->...n", x, w)


def _cpu_matmul_transposed(x: jax.Array, w: jax.Array) -> jax.Array:
    out = checkpoint_name(_matmul(x.reshape(-1, x.shape[-1]), w, True), MATMUL_OUTPUT)
    return out.reshape(*x.shape[:-1], w.shape[0])
