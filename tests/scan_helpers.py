"""What the scanned-layer-stack tests share (test_bert_scan.py, test_transformer_scan.py):
moving a model's parameters between the loop form (`<stack>/<i>/...`) and the scanned
form (`<stack>/...` with a leading [n] dim)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def stack(layers: dict) -> dict:
    """Loop-form `<stack>/<i>/...` -> scan-form `<stack>/...` with a leading [n] dim."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *[layers[i] for i in range(len(layers))])


def unstack(stacked: dict, n: int) -> dict:
    """Scan form -> loop form: layer i is every leaf at [i]."""
    return {i: jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(n)}


def params_of(model) -> dict:
    """The model's parameters as a nested dict of arrays."""
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def with_params(model, params: dict):
    """The model with its parameters replaced by `params` (a nested dict of arrays)."""
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(model, state)
    return model
