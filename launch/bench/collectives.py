"""All-reduce algorithms measured against the alpha-beta model and XLA's own all-reduce.

    python -m launch.bench.collectives [--sizes 4K,64K,1M,16M,64M] [--device_counts 2,4,8]
                                       [--plot collectives.png] [--json] [--no_tpu_estimates]

For each device count P (a 1-D mesh of the first P devices) and message size (bytes per
device, fp32), every algorithm of parallel/collectives.py is timed (median of repeats
after a warm-up, all in this one run) next to `lax.psum`, and next to the cost model's
prediction with alpha and beta fitted on this machine from two single ppermutes. Ratios
are against psum in the same run, since absolute times on a shared CPU are noisy.

Next to the CPU measurements, every algorithm is also AOT-compiled for TPU slices
(v3:4x4 = 32 cores, v3:32x32 = 2048 cores; libtpu, no TPU needed) over a 1-D mesh of all
their cores, and the TPU compiler's estimated time (`optimal_seconds`) is reported with
the alpha-beta model for that chip's ICI link. Those ~50 TPU compiles take about 15
minutes on 2 CPU cores; `--no_tpu_estimates` skips them (CPU measurements only).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from absl import flags
from jax.sharding import NamedSharding, PartitionSpec

from launch.bench.common import REPEATS, print_rows, run
from launch.cli import usage_error
from parallel import collectives, costmodel
from parallel.allreduce_choice import XLA
from parallel.host_rates import median_time
from parallel.mesh import build_mesh

AOT_TOPOLOGIES = ("v3:4x4", "v3:32x32")

_SIZES = flags.DEFINE_list("sizes", ["4K", "64K", "1M", "16M", "64M"], "Bytes per device (K/M/G).")
_DEVICE_COUNTS = flags.DEFINE_list("device_counts", ["2", "4", "8"], "Device counts P.")
_PLOT = flags.DEFINE_string("plot", "", "Write a bandwidth plot (PNG) here.")
_NO_TPU_ESTIMATES = flags.DEFINE_bool(
    "no_tpu_estimates", False, "Skip the TPU AOT compiles (~15 min on 2 cores)."
)


def parse_size(text: str) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '512' -> 512."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(f"message size {text!r}: use a positive number with K, M or G.")
    return int(number) * scale


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
    t_small = median_time(shift, _message(mesh, small), repeats)
    t_large = median_time(shift, _message(mesh, large), repeats)
    beta = max((t_large - t_small) / (large - small), 1e-13)
    return max(t_small - small * beta, 1e-7), beta


def _all_reduce_body(algorithm: str, chunks: int | None):
    if algorithm == XLA:
        return lambda v: jax.lax.psum(v, "x")
    return lambda v: collectives.all_reduce(v, "x", algorithm, chunks)


def aot_estimates(sizes: list[int], topologies=AOT_TOPOLOGIES) -> list[dict[str, Any]]:
    """The TPU compiler's estimated seconds for psum and every algorithm, per topology and
    message size (bytes per device), beside the alpha-beta model for the chip's link."""
    from parallel.allreduce_choice import compiler_estimates
    from parallel.topology import get_topology

    rows = []
    for name in topologies:
        topo = get_topology(name)
        P = len(topo.devices)
        # One link direction per core (a chip's cores share its links); alpha: the
        # model's default per-message latency.
        alpha, beta = costmodel.DEFAULT_ALPHA, topo.devices_per_chip / topo.chip.link_bandwidth
        for n_bytes in sizes:
            for est in compiler_estimates(name, {"x": P}, "x", n_bytes):
                algorithm, chunks = est["algorithm"], est["num_chunks"]
                row: dict[str, Any] = {"topology": name, "P": P, "bytes": n_bytes}
                row.update(algorithm=algorithm, measured_s=None, num_chunks=chunks)
                row.update({k: est[k] for k in ("tpu_estimate_s", "error") if k in est})
                row["compile_s"] = est["compile_s"]
                row["model_s"] = (
                    None
                    if algorithm == XLA
                    else costmodel.collective_time(
                        "all_reduce", algorithm, P, n_bytes, alpha, beta, num_chunks=chunks
                    )
                )
                rows.append(row)
    return rows


def bench(
    sizes: list[int],
    device_counts: list[int],
    repeats: int = 3,
    aot_topologies=AOT_TOPOLOGIES,
) -> list[dict[str, Any]]:
    """One row per (P, size, algorithm): measured s, model s, ratio to psum; then the
    TPU compiler's estimates for `aot_topologies` (rows with `topology`)."""
    rows = []
    for P in device_counts:
        mesh = build_mesh(("x",), (P,), devices=jax.devices()[:P])
        alpha, beta = fit_link(mesh, repeats)
        for n_bytes in sizes:
            x = _message(mesh, n_bytes)
            xla_s = median_time(_program(mesh, lambda v: jax.lax.psum(v, "x")), x, repeats)
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

                measured = median_time(_program(mesh, body), x, repeats)
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
    return rows + aot_estimates(sizes, aot_topologies)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f} ms"


def aot_table(rows: list[dict[str, Any]]) -> str:
    """TPU compiler estimates: one row per (topology, size), one column per algorithm."""
    algorithms = [XLA, *collectives.ALGORITHMS]
    lines = [
        "| topology (cores) | bytes/device | " + " | ".join(algorithms) + " |",
        "|---|---|" + "---|" * len(algorithms),
    ]
    keys = list(dict.fromkeys((r["topology"], r["P"], r["bytes"]) for r in rows))
    for topology, P, n_bytes in keys:
        cells = []
        for algorithm in algorithms:
            r = next(
                (
                    x
                    for x in rows
                    if (x["topology"], x["bytes"], x["algorithm"]) == (topology, n_bytes, algorithm)
                ),
                None,
            )
            if r is None:
                cells.append("n/a")
            elif "error" in r:
                cells.append("failed")
            else:
                cells.append(f"{_ms(r['tpu_estimate_s'])} (model {_ms(r['model_s'])})")
        lines.append(f"| {topology} ({P}) | {n_bytes:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    """Measured CPU rows as a markdown table, then the TPU compiler's estimates."""
    measured = [r for r in rows if "topology" not in r]
    aot = [r for r in rows if "topology" in r]
    lines = [
        "| P | bytes/device | algorithm | measured | model | time / psum |",
        "|---|---|---|---|---|---|",
    ]
    for r in measured:
        model = f"{r['model_s'] * 1e3:.2f} ms" if r["model_s"] is not None else "-"
        lines.append(
            f"| {r['P']} | {r['bytes']:,} | {r['algorithm']} | "
            f"{r['measured_s'] * 1e3:.2f} ms | {model} | {r['vs_xla']:.2f}x |"
        )
    if aot:
        lines += ["", "TPU compiler estimates (AOT, libtpu), model in brackets:", aot_table(aot)]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Bandwidth (bytes per device / measured s) against message size, one panel per P."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("measured_s") is not None]  # CPU measurements only
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


def main(argv: list[str]) -> None:
    try:
        sizes = [parse_size(s) for s in _SIZES.value]
    except ValueError as e:
        usage_error(f"--sizes: {e}")
    topologies = () if _NO_TPU_ESTIMATES.value else AOT_TOPOLOGIES
    counts = [int(p) for p in _DEVICE_COUNTS.value]
    rows = bench(sizes, counts, REPEATS.value, aot_topologies=topologies)
    print_rows(rows, table)
    if _PLOT.value:
        plot(rows, _PLOT.value)
        print(f"plot: {_PLOT.value}")


if __name__ == "__main__":
    run(main)
