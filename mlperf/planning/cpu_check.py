"""The planner on this machine's fake CPU devices, checked against measured steps.

`launch.plan --cpu` splits the process's CPU devices (8 under the tests' XLA_FLAGS) into
data x model meshes, compiles each candidate's train step with the real XLA:CPU backend,
and predicts its step time from the compiled program with the host's measured rates
(`parallel.host_rates`). With `--measure` the same compiled step runs on a synthetic
batch (its cost is fixed by the shapes) and the table sets predicted beside measured,
with the ranking agreement (Spearman's rho and the share of candidate pairs in the same
order).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from mlperf.planning.search import Candidate, apply_candidate

TOPOLOGY = "cpu"


def check_meshes(text: str, devices: int, axes: tuple[str, ...]) -> list[int]:
    """Model degrees from `--meshes` ("8x1,4x2": data x model), or every degree dividing
    `devices` when empty. Raises ValueError with one line saying what is wrong."""
    if not text.strip():
        return [m for m in range(1, devices + 1) if devices % m == 0] if len(axes) > 1 else [1]
    out = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(
                f"mesh candidate {item.strip()!r} is not DATAxMODEL; "
                "give e.g. --meshes 8x1,4x2,2x4."
            )
        data, model = int(parts[0]), int(parts[1])
        if data * model != devices:
            raise ValueError(
                f"mesh candidate {item.strip()!r} uses {data * model} devices; this process has "
                f"{devices} CPU devices: give DATAxMODEL with DATA*MODEL = {devices}."
            )
        if model > 1 and len(axes) < 2:
            raise ValueError(
                f"mesh candidate {item.strip()!r} splits the model, but mesh.axes={axes} has "
                "no axis besides 'data'; use MODEL = 1."
            )
        out.append(model)
    return list(dict.fromkeys(out))


def host_rates(devices: list):
    """The host's measured peak, memory bandwidth and collective rate (`HostRates`)."""
    from mlperf.peak_flops import measure_matmul_peak
    from parallel.host_rates import HostRates, measure_collective_rate, measure_memory_bandwidth

    peak = measure_matmul_peak()
    bandwidth, mem_how = measure_memory_bandwidth()
    alpha, rate, coll_how = measure_collective_rate(devices)
    return HostRates(
        devices=len(devices),
        peak_flops=peak,
        peak_how="jit(x @ x) 1024x1024 fp32 on one device, 2n^3 FLOPs / median of 5",
        memory_bandwidth=bandwidth,
        memory_how=mem_how,
        collective_alpha=alpha,
        collective_rate=rate,
        collective_how=coll_how,
    )


def synthetic_batch(example_spec: dict, batch_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A host batch of the step's shapes: integers 1 (a valid token, label, mask),
    floats uniform in [0.25, 0.75). The step's work is fixed by the shapes."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in example_spec.items():
        shape = (batch_size, *shape)
        dtype = np.dtype(dtype)
        if np.issubdtype(dtype, np.floating):
            out[name] = rng.uniform(0.25, 0.75, shape).astype(dtype)
        else:
            out[name] = np.ones(shape, dtype)
    return out


def _time_steps(trainer, compiled, phase, steps: int, warmup: int) -> list[float]:
    """Seconds of each of `steps` train steps after `warmup` ones, each waited for."""
    import jax

    partitioner = trainer.partitioner
    layout = partitioner.data_layout(phase.global_batch_size)
    host = synthetic_batch(trainer.task.example_spec(phase), layout.host_batch_size)
    batch = partitioner.host_to_global(host, layout)
    key = partitioner.replicate(lambda: jax.random.key(0))
    state = trainer.init_state()
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch, key)
        jax.block_until_ready((state, metrics))
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def evaluate_cpu(
    config, model: int, devices: list, rates, measure: bool, steps: int = 10, warmup: int = 2
) -> dict[str, Any]:
    """Compiles one data x model candidate for `devices`, predicts its step, and with
    `measure` times `steps` real steps (median); a failure becomes a row with `error`."""
    from mlperf.trainer import build_trainer
    from parallel.aot import compiled_stats
    from parallel.host_rates import cpu_step_time

    cand = _candidate(config, model)
    n = len(devices)
    row: dict[str, Any] = {"candidate": f"data={n // model} model={model}", "model": model}
    try:
        c = apply_candidate(config, cand, n)
        trainer = build_trainer(c, devices=devices, prepare_data=False)
        phase = trainer.phases[0]
        lowered = trainer.lower_train_step(phase)
        start = time.perf_counter()
        compiled = lowered.compile()
        row["compile_s"] = time.perf_counter() - start
    except Exception as e:  # reported in the table; the check goes on
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        return row
    stats = compiled_stats(compiled)
    ops = sum(stats["collectives"].values())
    wire = sum(stats["collective_wire_bytes"].values())
    group = stats["collective_group_devices"]
    step = cpu_step_time(stats["flops"], stats["bytes_accessed"], group, wire, rates)
    row.update(
        flops_per_device=stats["flops"],
        bytes_per_device=stats["bytes_accessed"],
        collectives=ops,
        collective_group_devices=group,
        wire_bytes=wire,
        compute_s=step.compute_s,
        memory_s=step.memory_s,
        comm_s=step.comm_s,
        predicted_s=step.total_s,
    )
    if measure:
        times = _time_steps(trainer, compiled, phase, steps, warmup)
        row.update(measured_s=statistics.median(times), steps_timed=len(times))
        row["ratio"] = row["predicted_s"] / row["measured_s"]
    return row


def _candidate(config, model: int) -> Candidate:
    mode = "fsdp" if config.parallel.fsdp else "wus"
    if not config.parallel.weight_update_sharding:
        mode = "replicated"
    remat = bool(config.model.remat) if "remat" in config.model else None
    return Candidate(TOPOLOGY, model, mode, config.train.microbatches, remat)


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None under 2 points."""
    if len(a) < 2:
        return None

    def ranks(xs):
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        r = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = np.array(ranks(a)), np.array(ranks(b))
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def pairwise_agreement(a: list[float], b: list[float]) -> tuple[int, int]:
    """(pairs ordered the same way by `a` and `b`, all pairs)."""
    same = total = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            total += 1
            same += (a[i] - a[j]) * (b[i] - b[j]) > 0
    return same, total


def plan_cpu(
    config,
    meshes: str = "",
    measure: bool = False,
    steps: int = 10,
    warmup: int = 2,
    devices: list | None = None,
    rates=None,
) -> dict[str, Any]:
    """Every mesh candidate of `config` on the CPU devices, predicted (and measured):
    {"rates", "rows" (ranked by predicted step), "spearman", "pairs_same", "pairs"}."""
    import jax

    devices = list(jax.devices() if devices is None else devices)
    models = check_meshes(meshes, len(devices), tuple(config.mesh.axes))
    rates = host_rates(devices) if rates is None else rates
    rows = [evaluate_cpu(config, m, devices, rates, measure, steps, warmup) for m in models]
    rows.sort(key=lambda r: (r.get("predicted_s") is None, r.get("predicted_s", 0.0)))
    out: dict[str, Any] = {"rates": dataclasses.asdict(rates), "rows": rows}
    timed = [r for r in rows if "measured_s" in r]
    if measure:
        pred = [r["predicted_s"] for r in timed]
        meas = [r["measured_s"] for r in timed]
        out["spearman"] = spearman(pred, meas)
        out["pairs_same"], out["pairs"] = pairwise_agreement(pred, meas)
    return out


def report_header(config, devices: int, args: str) -> str:
    """Date, commit, machine and the command that reproduces the report."""
    import jax

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        commit = ""
    cores = len(os.sched_getaffinity(0))
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{config.benchmark}:{config.variant} on {devices} fake CPU devices; {date}; "
        f"commit {commit or 'unknown'}; machine: {cores}-core CPU container, jax "
        f"{jax.__version__}\ncommand: python -m launch.plan {args}\n"
    )


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3g}"


def cpu_table(result: dict[str, Any]) -> str:
    """The constants with their measurements, then a markdown table of the candidates."""
    from parallel.host_rates import HostRates

    lines = [f"- {line}" for line in HostRates(**result["rates"]).lines()]
    measured = "spearman" in result
    head = (
        "| # | mesh | GFLOP/dev | MiB/dev | coll. | compute ms | memory ms | comm ms "
        "| predicted ms |"
    )
    if measured:
        head += " measured ms | predicted/measured |"
    lines += ["", head, "|" + "---|" * (head.count("|") - 1)]
    for i, r in enumerate(result["rows"], 1):
        if "error" in r:
            lines.append(f"| {i} | {r['candidate']} | failed: {r['error']} |")
            continue
        line = (
            f"| {i} | {r['candidate']} | {r['flops_per_device'] / 1e9:.3g} | "
            f"{r['bytes_per_device'] / (1 << 20):.3g} | {r['collectives']} | "
            f"{_ms(r['compute_s'])} | {_ms(r['memory_s'])} | {_ms(r['comm_s'])} | "
            f"{_ms(r['predicted_s'])} |"
        )
        if measured:
            line += f" {_ms(r.get('measured_s'))} | {r.get('ratio', 0):.2f} |"
        lines.append(line)
    if measured:
        rho = result["spearman"]
        rho_txt = "-" if rho is None else f"{rho:.2f}"
        lines.append(
            f"\nranking: Spearman rho {rho_txt}; {result['pairs_same']} of {result['pairs']} "
            "candidate pairs in the same order predicted and measured"
        )
    return "\n".join(lines)
