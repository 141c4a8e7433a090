"""Which gradient all-reduce the TPU compiler would pick: XLA's own `psum` and each
`parallel.collectives` algorithm compiled for one mesh axis of a TPU slice at one message
size, ranked by libtpu's step-time estimate (`optimal_seconds`).

The planner (`launch.plan --collectives`) asks this for each candidate's `data` axis and
gradient bytes per device; `launch.bench.collectives` tables it over sizes and slices.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from parallel import collectives, costmodel
from parallel.mesh import build_mesh

XLA = "xla_psum"


def _body(algorithm: str, axis: str, chunks: int | None):
    if algorithm == XLA:
        return lambda v: jax.lax.psum(v, axis)
    return lambda v: collectives.all_reduce(v, axis, algorithm, chunks)


def algorithms_for(group: int) -> list[str]:
    """XLA's psum and the algorithms that run on a group of this size."""
    power_of_two = group & (group - 1) == 0
    return [
        XLA,
        *(a for a in collectives.ALGORITHMS if a != "bidirectional_exchange" or power_of_two),
    ]


def compiler_estimates(topology: str, mesh: dict[str, int], axis: str, n_bytes: int) -> list:
    """One row per algorithm: libtpu's estimate of an all-reduce of `n_bytes` per device
    over `axis` of the mesh `mesh` (axis -> size, all of the slice's devices) on the TPU
    `topology`, the linear pipeline's chunks from the alpha-beta model at the chip's link
    bandwidth, the compile time, or the error (one failing algorithm does not stop the
    rest)."""
    from parallel.aot import cost_analysis
    from parallel.topology import get_topology

    topo = get_topology(topology)
    axes, sizes = tuple(mesh), tuple(mesh.values())
    device_mesh = build_mesh(axes, sizes, devices=topo.devices)
    spec = PartitionSpec(*axes)
    shape = (*device_mesh.devices.shape, max(n_bytes // 4, 1))
    arg = jax.ShapeDtypeStruct(shape, np.float32, sharding=NamedSharding(device_mesh, spec))
    group = device_mesh.shape[axis]
    # One link direction per core (a chip's cores share its links), as bench collectives.
    beta = topo.devices_per_chip / topo.chip.link_bandwidth
    rows = []
    for algorithm in algorithms_for(group):
        chunks = None
        if algorithm == "linear_pipeline":
            chunks = costmodel.lp_chunks(
                "all_reduce", group, n_bytes, costmodel.DEFAULT_ALPHA, beta
            )
        row: dict[str, Any] = {"algorithm": algorithm, "group": group, "bytes": n_bytes}
        start = time.perf_counter()
        try:
            body = _body(algorithm, axis, chunks)
            program = jax.jit(jax.shard_map(body, mesh=device_mesh, in_specs=spec, out_specs=spec))
            cost = cost_analysis(program.lower(arg).compile())
            estimate = float(cost.get("optimal_seconds", -1.0))
            row["tpu_estimate_s"] = estimate if estimate > 0 else None  # v4/v5e/v6e: < 0
        except Exception as e:  # one algorithm that does not compile is a row
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        row["compile_s"] = time.perf_counter() - start
        row["num_chunks"] = chunks
        rows.append(row)
    return rows


def pick(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The algorithm with the lowest compiler estimate, its estimate and XLA psum's, or why
    there is none (every estimate unusable or failed)."""
    usable = [r for r in rows if r.get("tpu_estimate_s")]
    if not usable:
        return {"algorithm": None, "why": "no usable compiler estimate"}
    best = min(usable, key=lambda r: r["tpu_estimate_s"])
    xla = next((r["tpu_estimate_s"] for r in usable if r["algorithm"] == XLA), None)
    return {"algorithm": best["algorithm"], "seconds": best["tpu_estimate_s"], "xla_psum_s": xla}
