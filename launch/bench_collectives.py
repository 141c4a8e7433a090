"""All-reduce algorithms measured against the alpha-beta model and XLA's own all-reduce.

    python -m launch.bench collectives [--sizes 4K,64K,1M,16M,64M] [--device_counts 2,4,8]
                                       [--plot collectives.png] [--json]

For each device count P (a 1-D mesh of the first P devices) and message size (bytes per
device, fp32), every algorithm of parallel/collectives.py is timed (median of repeats
after a warm-up, all in this one run) next to `lax.psum`, and next to the cost model's
prediction with alpha and beta fitted on this machine from two single ppermutes. Ratios
are against psum in the same run, since absolute times on a shared CPU are noisy.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from parallel import collectives, costmodel
from parallel.mesh import build_mesh

XLA = "xla_psum"


def parse_size(text: str) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '512' -> 512."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(f"message size {text!r}: use a positive number with K, M or G.")
    return int(number) * scale


def _timed(fn, x, repeats: int) -> float:
    jax.block_until_ready(fn(x))  # compile + warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(x))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _program(mesh, body):
    spec = PartitionSpec("x")
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))


def _message(mesh, n_bytes: int) -> jax.Array:
    P = mesh.shape["x"]
    n = max(n_bytes // 4, 1)
    data = np.arange(P * n, dtype=np.float32).reshape(P, n) % 7
    return jax.device_put(data, NamedSharding(mesh, PartitionSpec("x")))


def fit_link(mesh, repeats: int) -> tuple[float, float]:
    """(alpha s, beta s/byte) from one ring-shift ppermute of 4 KiB and of 16 MiB."""
    P = mesh.shape["x"]
    perm = [(i, (i + 1) % P) for i in range(P)]
    shift = _program(mesh, lambda v: jax.lax.ppermute(v, "x", perm))
    small, large = 4 << 10, 16 << 20
    t_small = _timed(shift, _message(mesh, small), repeats)
    t_large = _timed(shift, _message(mesh, large), repeats)
    beta = max((t_large - t_small) / (large - small), 1e-13)
    return max(t_small - small * beta, 1e-7), beta


def bench(sizes: list[int], device_counts: list[int], repeats: int = 3) -> list[dict[str, Any]]:
    """One row per (P, size, algorithm): measured s, model s, ratio to psum."""
    rows = []
    for P in device_counts:
        mesh = build_mesh(("x",), (P,), devices=jax.devices()[:P])
        alpha, beta = fit_link(mesh, repeats)
        for n_bytes in sizes:
            x = _message(mesh, n_bytes)
            xla_s = _timed(_program(mesh, lambda v: jax.lax.psum(v, "x")), x, repeats)
            rows.append(
                {
                    "P": P,
                    "bytes": n_bytes,
                    "algorithm": XLA,
                    "measured_s": xla_s,
                    "model_s": None,
                    "vs_xla": 1.0,
                }
            )
            for algorithm in collectives.ALGORITHMS:
                if algorithm == "bidirectional_exchange" and P & (P - 1):
                    continue
                k = costmodel.lp_chunks(
                    "all_reduce", P, n_bytes, alpha, beta, max_chunks=max(n_bytes // 4, 1)
                )
                chunks = k if algorithm == "linear_pipeline" else None

                def body(v, algorithm=algorithm, chunks=chunks):
                    return collectives.all_reduce(v, "x", algorithm, chunks)

                measured = _timed(_program(mesh, body), x, repeats)
                model = costmodel.collective_time(
                    "all_reduce", algorithm, P, n_bytes, alpha, beta, num_chunks=chunks
                )
                rows.append(
                    {
                        "P": P,
                        "bytes": n_bytes,
                        "algorithm": algorithm,
                        "measured_s": measured,
                        "model_s": model,
                        "vs_xla": measured / xla_s,
                        "num_chunks": chunks,
                        "alpha_s": alpha,
                        "beta_s_per_byte": beta,
                    }
                )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| P | bytes/device | algorithm | measured | model | time / psum |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        model = f"{r['model_s'] * 1e3:.2f} ms" if r["model_s"] is not None else "-"
        lines.append(
            f"| {r['P']} | {r['bytes']:,} | {r['algorithm']} | "
            f"{r['measured_s'] * 1e3:.2f} ms | {model} | {r['vs_xla']:.2f}x |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Bandwidth (bytes per device / measured s) against message size, one panel per P."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["P"] for r in rows})
    fig, axes = plt.subplots(1, len(counts), figsize=(5 * len(counts), 4), squeeze=False)
    for ax, P in zip(axes[0], counts, strict=True):
        for algorithm in [XLA, *collectives.ALGORITHMS]:
            pts = [
                (r["bytes"], r["bytes"] / r["measured_s"])
                for r in rows
                if r["P"] == P and r["algorithm"] == algorithm
            ]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=algorithm)
        ax.set(
            xscale="log",
            yscale="log",
            title=f"all-reduce, P={P}",
            xlabel="bytes per device",
            ylabel="bytes / s",
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
