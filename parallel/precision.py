"""Mixed-precision policy: fp32 master params and optimizer state, bf16 compute.

The MLPerf v0.7 TPU runs kept fp32 weights and optimizer state and ran matmuls and
convolutions in bfloat16; losses and logits are reduced in fp32. CPU tests may switch
compute to fp32 to compare against single-device references tightly.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Policy:
    """Dtypes for parameters (storage) and compute (activations, matmuls); losses and
    logits are always fp32."""

    param_dtype: jnp.dtype = jnp.float32
    compute_dtype: jnp.dtype = jnp.bfloat16


def dtype_from_name(name: str) -> jnp.dtype:
    """'bfloat16' -> jnp.bfloat16, with a clear error for unknown names."""
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(_DTYPES)}.")
    return _DTYPES[name]


def policy_from_config(compute_dtype: str, param_dtype: str = "float32") -> Policy:
    """Builds the policy from config strings (e.g. precision.compute_dtype='bfloat16')."""
    return Policy(
        param_dtype=dtype_from_name(param_dtype),
        compute_dtype=dtype_from_name(compute_dtype),
    )
