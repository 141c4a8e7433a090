"""This host's rates for the CPU step-time model: memory bandwidth and the in-process
collective rate of its fake CPU devices, each measured here, and the model itself.

Fake CPU devices (`--xla_force_host_platform_device_count=8`) are threads of one process
sharing the host's cores, caches and memory: they do not add compute, they split it.
The model therefore charges the work of ALL devices against the host's rates (the
devices' programs run side by side on the same cores, so their FLOPs and bytes add up):

    step = D x (F / peak + B / bandwidth) + alpha x G / D + W / rate

F, B: the compiled program's FLOPs and bytes accessed per device; D: the devices; W: the
ring wire bytes per device of its collectives and G: the devices meeting in them, summed
over its collective ops (`parallel.aot.hlo_op_stats`). alpha is the cost of one
collective of all D devices, measured with `psum` alone on the host; a collective of a
group of g devices is charged g/D of it, because its cost on shared cores is mostly the
wait for the group's threads to arrive, and fewer threads arrive sooner (the assumption
the predicted-vs-measured table tests). Compute and memory time add rather than overlap
(the devices compete for both), and per-op dispatch cost is left out.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from parallel.hlo_text import wire_bytes
from parallel.mesh import build_mesh


def median_time(fn, x, repeats: int) -> float:
    """Median seconds of `fn(x)` over `repeats` calls, after one compile/warm-up call."""
    jax.block_until_ready(fn(x))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(x))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_memory_bandwidth(
    n_bytes: int = 64 << 20, passes: int = 8, repeats: int = 5
) -> tuple[float, str]:
    """(bytes/s, how): `passes` in-place passes of `x * a + b` over an fp32 array of
    `n_bytes` (far beyond the caches) on one device, each pass reading and writing the
    array once (2 x n_bytes, how XLA's cost analysis counts an elementwise op), over the
    median time."""
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    fn = jax.jit(lambda v: jax.lax.fori_loop(0, passes, lambda i, u: u * 1.0001 + 1e-6, v))
    seconds = median_time(fn, x, repeats)
    moved = 2 * n_bytes * passes
    how = (
        f"{passes} passes of x*a+b over {n_bytes >> 20} MiB fp32 on one device, "
        f"{moved >> 20} MiB read+written / median of {repeats} ({seconds * 1e3:.1f} ms)"
    )
    return moved / seconds, how


def measure_collective_rate(
    devices: list | None = None, small: int = 4 << 10, large: int = 4 << 20, repeats: int = 7
) -> tuple[float, float, str]:
    """(alpha s per collective, wire bytes/s, how): `psum` over a 1-D mesh of all
    `devices` at `small` and `large` bytes per device; the ring wire bytes of each
    (`parallel.hlo_text.wire_bytes`, what the step's collectives are counted in) fitted as
    t = alpha + wire / rate through the two points."""
    devices = list(jax.devices() if devices is None else devices)
    P = len(devices)
    mesh = build_mesh(("x",), (P,), devices=devices)
    spec = PartitionSpec("x")
    fn = jax.jit(
        jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=spec, out_specs=spec)
    )
    points = []
    for size in (small, large):
        n = max(size // 4, 1)
        data = np.arange(P * n, dtype=np.float32).reshape(P * n) % 7
        x = jax.device_put(data, NamedSharding(mesh, spec))
        points.append((wire_bytes("all-reduce", 4 * n, P), median_time(fn, x, repeats)))
    (w0, t0), (w1, t1) = points
    rate = (w1 - w0) / max(t1 - t0, 1e-9)
    alpha = max(t0 - w0 / rate, 1e-7)
    how = (
        f"psum over {P} devices at {small >> 10} KiB and {large >> 20} MiB per device "
        f"(median of {repeats}: {t0 * 1e3:.3f} ms, {t1 * 1e3:.3f} ms), ring wire bytes fitted "
        f"as alpha + wire/rate"
    )
    return alpha, rate, how


@dataclasses.dataclass(frozen=True)
class HostRates:
    """The measured constants of the CPU model, each with how it was measured."""

    devices: int
    peak_flops: float  # FLOP/s of the whole host (all devices share it)
    peak_how: str
    memory_bandwidth: float  # bytes/s of the whole host
    memory_how: str
    collective_alpha: float  # seconds per collective of all the devices
    collective_rate: float  # ring wire bytes per device per second
    collective_how: str

    def lines(self) -> list[str]:
        """The constants, one per line, each with its measurement."""
        return [
            f"host peak {self.peak_flops / 1e9:.1f} GFLOP/s ({self.peak_how})",
            f"host memory bandwidth {self.memory_bandwidth / 1e9:.2f} GB/s ({self.memory_how})",
            f"collective alpha {self.collective_alpha * 1e6:.0f} us, rate "
            f"{self.collective_rate / 1e9:.2f} GB/s wire bytes per device ({self.collective_how})",
        ]


@dataclasses.dataclass(frozen=True)
class CpuStep:
    """A predicted CPU step, split into its terms (seconds)."""

    compute_s: float
    memory_s: float
    comm_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.memory_s + self.comm_s


def cpu_step_time(
    flops: float, bytes_accessed: float, group_devices: int, wire: float, rates: HostRates
) -> CpuStep:
    """The step of one compiled program (per-device figures) on this host's fake devices:
    every device's work at the shared host's rates, plus the collectives (module doc)."""
    d = rates.devices
    return CpuStep(
        compute_s=d * flops / rates.peak_flops,
        memory_s=d * bytes_accessed / rates.memory_bandwidth,
        comm_s=rates.collective_alpha * group_devices / d + wire / rates.collective_rate,
    )
