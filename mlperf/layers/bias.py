"""Biases added along the last axis, with gradients XLA:CPU computes fast.

`add_bias`: the gradient is a matrix-vector product.

The gradient of `x + bias` with respect to `bias` sums the cotangent over every leading
axis. For a wide last axis, such as BERT's masked-LM logits [B, P, 30,522], XLA:CPU runs
autodiff's column sum as a YNNPACK reduce fusion that was the costliest single op of
bert:wikitext's train step (15% of its op time in a profile); written as `ones @ g` the
same sum runs on the dot kernels (1% of the step) and the step runs 1.19x faster
(docs/design.md, "The masked-LM bias gradient"). The forward pass is the plain
broadcast add.

`add_bias_fp32_sum`: the gradient is the cotangent's column sum accumulated in fp32. For a
bf16 dense layer autodiff sums the bf16 cotangent into a bf16 bias gradient; XLA:CPU
turns that low-precision sum into a tree of reduce-windows on its slowest path (12.6 ms
for BERT-base's [8, 128, 3072] MLP bias on one core, where the fp32-accumulated sum takes
0.5 ms, docs/design.md). The fp32 sum is also the more accurate one; on fp32 inputs
it is autodiff's own sum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_vjp
def add_bias(x: jax.Array, bias: jax.Array) -> jax.Array:
    """`x + bias` for `x` [..., V] and `bias` [V]; the bias gradient is `ones @ g`."""
    return x + bias


def _add_bias_fwd(x, bias):
    # An empty array carries x's dtype to the backward (residuals must be arrays).
    return x + bias, (bias, jnp.zeros((0,), x.dtype))


def _add_bias_bwd(residuals, g):
    bias, x_dtype_carrier = residuals
    rows = g.reshape(-1, g.shape[-1])
    # HIGHEST keeps the fp32 sum exact where a default-precision dot would round the
    # cotangent to bfloat16 (TPU); on the CPU it is the ordinary fp32 dot.
    g_bias = jnp.dot(
        jnp.ones((rows.shape[0],), rows.dtype), rows, precision=jax.lax.Precision.HIGHEST
    )
    return g.astype(x_dtype_carrier.dtype), g_bias.astype(bias.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


@jax.custom_vjp
def add_bias_fp32_sum(x: jax.Array, bias: jax.Array) -> jax.Array:
    """`x + bias` for `bias` of x's trailing shape and dtype; the bias gradient sums the
    cotangent over the leading axes in fp32."""
    return x + bias


def _add_bias_fp32_sum_fwd(x, bias):
    return x + bias, bias


def _add_bias_fp32_sum_bwd(bias, g):
    # One column sum over the rows of a 2-D view (a 4-D sum over two axes took XLA:CPU
    # transposes and copies).
    rows = g.reshape(-1, bias.size)
    g_bias = jnp.sum(rows, axis=0, dtype=jnp.float32).reshape(bias.shape)
    return g, g_bias.astype(bias.dtype)


add_bias_fp32_sum.defvjp(_add_bias_fp32_sum_fwd, _add_bias_fp32_sum_bwd)
