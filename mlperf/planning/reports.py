"""The planner's analytic reports: GPU clusters, and predictions beside published times.

Clusters without a compiler here are planned from one reference TPU compile (FLOPs and
bytes per example, gradient bytes) with `parallel.costmodel.cluster_step_time`. The
honesty table predicts Google's MLPerf v0.7 times to train from the model alone and
prints them beside the published figures; the ratios are reported as they come out
(nothing is calibrated to make one match).
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

# Google's published MLPerf Training v0.7 results on TPU v3 (closed division): chips,
# minutes converted to seconds, and where known the steps to target and the measured
# time per step from the result logs: BERT 48.1 ms, the device's pace from
# the spacing of its eval_accuracy lines (median over the 10 runs; its block_start/stop
# give 17.0 ms, the host's asynchronous dispatch pace: mlperf/mllog_pace.py), Transformer
# 3.35 s per epoch of 566,340 samples at global batch 2048 (12.1 ms; both clocks agree),
# SSD 10.6 ms, its device pace read the same way as BERT's (eval results 5 epochs of
# 118,287 / 4096 = 28.9 steps apart, median over the 5 runs of tpu-v3-4096-JAX/ssd; its
# block markers give 6.1 ms). Like is compared with like: the ratio needs no steps.
PUBLISHED_V07: dict[str, dict[str, Any]] = {
    "bert": {"chips": 4096, "seconds": 24.0, "steps": 560, "step_s": 0.0481},
    "transformer": {"chips": 4096, "seconds": 15.5, "step_s": 3.35 / (566340 / 2048)},
    "ssd": {"chips": 2048, "seconds": 32.8, "step_s": 0.0106},
}
# Lin et al., "Multi-node BERT pretraining: cost-efficient approach" (published figures:
# about 70% weak-scaling efficiency for BERT-large with gradient accumulation on 32 nodes
# x 8 T4s). The full study (time and cost to pretrain) is `mlperf.planning.lin_cluster_study`.
LIN_BERT_CLUSTER = {"cluster": "t4x8x32-10gbe", "weak_scaling_efficiency": 0.70}
# What the Lin et al. row assumes about the run (phase-1 BERT-large, sequence 128): their 4
# accumulation steps and fp16 gradients; 32 examples per T4 per microbatch is this
# planner's assumption (the paper's value is not recorded here).
LIN_ROW_ASSUMPTIONS = {
    "seq_length": 128,
    "max_predictions": 20,
    "batch_per_device": 32,
    "micro": 4,
    "grad_reduce_dtype": "float16",
}
REFERENCE_TOPOLOGY = "v3:2x2"  # 8 TPU v3 cores: a quick compile for FLOPs per example


def reference_costs(config, topology: str = REFERENCE_TOPOLOGY) -> dict[str, float]:
    """FLOPs and HBM bytes per training example and per step, and gradient bytes, from
    compiling the config data-parallel on a small TPU slice at 1 and at 2 examples per
    device: the difference is what one example costs, the rest (the optimizer's FLOPs;
    weights and optimizer state read and written) is paid per step whatever the batch."""
    from mlperf.inspection import inspect_config
    from parallel.topology import get_topology

    devices = len(get_topology(topology).devices)
    points = []
    for per_device in (1, 2):
        c = copy.deepcopy(config)
        c.mesh.ici_shape = tuple(devices if a == "data" else 1 for a in c.mesh.axes)
        c.mesh.dcn_shape = (1,) * len(c.mesh.axes)
        batch = devices * per_device
        c.train.update(global_batch_size=batch, eval_batch_size=batch, microbatches=1)
        report = inspect_config(c, topology=topology, layer_estimate=False)
        train = report["train"]
        if "flops_per_device" not in train:
            raise RuntimeError(f"reference compile on {topology} failed: {train.get('error')}")
        points.append((train["flops_per_device"], train["bytes_accessed_per_device"]))
    (f1, b1), (f2, b2) = points
    flops_per_example, bytes_per_example = max(f2 - f1, 0.0), max(b2 - b1, 0.0)
    return {
        "flops_per_example": flops_per_example,
        "bytes_per_example": bytes_per_example,
        "flops_per_step": max(f1 - flops_per_example, 0.0),
        "bytes_per_step": max(b1 - bytes_per_example, 0.0),
        "grad_bytes": float(report["bytes_total"]["params"]),
        "params": report["params"],
    }


def cluster_scaling(
    config,
    cluster: str,
    batch_per_device: int,
    micro: int,
    costs: dict | None = None,
    grad_reduce_dtype: str | None = None,
    nodes: tuple[int, ...] | None = None,
) -> list[dict[str, Any]]:
    """Weak scaling on a GPU cluster: 1 device, then `nodes` full nodes (default 1, 2, 4,
    ... up to the cluster's), at a fixed per-device batch (`micro` accumulated microbatches
    of `batch_per_device`). Gradients are all-reduced in `grad_reduce_dtype` (default: the
    config's `parallel.grad_reduce_dtype`)."""
    from parallel import costmodel
    from parallel.hardware import CHIPS, CLUSTERS

    if cluster not in CLUSTERS:
        raise ValueError(f"unknown cluster {cluster!r}; known: {', '.join(CLUSTERS)}.")
    cl = CLUSTERS[cluster]
    chip = CHIPS[cl.chip]
    costs = costs or reference_costs(config)
    if grad_reduce_dtype is None:
        parallel = config.get("parallel") if config is not None else None
        grad_reduce_dtype = (parallel or {}).get("grad_reduce_dtype", "float32")
    grad_bytes = costs["grad_bytes"] * costmodel.grad_bytes_ratio(grad_reduce_dtype)
    if nodes is None:
        nodes = tuple(2**i for i in range(cl.nodes.bit_length()) if 2**i <= cl.nodes)
    shapes = [(1, 1)] + [(cl.devices_per_node, n) for n in nodes if n <= cl.nodes]
    rows = []
    for per_node, n in shapes:
        step = costmodel.cluster_step_time(
            costs["flops_per_example"],
            costs["bytes_per_example"],
            grad_bytes,
            batch_per_device,
            per_node,
            n,
            chip.peak_flops,
            chip.hbm_bandwidth,
            cl.intra_node_bandwidth,
            cl.inter_node_bandwidth,
            flops_per_step=costs.get("flops_per_step", 0.0),
            bytes_per_step=costs.get("bytes_per_step", 0.0),
            microbatches=micro,
        )
        devices = per_node * n
        rows.append(
            {
                "cluster": cl.name,
                "devices": devices,
                "nodes": n,
                "grad_reduce_dtype": grad_reduce_dtype,
                "step_s": step.total_s,
                "compute_s": step.compute_s,
                "memory_s": step.memory_s,
                "intra_node_s": step.ici_s,
                "inter_node_s": step.dcn_s,
                "samples_per_s": devices * batch_per_device * micro / step.total_s,
            }
        )
    single = rows[0]["samples_per_s"]
    for r in rows:
        r["weak_scaling_efficiency"] = r["samples_per_s"] / (r["devices"] * single)
    return rows


def cluster_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"cluster: {rows[0]['cluster']}",
        "| devices | nodes | step | compute | HBM | intra-node | inter-node | samples/s "
        "| weak-scaling eff. |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        lines.append(
            f"| {r['devices']} | {r['nodes']} | {r['step_s']:.3f} s | {r['compute_s']:.3f} s | "
            f"{r['memory_s']:.3f} s | {r['intra_node_s']:.3f} s | {r['inter_node_s']:.3f} s | "
            f"{r['samples_per_s']:.0f} | {r['weak_scaling_efficiency']:.0%} |"
        )
    return "\n".join(lines)


def load_v07_config(benchmark: str):
    """configs/<benchmark>.py's mlperf_v07 config and its task, or None if not built."""
    try:
        module = importlib.import_module(f"configs.{benchmark}")
        config = module.get_config("mlperf_v07")
        from mlperf.tasks import get_task

        get_task(config)
    except (ImportError, ValueError, AttributeError, KeyError):
        return None
    return config


def honesty_rows(
    proxy: str = "", lin_cluster: bool = True, benchmarks: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    """Predicted v0.7 times to train (config's own mesh, compiled for the published chip
    count) beside the published ones, and the weak-scaling efficiency of Lin et al.'s T4 cluster.

    `proxy` (e.g. "v3:4x4") compiles the same per-core program on a small slice instead:
    the global batch scaled so each core keeps its published share. It is for machines
    where the multipod compile does not finish (see docs/aot-and-planning.md); collectives then run
    over smaller groups, so only their latency terms differ (a ring's bandwidth term
    2(g-1)/g n barely changes between g = 8 and g = 2048).
    """
    from mlperf.planning.search import candidates, evaluate
    from parallel.topology import get_topology, topology_for_chips

    rows = []
    for benchmark, pub in PUBLISHED_V07.items():
        if benchmarks is not None and benchmark not in benchmarks:
            continue
        row: dict[str, Any] = {"benchmark": benchmark, "chips": pub["chips"]}
        row["published_s"] = pub["seconds"]
        config = load_v07_config(benchmark)
        if config is None:
            rows.append({**row, "status": "not built"})
            continue
        full = topology_for_chips("v3", pub["chips"])
        topology = proxy or full
        devices = len(get_topology(topology).devices)
        if proxy:
            scale = len(get_topology(full).devices) // devices
            config.train.global_batch_size //= scale
            config.train.eval_batch_size = max(config.train.eval_batch_size // scale, devices)
        cand = candidates(config, topology, devices, full=False)[0]
        result = evaluate(config, cand, {})
        row.update(topology=topology, candidate=cand.label, proxy_for=full if proxy else None)
        if "time_to_train_s" not in result:
            rows.append({**row, "status": result.get("error") or result.get("note")})
            continue
        row.update(
            status="predicted",
            steps=result["steps"],
            published_steps=pub.get("steps"),
            step_s=result["step_s"],
            compiler_s=result["compiler_s"],
            compute_s=result["compute_s"],
            memory_per_device=result["memory_per_device"],
            predicted_s=result["time_to_train_s"],
            ratio=result["time_to_train_s"] / pub["seconds"],
            published_step_s=pub.get("step_s"),
            step_ratio=result["step_s"] / pub["step_s"] if pub.get("step_s") else None,
            compile_time_s=result["compile_time_s"],
            fits=result["fits"],
        )
        rows.append(row)
    if lin_cluster:
        rows.append(lin_cluster_row())
    return rows


def lin_cluster_row(config=None, costs: dict | None = None) -> dict[str, Any]:
    """The planner's weak-scaling efficiency for Lin et al.'s T4 cluster (BERT-large
    unless `config` is given; `costs` skips the reference compile)."""
    from configs.bert import get_config

    a = LIN_ROW_ASSUMPTIONS
    config = copy.deepcopy(config) if config is not None else get_config("large")
    config.data.update(seq_length=a["seq_length"], max_predictions=a["max_predictions"])
    config.model.max_position = max(int(config.model.max_position), a["seq_length"])
    rows = cluster_scaling(
        config,
        LIN_BERT_CLUSTER["cluster"],
        a["batch_per_device"],
        a["micro"],
        costs=costs,
        grad_reduce_dtype=a["grad_reduce_dtype"],
    )
    full = rows[-1]
    return {
        "benchmark": "bert (Lin et al.)",
        "chips": full["devices"],
        "status": "predicted",
        "published_efficiency": LIN_BERT_CLUSTER["weak_scaling_efficiency"],
        "predicted_efficiency": full["weak_scaling_efficiency"],
        "assumptions": a,
        "scaling": rows,
    }


def _step_ratio_text(r: dict[str, Any]) -> str:
    if not r.get("published_step_s"):
        return "no published step time"
    pub_ms = r["published_step_s"] * 1e3
    return f"{r['step_s'] * 1e3:.1f} / {pub_ms:.1f} ms = {r['step_s'] / r['published_step_s']:.2f}"


def honesty_table(rows: list[dict[str, Any]]) -> str:
    """Predicted beside published, ratios as measured."""
    lines = [
        "| benchmark | chips | published | predicted | predicted / published "
        "| step: predicted / published | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "published_efficiency" in r:
            lines.append(
                f"| {r['benchmark']} | {r['chips']} T4 | {r['published_efficiency']:.0%} "
                f"weak-scaling eff. | {r['predicted_efficiency']:.0%} | "
                f"{r['predicted_efficiency'] / r['published_efficiency']:.2f} | - | "
                f"assumes {r['assumptions']} |"
            )
        elif r["status"] != "predicted":
            lines.append(
                f"| {r['benchmark']} | {r['chips']} | {r['published_s']} s | {r['status']} "
                "| - | - | |"
            )
        else:
            lines.append(
                f"| {r['benchmark']} | {r['chips']} | {r['published_s']} s | "
                f"{r['predicted_s']:.1f} s ({r['steps']} steps x {r['step_s'] * 1e3:.1f} ms) | "
                f"{r['ratio']:.2f} | {_step_ratio_text(r)} | {r['candidate']}"
                + (f" (per-core proxy for {r['proxy_for']})" if r.get("proxy_for") else "")
                + f", compile {r['compile_time_s']:.0f} s |"
            )
    return "\n".join(lines)
