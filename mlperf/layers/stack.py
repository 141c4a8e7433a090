"""A layer stack as one module: `n` layers' parameters stacked on a leading dimension
with the logical axis `stack` (parallel/rules.py maps it to no mesh axis), for models
that apply their layers with lax.scan (BERT's and the Transformer's `model.scan_layers`)."""

from __future__ import annotations

from collections.abc import Callable

import jax
from flax import nnx


def stacked_layers(make: Callable[[nnx.Rngs], nnx.Module], n: int, rngs: nnx.Rngs) -> nnx.Module:
    """`n` layers from `make(rngs)` as one module whose parameters have a leading [n]
    dimension with the logical axis `stack`, each layer from its own key."""
    keys = jax.random.split(rngs.params(), n)

    @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "stack"})
    def build(key):
        return make(nnx.Rngs(params=key))

    return build(keys)
