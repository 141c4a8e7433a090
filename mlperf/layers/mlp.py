"""Feed-forward block with its hidden units over the `model` axis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.layers.linear import DenseGeneral
from parallel.partition import constrain


class MlpBlock(nnx.Module):
    """Dense(embed -> mlp), activation, Dense(mlp -> embed)."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        *,
        rngs: nnx.Rngs,
        activation: str = "gelu",
        dtype: jnp.dtype = jnp.float32,
    ):
        self.activation = activation
        self.wi = DenseGeneral((dim,), (hidden,), ("embed", "mlp"), rngs=rngs, dtype=dtype)
        self.wo = DenseGeneral((hidden,), (dim,), ("mlp", "embed"), rngs=rngs, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.wi(x)
        # BERT uses the exact (erf) GELU; the Transformer uses ReLU.
        h = jax.nn.gelu(h, approximate=False) if self.activation == "gelu" else jax.nn.relu(h)
        h = constrain(h, ("batch", "length", "mlp"))
        return self.wo(h)
