"""Peak FLOP/s of the devices in use, the denominator of model FLOPs utilisation (MFU).

TPU and known GPUs (H100, H200, A100, T4): the chip's published dense bf16 peak from
parallel/hardware.py, per JAX device (a v2/v3 JAX device is one TensorCore, half a
chip; v4 in megacore mode and later expose one device per chip).
CPU: there is no meaningful published number for a shared host, so the peak is measured:
the FLOP/s of a large fp32 matmul, which XLA runs on all the host's cores at once (fake
CPU devices share those cores, so the host's peak is the peak of all of them together).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from parallel.hardware import bf16_peak_flops_per_device


@dataclasses.dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of the devices a run uses, and where the number comes from."""

    flops_per_s: float
    source: str  # "published bf16 (TPU v4) x 8 devices" or "measured fp32 matmul (cpu)"


def matmul_flops_per_s(multiply: Callable[[], Any], n: int, repeats: int = 5) -> float:
    """FLOP/s of `multiply`, one square n x n matmul that returns once its result is
    ready: after one untimed call, the median of `repeats` timings of four calls."""
    multiply()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(4):
            multiply()
        times.append((time.perf_counter() - start) / 4)
    return 2.0 * n**3 / statistics.median(times)


def measure_matmul_peak(n: int = 1024, repeats: int = 5, dtype: str = "float32") -> float:
    """FLOP/s of a square matmul (fp32 unless `dtype` says otherwise) on one device: this
    machine's practical peak. The product accumulates into fp32, as the models' matmuls
    do (mlperf/layers/matmul.py): XLA:CPU runs a bf16 dot with a bf16 result on fp32
    copies of its operands, at about half the speed."""
    a = jnp.ones((n, n), dtype)
    matmul = jax.jit(lambda x: jax.lax.dot(x, x, preferred_element_type=jnp.float32))
    return matmul_flops_per_s(lambda: matmul(a).block_until_ready(), n, repeats)


@functools.cache
def _measured_peak() -> float:
    return measure_matmul_peak()


def peak_for_devices(devices: list | None = None) -> Peak:
    """Peak FLOP/s of `devices` (default: all of them): published for known TPUs and
    GPUs, measured once per process on CPU (and for unknown accelerators, with a note)."""
    devices = list(jax.devices() if devices is None else devices)
    kind = devices[0].device_kind
    if devices[0].platform == "cpu":
        # Fake CPU devices share the host's cores: the host peak is the peak of them all.
        return Peak(_measured_peak(), "measured fp32 matmul (cpu host)")
    per_device = bf16_peak_flops_per_device(kind)
    if per_device is not None:
        return Peak(per_device * len(devices), f"published bf16 ({kind}) x {len(devices)}")
    if devices[0].platform == "tpu":
        raise ValueError(
            f"no published peak for device kind {kind!r}; add its chip to "
            "parallel/hardware.py:CHIPS."
        )
    per_device = _measured_peak()
    return Peak(per_device * len(devices), f"measured fp32 matmul ({kind}) x {len(devices)}")
