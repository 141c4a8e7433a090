"""The planner's search: candidate parallelisations of a config on a TPU slice, each
compiled through libtpu (`inspect_config`) and modelled (`parallel.costmodel`), ranked by
time to train; plus the ranked table and plot. `launch.plan` is its command line.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import time
from typing import Any

from mlperf.planning import step_model


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One parallelisation choice on one slice."""

    topology: str
    model: int  # size of the first non-data mesh axis (tensor / spatial partitions)
    mode: str  # "wus" (weight-update sharding), "fsdp" or "replicated"
    microbatches: int
    remat: bool | None = None  # None: the config has no remat switch

    @property
    def label(self) -> str:
        remat = "" if self.remat is None else f" remat={int(self.remat)}"
        return f"{self.topology} model={self.model} {self.mode} micro={self.microbatches}{remat}"


# The what-if knobs' sensible ranges (inclusive bounds): a scale of 0 or below, or a
# thousandfold one, is a typo, not a what-if.
KNOB_RANGES: dict[str, tuple[float, float]] = {
    "hbm_scale": (0.01, 1000.0),
    "ici_scale": (0.01, 1000.0),
    "dcn_scale": (0.01, 1000.0),
    "slices": (1, 4096),
    "chips": (1, 1 << 20),
    "price": (1e-6, 1e6),
    "budget_s": (1e-3, 1e7),
    "batch_per_device": (1, 1 << 20),
    "microbatches": (1, 1 << 16),
}
# Model-parallel degrees tried (those dividing the slice's devices): COMET sweeps MP up
# to 256 for models that need it.
MODEL_DEGREES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def check_knob(name: str, value: float | None) -> str | None:
    """One line saying what is wrong with a planner knob's value, or None if it is in range
    (None means "not given")."""
    if value is None:
        return None
    low, high = KNOB_RANGES[name]
    if not low <= value <= high:
        return f"--{name}={value:g} is out of range; use a value in [{low:g}, {high:g}]."
    return None


def steps_to_target(config) -> int:
    """Steps to the quality target: config.plan.steps_to_target, else the step budget."""
    plan = config.get("plan")
    if plan is not None and plan.get("steps_to_target"):
        return int(plan.steps_to_target)
    steps = config.train.steps
    if config.get("phase2") and config.phase2.enabled:
        steps = math.ceil(config.phase2.start_samples / config.train.global_batch_size)
        steps += config.phase2.steps
    return int(steps)


def apply_candidate(config, cand: Candidate, devices: int, slices: int = 1):
    """A copy of `config` set up for one candidate on one slice of `devices` devices."""
    c = copy.deepcopy(config)
    axes = tuple(c.mesh.axes)
    other = next((a for a in axes if a != "data"), None)
    if other is None and cand.model > 1:
        raise ValueError(f"mesh.axes={axes} has no axis besides 'data' to split the model.")
    heads = c.model.get("num_heads")
    if other == "model" and heads and heads % cand.model:
        raise ValueError(
            f"model={cand.model} does not divide the {heads} attention heads; tensor "
            "parallelism needs a degree that divides them."
        )
    sizes = {a: 1 for a in axes}
    sizes["data"] = devices // cand.model
    if other is not None:
        sizes[other] = cand.model
    c.mesh.ici_shape = tuple(sizes[a] for a in axes)
    c.mesh.dcn_shape = (1,) * len(axes)
    c.parallel.weight_update_sharding = cand.mode in ("wus", "fsdp")
    c.parallel.fsdp = cand.mode == "fsdp"
    c.train.microbatches = cand.microbatches
    if slices > 1:  # one slice's share of the global batch; DCN is modelled
        c.train.global_batch_size //= slices
        c.train.eval_batch_size = max(c.train.eval_batch_size // slices, sizes["data"])
    if cand.remat is not None:
        c.model.remat = cand.remat
    return c


def candidates(config, topology: str, devices: int, full: bool, slices: int = 1) -> list:
    """The config's own setting first, then one knob at a time (or every combination)."""
    base_model = 1
    axes = tuple(config.mesh.axes)
    if len(axes) > 1:
        other = next(a for a in axes if a != "data")
        size = config.mesh.ici_shape[axes.index(other)]
        base_model = size if size > 0 else 1
    base_mode = "fsdp" if config.parallel.fsdp else "wus"
    if not config.parallel.weight_update_sharding:
        base_mode = "replicated"
    has_remat = "remat" in config.model
    base = Candidate(
        topology,
        base_model,
        base_mode,
        config.train.microbatches,
        bool(config.model.remat) if has_remat else None,
    )
    gbs = config.train.global_batch_size // slices
    models = [m for m in MODEL_DEGREES if devices % m == 0] if len(axes) > 1 else [1]
    modes = ["wus", "fsdp", "replicated"]
    micros = [1, 2, 4]
    remats = [False, True] if has_remat else [None]
    if full:
        grid = [
            Candidate(topology, m, mode, k, r)
            for m, mode, k, r in itertools.product(models, modes, micros, remats)
        ]
    else:
        grid = [base]
        grid += [dataclasses.replace(base, model=m) for m in models]
        grid += [dataclasses.replace(base, mode=mode) for mode in modes]
        grid += [dataclasses.replace(base, microbatches=k) for k in micros]
        grid += [dataclasses.replace(base, remat=r) for r in remats]
    seen, out = set(), []
    for cand in grid:
        data = devices // cand.model
        if cand in seen or gbs % (data * cand.microbatches):
            continue  # a batch that does not split over data x microbatches
        seen.add(cand)
        out.append(cand)
    return out


# What the planner reads of a compiled train step; a program too big for HBM gets these
# from 1- and 2-layer compiles, extrapolated linearly in depth (`depth_extrapolated`).
_STEP_FIELDS = ("flops_per_device", "bytes_accessed_per_device", "wire_bytes", "step_s", "memory")


def ici_wire_bytes(train: dict[str, Any]) -> float:
    """The compiled step's bytes for the ICI term: ring-equivalent (each collective's
    over the torus dimensions its group spans, `parallel.ici_links`) where the report
    has them, else every collective's ring bytes on one ring."""
    if "ici_ring_bytes_per_device" in train:
        return train["ici_ring_bytes_per_device"]
    return train.get("wire_bytes_per_device", sum(train["collective_wire_bytes"].values()))


def _step_fields(report: dict[str, Any]) -> dict[str, float] | None:
    """The planner's numbers of one compiled report (None if its step did not compile)."""
    train = report["train"]
    if "flops_per_device" not in train or report["bytes_per_device"]["total"] is None:
        return None
    fields = {
        "flops_per_device": train["flops_per_device"],
        "bytes_accessed_per_device": train["bytes_accessed_per_device"],
        "wire_bytes": ici_wire_bytes(train),
        "step_s": train.get("estimated_step_s"),
        "memory": report["bytes_per_device"]["total"],
    }
    # A scanned layer stack: XLA's cost analysis counts a loop body's HBM bytes once, so
    # they come from the unrolled 1- and 2-layer compiles extrapolated to the depth
    # (FLOPs and wire bytes are counted per trip in the scanned program itself).
    extrapolated = train.get("layer_extrapolated", {})
    if "bytes_accessed_per_device" in extrapolated:
        fields["bytes_accessed_per_device"] = extrapolated["bytes_accessed_per_device"]
    return fields


def depth_extrapolated(config, topology: str, slices: int) -> dict[str, Any]:
    """A train step's FLOPs, HBM bytes, wire bytes, compiler step estimate and memory per
    device for a config whose full program does not fit HBM: the same candidate compiled
    with 1 and 2 unrolled layers, each figure f extrapolated to the config's L layers as
    f(1) + (L - 1)(f(2) - f(1)) (what `mlperf.inspection` does for a scanned stack's step
    time). Raises ValueError when the config has no layer stack or a small compile fails."""
    from mlperf.inspection import inspect_config

    layers = int(config.model.get("num_layers", 0) or 0)
    if layers < 2:
        raise ValueError("no layer stack to extrapolate (model.num_layers < 2)")
    points = []
    for n in (1, 2):
        c = copy.deepcopy(config)
        c.model.update(num_layers=n, scan_layers=False)
        report = inspect_config(c, topology=topology, slices=slices, layer_estimate=False)
        fields = _step_fields(report)
        if fields is None or fields["step_s"] is None:
            why = report["train"].get("error", "no compiler estimate")
            raise ValueError(f"the {n}-layer compile gives no estimate: {why}")
        points.append({**fields, "compiler": "compiler_step_s" in report["train"]})
    out: dict[str, Any] = {
        k: points[0][k] + (layers - 1) * (points[1][k] - points[0][k]) for k in _STEP_FIELDS
    }
    # A step estimate from the compiler (v3, v5p), or the roofline that stands in for an
    # unusable one (v4, v5e, v6e), which has no collectives in it.
    out["compiler_estimate"] = all(p["compiler"] for p in points)
    out["memory_1_2_layers"] = [p["memory"] for p in points]
    out["estimate_method"] = (
        f"out of HBM as compiled: 1- and 2-layer compiles extrapolated to {layers} layers"
    )
    return out


def analytic_flops_per_step(config) -> float:
    """The task's analytic training FLOPs of one global batch of the first phase (what
    MFU counts)."""
    from mlperf.tasks import get_task

    task = get_task(config)
    phase = task.phases()[0]
    return task.flops_per_example(phase) * phase.global_batch_size


def evaluate(
    config, cand: Candidate, what_if: dict[str, float], collectives: bool = False
) -> dict[str, Any]:
    """Compiles one candidate and models its step; failures become a row with `error`.

    A candidate out of the chip's real HBM is compiled again with 1 and 2 layers and
    extrapolated (`depth_extrapolated`), so it still gets a step time and its memory need;
    it fits when that need is within `hbm_scale` x HBM, and the row says the scale it
    needs (`min_hbm_scale`)."""
    from mlperf.inspection import inspect_config
    from parallel import costmodel
    from parallel.topology import get_topology

    topo = get_topology(cand.topology)
    slices = int(what_if.get("slices", 1))
    row: dict[str, Any] = {"candidate": cand.label, **dataclasses.asdict(cand)}
    row.update(chips=topo.chips * slices, slices=slices)
    try:
        # Multi-slice: the real program over every slice, `data` spanning them over DCN.
        c = apply_candidate(config, cand, len(topo.devices))
        if slices > 1:
            data = len(topo.devices) // cand.model * slices
            c.train.eval_batch_size = -(-c.train.eval_batch_size // data) * data
        report = inspect_config(c, topology=cand.topology, slices=slices)
    except Exception as e:  # reported in the table; the plan goes on
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        return row
    train = report["train"]
    hbm = topo.hbm_per_device * what_if.get("hbm_scale", 1.0)
    row.update(
        mesh=report["mesh"],
        memory_per_device=report["bytes_per_device"]["total"],
        hbm_per_device=hbm,
        compile_time_s=train.get("compile_time_s"),
    )
    if "error" in train and not train.get("out_of_memory"):
        row["error"] = train["error"]
        return row
    step_fields = _step_fields(report)
    if train.get("out_of_memory"):
        try:
            step_fields = depth_extrapolated(c, cand.topology, slices)
        except Exception as e:  # e.g. one layer alone does not fit: no step estimate
            row.update(fits=False, note=f"compiler: out of HBM ({str(e).splitlines()[0][:200]})")
            return row
        row["estimate_method"] = step_fields["estimate_method"]
        compiler_s = step_fields["step_s"] if step_fields["compiler_estimate"] else None
        if train.get("oom_used_bytes") or train.get("oom_temp_bytes"):
            # What the compiler said the full program needs (state + temporaries) beats a
            # linear extrapolation of unrolled programs, whose buffers do not scale so.
            step_fields["memory"] = report["bytes_per_device"]["total"]
            row["estimate_method"] += "; memory: the compiler's out-of-HBM figure"
    elif step_fields is None:
        row["error"] = "the compiled step has no memory or cost analysis"
        return row
    else:  # without a usable compiler estimate: max(compute, HBM) + ICI, analytically
        compiler_s = step_fields["step_s"] if "compiler_step_s" in train else None
    need = step_fields["memory"]
    row.update(
        memory_per_device=need,
        fits=bool(need <= hbm),
        min_hbm_scale=need / topo.hbm_per_device,
    )
    gib = need / (1 << 30)
    if not row["fits"]:
        scale = math.ceil(row["min_hbm_scale"] * 100) / 100
        row["note"] = f"needs {gib:.2f} GiB, fits only at hbm_scale >= {scale:.2f}"
    elif need > topo.hbm_per_device:
        real = topo.hbm_per_device / (1 << 30)
        row["note"] = f"needs {gib:.2f} GiB, more than the real {real:.0f} GiB"
    per_chip = topo.devices_per_chip
    chip = topo.chip
    grad_shard = report["bytes_per_device"]["params"]
    if report["weight_update_sharding"]:
        grad_shard /= report["mesh"].get("data", 1)
    grad_dtype = c.parallel.get("grad_reduce_dtype", "float32")
    step = costmodel.tpu_step_time(
        flops=step_fields["flops_per_device"],
        bytes_accessed=step_fields["bytes_accessed_per_device"],
        wire_bytes=step_fields["wire_bytes"],
        compiler_s=compiler_s,
        peak_flops=chip.peak_flops / per_chip,
        hbm_bandwidth=chip.hbm_bandwidth / per_chip,
        ici_bandwidth=2 * chip.link_bandwidth / per_chip,
        slices=slices,
        # The DCN all-reduce of f32 gradients, in the reduction's precision.
        dcn_bytes=grad_shard * costmodel.grad_bytes_ratio(grad_dtype),
        dcn_bandwidth=chip.dcn_bandwidth / per_chip * what_if.get("dcn_scale", 1.0),
        ici_scale=what_if.get("ici_scale", 1.0),
        dcn_wire_bytes=train.get("dcn_wire_bytes"),
    )
    # The generation's validated step model (libtpu's estimate, or roofline-eta).
    generation = step_model.generation_of(cand.topology)
    step = step_model.planned_step(step, generation)
    row.update(step_model=step_model.validation_label(generation))
    row.update(validated=generation in step_model.VALIDATED)
    steps = steps_to_target(config)
    price = what_if.get("price") or chip.price_per_hour
    ttt = steps * step.total_s
    # MFU counts the model's FLOPs, not what remat or padding adds.
    analytic = analytic_flops_per_step(config)
    row["mfu"] = analytic / (row["chips"] * chip.peak_flops * step.total_s)
    compiled = step_fields["flops_per_device"] * len(topo.devices) * slices
    row["flops_vs_analytic"] = compiled / analytic
    row.update(
        grad_reduce_dtype=grad_dtype,
        step_s=step.total_s,
        # Without a compiler estimate the step is the serial figure (ICI after compute);
        # the figure with ICI hidden behind compute goes beside it.
        step_overlapped_s=step.overlapped_s if step.compiler_s is None else None,
        compute_s=step.compute_s,
        memory_s=step.memory_s,
        comm_s=step.comm_s,
        dcn_s=step.dcn_s,
        dcn_collectives=train.get("dcn_collectives"),
        dcn_wire_bytes=train.get("dcn_wire_bytes"),
        compiler_s=step.compiler_s,
        steps=steps,
        time_to_train_s=ttt,
        chip_hours=row["chips"] * ttt / 3600,
        cost_usd=row["chips"] * ttt / 3600 * price,
        samples_per_s_per_chip=config.train.global_batch_size / step.total_s / row["chips"],
    )
    if collectives:
        # The gradient one data replica holds (its model shard), summed over `data`: an
        # all-reduce, or under weight-update sharding / FSDP a reduce-scatter of the same
        # bytes. libtpu's estimate of each algorithm at this slice and size picks one.
        from parallel.allreduce_choice import compiler_estimates, pick

        grad = report["bytes_total"]["params"] / cand.model
        n_bytes = int(grad * costmodel.grad_bytes_ratio(grad_dtype))
        if slices > 1:
            row["allreduce"] = {"algorithm": None, "why": "one slice only (DCN is modelled)"}
        else:
            try:
                estimates = compiler_estimates(cand.topology, report["mesh"], "data", n_bytes)
                row["allreduce"] = {
                    **pick(estimates),
                    "bytes": n_bytes,
                    "estimates": {e["algorithm"]: e.get("tpu_estimate_s") for e in estimates},
                }
            except Exception as e:  # the plan goes on; the row says why
                why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                row["allreduce"] = {"algorithm": None, "why": why}
    return row


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fitting candidates by time to train, then those that do not fit, then failures;
    scaling efficiency = throughput per chip against the smallest slice's best."""
    ok = [r for r in rows if "time_to_train_s" in r]
    if ok:
        smallest = min(r["chips"] for r in ok)
        ref = max(r["samples_per_s_per_chip"] for r in ok if r["chips"] == smallest)
        for r in ok:
            r["scaling_efficiency"] = r["samples_per_s_per_chip"] / ref

    def key(r):
        if "time_to_train_s" not in r:
            return (2, 0.0)
        return (0 if r["fits"] else 1, r["time_to_train_s"])

    return sorted(rows, key=key)


def plan(
    config,
    topologies: list[str],
    what_if: dict[str, float],
    full: bool,
    budget_s: float,
    collectives: bool = False,
):
    """Compiles candidates on each slice until the budget is spent; returns ranked rows.
    With `collectives`, each compiled candidate also gets libtpu's pick of gradient
    all-reduce algorithm (`parallel.allreduce_choice`)."""
    from parallel.topology import get_topology

    start, rows = time.perf_counter(), []
    for name in topologies:
        devices = len(get_topology(name).devices)
        for cand in candidates(config, name, devices, full, int(what_if.get("slices", 1))):
            if time.perf_counter() - start > budget_s:
                rows.append({"candidate": cand.label, "skipped": "compile budget spent"})
                continue
            rows.append(evaluate(config, cand, what_if, collectives))
    return rank(rows)


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("h", 3600), ("min", 60), ("s", 1), ("ms", 1e-3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x * 1e6:.3g} us"


def fmt_pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal, "-" for none (MFU columns)."""
    return "-" if x is None else f"{100 * x:.1f}%"


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of the ranked candidates."""
    head = (
        "| # | candidate | mem/device | fits | step | compute | HBM | comm | DCN | compiler "
        "| MFU | time to train | chip-h | $ | scaling eff. |"
    )
    with_allreduce = any("allreduce" in r for r in rows)
    if with_allreduce:
        head += " all-reduce pick (libtpu) |"
    lines = [head, "|" + "---|" * (15 + with_allreduce)]
    for i, r in enumerate(rows, 1):
        if "error" in r or "skipped" in r:
            why = f"failed: {r['error']}" if "error" in r else f"skipped: {r['skipped']}"
            lines.append(f"| {i} | {r['candidate']} | {why} |" + " |" * (12 + with_allreduce))
            continue
        mem = r.get("memory_per_device")
        mem_txt = "-" if mem is None else f"{mem / (1 << 30):.2f} GiB"
        fits = {True: "yes", False: "NO", None: "?"}[r.get("fits")]
        if r.get("note") and "step_s" in r:  # e.g. "needs 19 GiB, fits only at hbm_scale >= 1.2"
            fits += f" ({r['note']})"
        if "step_s" not in r:
            lines.append(f"| {i} | {r['candidate']} | {mem_txt} | {fits} | {r.get('note')} |")
            continue
        step = _fmt_s(r["step_s"])
        if r.get("step_overlapped_s") is not None:  # roofline + ICI: both bounds
            step += f" ({_fmt_s(r['step_overlapped_s'])} with ICI overlapped)"
        if r.get("validated") is False:  # no measured run to hold an estimate to
            lines.append(
                f"| {i} | {r['candidate']} | {mem_txt} | {fits} | not validated | "
                f"{_fmt_s(r['compute_s'])} | {_fmt_s(r['memory_s'])} | {_fmt_s(r['comm_s'])} | "
                f"{_fmt_s(r['dcn_s'] or None)} | - | - | not validated | - | - | - |"
                + (" - |" if with_allreduce else "")
            )
            continue
        lines.append(
            f"| {i} | {r['candidate']} | {mem_txt} | {fits} | {step} | "
            f"{_fmt_s(r['compute_s'])} | {_fmt_s(r['memory_s'])} | {_fmt_s(r['comm_s'])} | "
            f"{_fmt_s(r['dcn_s'] or None)} | {_fmt_s(r['compiler_s'])} | "
            f"{fmt_pct(r.get('mfu'))} | {_fmt_s(r['time_to_train_s'])} | "
            f"{r['chip_hours']:.3g} | {r['cost_usd']:.3g} | {r['scaling_efficiency']:.2f} |"
            + (f" {_allreduce_text(r.get('allreduce'))} |" if with_allreduce else "")
        )
    models = {}
    for r in rows:
        if "step_model" in r:
            models.setdefault(step_model.generation_of(r["topology"]), r["step_model"])
    notes = [f"step model ({g}): {label}" for g, label in sorted(models.items())]
    return "\n".join(notes + lines)


def _allreduce_text(choice: dict[str, Any] | None) -> str:
    """`ring 1.25 ms (xla_psum 0.63 ms)`: libtpu's pick for the gradient reduction."""
    if not choice:
        return "-"
    if choice["algorithm"] is None:
        return choice["why"]
    xla = choice.get("xla_psum_s")
    versus = "" if xla is None else f" (xla_psum {_fmt_s(xla)})"
    return f"{choice['algorithm']} {_fmt_s(choice['seconds'])}{versus}"


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Step time and memory per device for each compiled candidate (bar charts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "step_s" in r]
    labels = [r["candidate"] for r in ok]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(6, len(ok) * 0.9), 7), sharex=True)
    x = range(len(ok))
    bottom = [0.0] * len(ok)
    for name in ("compute_s", "memory_s", "comm_s"):
        vals = [r[name] * 1e3 for r in ok]
        ax1.bar(x, vals, bottom=bottom, label=name.removesuffix("_s") + " (analytic)")
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax1.plot(x, [r["step_s"] * 1e3 for r in ok], "k*", label="predicted step")
    ax1.set_ylabel("ms per step")
    ax1.legend(fontsize=8)
    ax2.bar(x, [r["memory_per_device"] / (1 << 30) for r in ok], color="tab:gray")
    for hbm in {r["hbm_per_device"] for r in ok}:
        ax2.axhline(hbm / (1 << 30), color="red", linestyle="--", linewidth=1)
    ax2.set_ylabel("GiB per device (red: HBM)")
    ax2.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
