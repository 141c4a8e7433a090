"""How close each side of `launch.bench.peers` runs to the machine's matmul peak.

Both sides of a comparison do the same model FLOPs per example (the task's analytic
`flops_per_example`, the numerator of the framework's MFU), so a row's samples/s turn into
model FLOP/s, and the matmul peak of the same threads in the same process into MFU. The
ceiling is the ratio ours / peer that a step doing nothing but those FLOPs at that peak
would reach: when the peer already runs near the peak, no implementation can be far
ahead of it, whatever its kernels.
"""

from __future__ import annotations

from typing import Any

from mlperf.peak_flops import matmul_flops_per_s, measure_matmul_peak

PEAK_MATMUL_SIZE = 1024  # square; as MFU's CPU peak (mlperf/peak_flops.py)


def torch_matmul_peak(n: int = PEAK_MATMUL_SIZE, repeats: int = 5, dtype: str = "float32") -> float:
    """FLOP/s of a square torch.mm in `dtype` on torch's current threads."""
    import torch

    a = torch.ones(n, n, dtype=getattr(torch, dtype))
    return matmul_flops_per_s(lambda: torch.mm(a, a), n, repeats)


def matmul_peak(dtype: str = "float32") -> dict[str, float]:
    """The matmul peak of this process's threads in `dtype`, as each library measures it
    (call after the threads are set: `common.limit_threads`)."""
    return {
        "jax": measure_matmul_peak(PEAK_MATMUL_SIZE, dtype=dtype),
        "torch": torch_matmul_peak(PEAK_MATMUL_SIZE, dtype=dtype),
    }


def add_utilisation(row: dict[str, Any], flops_per_example: float, peak: dict[str, float]) -> None:
    """Model FLOPs, MFU of both sides and the ceiling into a `peers.compare` row.
    The peak is the faster library's: the one either side could reach."""
    best = max(peak.values())
    ours = row["ours_samples_per_s"] * flops_per_example
    peer = row["peer_samples_per_s"] * flops_per_example
    row.update(
        model_flops_per_example=flops_per_example,
        matmul_peak_flops_per_s=dict(peak),
        ours_mfu=ours / best,
        peer_mfu=peer / best,
        ceiling=best / peer,
    )
