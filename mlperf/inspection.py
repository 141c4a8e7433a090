"""Compile a config's train and eval steps for a mesh and report memory, FLOPs, collectives.

The library behind `python -m launch.inspect` and the planner: without a topology the
steps are compiled for the given (or this machine's) devices; with one, for a TPU slice
(or several joined over DCN) through libtpu's compiler, no TPU needed. Nothing is
trained, no data is read and nothing is allocated: the steps are lowered from abstract
shapes.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from absl import logging

from mlperf.batch_fit import use_slices

# The TPU compiler's out-of-memory messages, in the two forms libtpu prints:
# "Used 20.53G of 15.48G hbm. Exceeded hbm capacity by 5.05G." and "the total memory
# required for HLO temporaries (32.71G) exceeds available HBM (15.48G)."
_OOM_USED = re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm")
_OOM_TEMP = re.compile(r"temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM")
_TOP_LEVEL = ("collectives", "collective_bytes", "gather_scatter")
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _oom(message: str) -> dict[str, int] | None:
    """What an XLA:TPU out-of-memory error says: total used bytes or temporaries."""
    if "RESOURCE_EXHAUSTED" not in message and "Ran out of memory" not in message:
        return None
    m = _OOM_USED.search(message)
    if m:
        return {"oom_used_bytes": int(float(m.group(1)) * _UNIT[m.group(2)])}
    m = _OOM_TEMP.search(message)
    if m:
        return {"oom_temp_bytes": int(float(m.group(1)) * _UNIT[m.group(2)])}
    return {}


def _compile(lowered_fn) -> tuple[Any, Any, float, float, str | None]:
    """(lowered or None, compiled or None, lowering seconds, compile seconds, error or None).

    Lowering (tracing to StableHLO) and the backend compile are timed apart: for a big
    Python-unrolled model the first can dominate, for a big mesh the second. Both are
    logged as they finish, so a compile that never ends still says where it got to.
    """
    start = time.perf_counter()
    lowered, lower_s = None, 0.0
    try:
        lowered = lowered_fn()
        lower_s = time.perf_counter() - start
        if logging.level_info():  # the op count costs a print of the module (--v=0)
            ops = lowered.as_text().count(" = ")
            logging.info("lowered in %.1f s (%d StableHLO ops); compiling", lower_s, ops)
        compiled = lowered.compile()
    except Exception as e:  # a candidate that does not compile is reported, not fatal
        if lowered is None:
            lower_s = time.perf_counter() - start
        compile_s = time.perf_counter() - start - lower_s
        return lowered, None, lower_s, compile_s, f"{type(e).__name__}: {e}"
    compile_s = time.perf_counter() - start - lower_s
    logging.info("compiled in %.1f s", compile_s)
    return lowered, compiled, lower_s, compile_s, None


def _step_report(
    lowered,
    compiled,
    lower_s: float,
    compile_s: float,
    error: str | None,
    peak_flops: float | None = None,
    slice_of: list[int] | None = None,
    hbm_bandwidth: float | None = None,
    coords: list[tuple[int, ...]] | None = None,
    max_dims: int = 1,
) -> dict[str, Any]:
    """The report of one compiled step; `slice_of` (the slice of each mesh position)
    adds the collectives that cross slices over DCN (`parallel.dcn`), `coords` (each
    mesh position's torus coordinates) the ring-equivalent ICI bytes, each collective's
    bytes over the torus dimensions it spans, at most `max_dims` (`parallel.ici_links`)."""
    from parallel.aot import compiled_stats

    if compiled is None:
        report: dict[str, Any] = {
            "error": error.splitlines()[0][:500],
            "lower_time_s": lower_s,
            "compile_time_s": compile_s,
        }
        oom = _oom(error)
        if oom is not None:
            report.update(oom, out_of_memory=True)
        return report
    stats = compiled_stats(compiled, lowered)
    report = {
        "flops_per_device": stats["flops"],
        "matmul_flops_per_device": stats["matmul_flops"],
        "flops_cost_analysis": stats["flops_cost_analysis"],
        "bytes_accessed_per_device": stats["bytes_accessed"],
        "collectives": stats["collectives"],
        "collective_bytes": stats["collective_bytes"],
        "collective_wire_bytes": stats["collective_wire_bytes"],
        # Every collective the step runs (loop bodies times their trip counts).
        "wire_bytes_per_device": stats["wire_bytes"],
        # The program as written (what einsum_gather controls) and after the backend's
        # passes (CPU turns max-pool gradients into scatters; TPU keeps them native).
        "gather_scatter": stats["gather_scatter"],
        "gather_scatter_compiled": stats["gather_scatter_compiled"],
        # The TPU compiler rewrites most reduce-scatters (weight-update sharding's
        # gradients) as all-reduce + dynamic-slice: counted apart, and in the program.
        "reduce_scatter_as_all_reduce": stats["reduce_scatter_as_all_reduce"],
        "reduce_scatter_as_all_reduce_bytes": stats["reduce_scatter_as_all_reduce_bytes"],
        "reduce_scatter_program": stats.get("reduce_scatter_program"),
        "memory": stats.get("memory", {}),
        "lower_time_s": lower_s,
        "compile_time_s": compile_s,
    }
    if slice_of is not None:
        from parallel.dcn import dcn_collectives

        report.update(dcn_collectives(compiled.as_text(), slice_of))
    if coords is not None:
        from parallel.ici_links import ring_equivalent_wire_bytes

        report["ici_ring_bytes_per_device"] = ring_equivalent_wire_bytes(
            compiled.as_text(), coords, max_dims
        )
    if stats.get("optimal_seconds", 1.0) <= 0:
        # libtpu 0.0.42's estimate for a v4 megacore program is negative (BERT-large on
        # v4:16x16x16: -12 s): unusable. The step is then the roofline of the compiled
        # program's own FLOPs and HBM bytes at the chip's peaks (a lower bound).
        report["compiler_step_s_unusable"] = stats.pop("optimal_seconds")
        if peak_flops and hbm_bandwidth:
            report["estimated_step_s"] = max(
                stats["flops"] / peak_flops, stats["bytes_accessed"] / hbm_bandwidth
            )
            report["estimate_method"] = (
                "roofline at the chip's peaks (the compiler's estimate is negative; lower bound)"
            )
    if "optimal_seconds" in stats:
        report["compiler_step_s"] = stats["optimal_seconds"]
        report["estimated_step_s"] = stats["optimal_seconds"]
        # The compiler's estimate, like its cost analysis, sees a loop body once (one
        # layer of a scanned stack, one microbatch). Here the other iterations are added
        # at the chip's peak FLOP/s: a lower bound (a scanned layer stack is instead
        # extrapolated from unrolled compiles, `_layer_estimate`).
        unseen = stats["flops"] - stats["flops_loops_once"]
        if unseen > 0 and peak_flops:
            report["loop_flops_unseen"] = unseen
            report["estimated_step_s"] += unseen / peak_flops
            report["estimate_method"] = "compiler + other loop iterations at peak (lower bound)"
    return report


def layer_loop(model) -> bool:
    """Whether a model config runs its layers as a loop the compiler's estimate sees once:
    a scanned stack (`scan_layers`) deeper than 2 whose `scan_unroll` leaves iterations
    (0 or >= num_layers unrolls the whole stack into straight-line code)."""
    if not model.get("scan_layers", False) or model.num_layers <= 2:
        return False
    return 0 < int(model.get("scan_unroll", 1)) < model.num_layers


def _layer_estimate(
    config, devices, train: dict[str, Any], peak_flops: float | None = None
) -> None:
    """The step-time estimate of a scanned layer stack (`model.scan_layers`), from the
    TPU compiler's estimates of the same step with 1 and 2 unrolled layers, extrapolated
    linearly to the config's depth: est(1) + (L - 1) (est(2) - est(1)).

    The compiler's estimate sees a loop body once, so the scanned program's own estimate
    counts one layer. Per-layer estimates of unrolled programs are linear in depth
    (BERT-large per-core program on v3:2x2: 1, 2, 4 layers 4.698, 6.527, 10.184 ms;
    the extrapolation from 1 and 2 gives 10.185), and two small compiles are cheap.
    Adds the two estimates and the extrapolation to `train`.
    """
    from mlperf.trainer import build_trainer
    from parallel.aot import compiled_stats

    layers = int(config.model.num_layers)
    estimates, points = [], []
    for n in (1, 2):
        c = config.copy_and_resolve_references()
        c.model.update(num_layers=n, scan_layers=False)
        trainer = build_trainer(c, devices=devices, prepare_data=False)
        _, compiled, _, _, error = _compile(lambda t=trainer: t.lower_train_step(t.phases[0]))
        if compiled is None:
            train["layer_estimate_error"] = (error or "").splitlines()[0][:300]
            return
        stats = compiled_stats(compiled)
        points.append(
            {
                "flops_per_device": stats["flops"],
                "bytes_accessed_per_device": stats["bytes_accessed"],
                "wire_bytes": stats["wire_bytes"],
            }
        )
        estimate = float(stats.get("optimal_seconds", -1.0))
        if estimate > 0 and peak_flops:  # loops the estimate saw once (windowed einsums)
            estimate += (stats["flops"] - stats["flops_loops_once"]) / peak_flops
        estimates.append(estimate)
    # The same costs for the whole depth: XLA's cost analysis sees the scanned program's
    # loop body once, so the planner takes a scanned stack's HBM bytes from here.
    train["layer_extrapolated"] = {
        k: points[0][k] + (layers - 1) * (points[1][k] - points[0][k]) for k in points[0]
    }
    if min(estimates) <= 0:  # see _step_report: no usable compiler estimate
        train["layer_estimate_error"] = f"compiler estimate {min(estimates)} s is unusable"
        return
    per_layer = estimates[1] - estimates[0]
    train["layer_step_s"] = per_layer
    train["unrolled_1_2_layer_step_s"] = estimates
    train["estimated_step_s"] = estimates[0] + (layers - 1) * per_layer
    train["estimate_method"] = f"unrolled 1- and 2-layer compiles, extrapolated to {layers}"


def profile_step(hlo_text: str, topo=None, top: int = 25) -> dict[str, Any]:
    """The op profile of a compiled step (`parallel.hlo_profile`): the compiler's per-op
    cycles at the chip's clock, collectives by the ring model over the chip's links
    (both directions, shared by its cores), the rest by the roofline at its peaks."""
    from parallel.hardware import CLOCK_HZ
    from parallel.hlo_profile import op_profile, summarize

    kw: dict[str, Any] = {}
    if topo is not None:
        per_device = topo.devices_per_chip
        kw = dict(
            clock_hz=CLOCK_HZ.get(topo.generation),
            link_bandwidth=2 * topo.chip.link_bandwidth / per_device,
            peak_flops=topo.chip.peak_flops / per_device,
            hbm_bandwidth=topo.chip.hbm_bandwidth / per_device,
        )
    summary = summarize(op_profile(hlo_text, **kw), top)
    summary["clock_hz"] = kw.get("clock_hz")
    return summary


def _scan_layer_estimate(config, devices, train: dict[str, Any]) -> None:
    """The step-time estimate of a scanned layer stack from the scanned program itself:
    the compiled step (one layer per loop iteration, seen once by the compiler) and the
    same step with two layers per iteration (`model.scan_unroll=2`); their difference is
    one layer's forward and backward, so est(1) + (L - 1) (est(2) - est(1)).

    Unlike the unrolled extrapolation (`_layer_estimate`), what lies outside the loop is
    the program's own: the optimizer and the gradient collectives of the stacked
    [L, ...] variables, done once for all layers, not once per layer and per variable.
    Needs an even depth and one layer per iteration in the config (otherwise it falls
    back to the unrolled extrapolation).
    """
    from mlperf.trainer import build_trainer
    from parallel.aot import cost_analysis

    layers = int(config.model.num_layers)
    if layers % 2:
        _layer_estimate(config, devices, train)
        return
    c = config.copy_and_resolve_references()
    c.model.update(scan_unroll=2)
    trainer = build_trainer(c, devices=devices, prepare_data=False)
    _, compiled, _, _, error = _compile(lambda t=trainer: t.lower_train_step(t.phases[0]))
    if compiled is None:
        train["layer_estimate_error"] = (error or "").splitlines()[0][:300]
        return
    one, two = train["compiler_step_s"], float(cost_analysis(compiled).get("optimal_seconds", -1))
    if two <= 0:
        train["layer_estimate_error"] = f"compiler estimate {two} s is unusable"
        return
    train["layer_step_s"] = two - one
    train["scan_unroll_1_2_step_s"] = [one, two]
    train["estimated_step_s"] = one + (layers - 1) * (two - one)
    train["estimate_method"] = (
        f"scanned program with 1 and 2 layers per iteration, extrapolated to {layers}"
    )


LAYER_ESTIMATES = ("unrolled", "scan")


def check_batches(config, devices: int, where: str) -> None:
    """Raises a one-line ConfigError when a global batch does not split over the mesh's
    `data` axis, naming the nearest valid batches and the meshes that keep them
    (`mlperf.batch_fit`), before anything is built."""
    import math

    from mlperf.batch_fit import fit_text
    from mlperf.validate import ConfigError, mesh_sizes

    sizes = mesh_sizes(config, devices)
    if "data" not in sizes:
        return  # validate() names the missing axis
    slices = math.prod(d for d in config.mesh.dcn_shape if d > 0)
    text = fit_text(config, sizes, devices, where, slices)
    if text:
        raise ConfigError(text)


def inspect_config(
    config,
    devices=None,
    topology: str = "",
    eval_step: bool = False,
    layer_estimate: bool | str = True,
    slices: int = 1,
    profile: int = 0,
) -> dict:
    """Compiles the first phase's train step (and the eval step) and returns the report.

    `topology` names a TPU slice (e.g. "v3:64x64") compiled through libtpu, `slices`
    copies of it joined over DCN (the `data` axis spans them, `use_slices`); otherwise
    `devices` (default: this process's devices) are used. With `layer_estimate`, a
    scanned layer stack's step-time estimate comes from two small unrolled compiles
    (`_layer_estimate`; `layer_estimate="scan"`: from the scanned program with one and
    two layers per iteration, `_scan_layer_estimate`). `profile` > 0 adds the train
    step's op profile with that many top ops (`profile_step`).
    """
    import jax

    from mlperf.evaluate import eval_program
    from mlperf.steps import batch_abstract
    from mlperf.train_state import param_count
    from mlperf.trainer import build_trainer
    from mlperf.validate import ConfigError, mesh_sizes
    from parallel.aot import bytes_per_device, total_bytes
    from parallel.mesh import describe_mapping, mesh_shape
    from parallel.topology import TopologyError, check_mesh_fits, get_topology, mesh_fit_text

    if isinstance(layer_estimate, str) and layer_estimate not in LAYER_ESTIMATES:
        raise ValueError(
            f"layer estimate {layer_estimate!r} is unknown; use one of {LAYER_ESTIMATES}."
        )
    topo = get_topology(topology, slices) if topology else None
    if topo is not None:
        devices = topo.devices
        use_slices(config, slices)
        try:
            check_mesh_fits(topo, mesh_sizes(config, len(devices)))
        except ConfigError as e:
            wanted = ",".join(
                f"{a}={i}" for a, i in zip(config.mesh.axes, config.mesh.ici_shape, strict=False)
            )
            raise TopologyError(
                f"mesh {wanted} does not fit topology {topo.label} "
                f"({mesh_fit_text(topo, list(config.mesh.axes))}): {e}"
            ) from None
    devices = list(jax.devices() if devices is None else devices)
    check_batches(config, len(devices), topo.label if topo is not None else "these devices")
    trainer = build_trainer(config, devices=devices, prepare_data=False)
    phase = trainer.phases[0]
    state = trainer.layout.abstract_train_state
    mesh = trainer.partitioner.mesh
    slice_of = [getattr(d, "slice_index", 0) or 0 for d in mesh.devices.flat]
    slice_of = slice_of if len(set(slice_of)) > 1 else None
    torus = {}
    if topo is not None:
        from parallel.ici_links import mesh_coords

        torus = {"coords": mesh_coords(mesh), "max_dims": max(topo.chip.links // 2, 1)}
    peak = topo.chip.peak_flops / topo.devices_per_chip if topo is not None else None
    hbm_bw = topo.chip.hbm_bandwidth / topo.devices_per_chip if topo is not None else None
    compiled_train = _compile(lambda: trainer.lower_train_step(phase))
    train = _step_report(
        *compiled_train, peak_flops=peak, slice_of=slice_of, hbm_bandwidth=hbm_bw, **torus
    )
    if profile and compiled_train[1] is not None:
        train["profile"] = profile_step(compiled_train[1].as_text(), topo, profile)
    if layer_estimate and layer_loop(config.model) and "flops_per_device" in train:
        if layer_estimate != "scan" or config.model.get("scan_unroll", 1) != 1:
            _layer_estimate(config, devices, train, peak)
        elif "compiler_step_s" in train:
            _scan_layer_estimate(config, devices, train)
    logging.info("train step: %s", json.dumps(train))  # kept if the eval compile never ends
    params_b, opt_b = bytes_per_device(state["params"]), bytes_per_device(state["opt_state"])
    mem = train.get("memory", {})
    device = devices[0]
    hbm = topo.hbm_per_device if topo is not None else None
    if topo is None and device.platform != "cpu":
        stats = device.memory_stats() or {}
        hbm = stats.get("bytes_limit")
    total = mem.get("total")
    if train.get("out_of_memory"):
        # The compiler stopped at HBM: its figure, or state plus the temporaries it needed
        # (at least the state, when the message names neither).
        total = train.get("oom_used_bytes") or params_b + opt_b + train.get("oom_temp_bytes", 0)
    report: dict[str, Any] = {
        "config": f"{config.benchmark}:{config.variant}",
        "topology": topo.name if topo else "",
        "slices": topo.slices if topo else 1,
        "device_kind": device.device_kind,
        "devices": len(devices),
        "chips": topo.chips if topo else len(devices),
        "mesh": mesh_shape(mesh),
        "mesh_mapping": describe_mapping(mesh),
        "params": param_count(trainer.layout),
        "global_batch_size": phase.global_batch_size,
        "microbatches": config.train.microbatches,
        "weight_update_sharding": bool(config.parallel.weight_update_sharding),
        "fsdp": bool(config.parallel.fsdp),
        "bytes_per_device": {
            "params": params_b,
            "opt_state": opt_b,
            "temp": mem.get("temp", train.get("oom_temp_bytes")),
            "total": total,
        },
        "bytes_total": {
            "params": total_bytes(state["params"]),
            "opt_state": total_bytes(state["opt_state"]),
        },
        "hbm_per_device": hbm,
        "fits": None if hbm is None or total is None else bool(total <= hbm),
        "out_of_memory": bool(train.get("out_of_memory")),
        "train": train,
        # The train step's op statistics also at the top level (older callers read them).
        **{k: train[k] for k in _TOP_LEVEL if k in train},
    }
    if report["fits"] is not None:
        report["hbm_headroom_bytes"] = int(hbm - total)
    if train.get("flops_per_device") is not None:
        report["flops_per_step"] = train["flops_per_device"] * len(devices)
    if eval_step:
        spec = trainer.task.eval_example_spec(trainer.phases[-1])
        abstract = batch_abstract(trainer.partitioner, spec, config.train.eval_batch_size)
        fn = eval_program(
            trainer.task, trainer.layout, trainer.partitioner, state["params"], abstract
        )
        report["eval"] = _step_report(
            *_compile(lambda: fn.lower(state["params"], abstract)),
            peak_flops=peak,
            slice_of=slice_of,
            hbm_bandwidth=hbm_bw,
            **torus,
        )
    return report


def _estimate_text(step: dict[str, Any]) -> str:
    est = step.get("estimated_step_s")
    if est is None:
        return "-"
    method = step.get("estimate_method")
    if method is None:
        return f"{est * 1e3:.2f} ms (compiler)"
    program = step.get("compiler_step_s", step.get("compiler_step_s_unusable", 0.0)) * 1e3
    return f"{est * 1e3:.2f} ms ({method}; the compiled program's own: {program:.2f} ms)"


def _topology_text(report: dict[str, Any]) -> str:
    if not report["topology"]:
        return "this machine"
    slices = report.get("slices", 1)
    return report["topology"] + (f" x {slices} slices over DCN" if slices > 1 else "")


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / (1 << 30):.3f} GiB"


def table(report: dict[str, Any]) -> str:
    """The report as aligned `name  value` lines."""
    b, totals = report["bytes_per_device"], report["bytes_total"]
    fits = report["fits"]
    verdict = "unknown (no HBM size for this device)"
    if fits is not None:
        head = report["hbm_headroom_bytes"]
        verdict = f"fits, {_gib(head)} spare" if fits else f"DOES NOT FIT, {_gib(-head)} over"
    rows = [
        ("config", report["config"]),
        ("devices", f"{report['devices']} x {report['device_kind']} ({report['chips']} chips)"),
        ("topology", _topology_text(report)),
        ("mesh", " x ".join(f"{k}={v}" for k, v in report["mesh"].items())),
        ("mesh mapping", report.get("mesh_mapping", "-")),
        ("parameters", f"{report['params']:,}"),
        ("params / device", f"{_gib(b['params'])} (of {_gib(totals['params'])})"),
        ("opt state / device", f"{_gib(b['opt_state'])} (of {_gib(totals['opt_state'])})"),
        ("temporaries / device", _gib(b["temp"])),
        ("total / device", f"{_gib(b['total'])} of {_gib(report['hbm_per_device'])}: {verdict}"),
    ]
    for name in ("train", "eval"):
        step = report.get(name)
        if step is None:
            continue
        if "error" in step:
            rows.append((f"{name} step", f"did not compile: {step['error']}"))
            continue
        rows += [
            (f"{name} FLOPs / device", f"{step['flops_per_device']:.4e} (loops x trip count)"),
            (
                f"{name} wire bytes / device",
                f"{_gib(step.get('wire_bytes_per_device'))} (every collective, loops x trip count)",
            ),
            (
                f"{name} gather+scatter",
                f"{step['gather_scatter']} in the program, "
                f"{step.get('gather_scatter_compiled', '-')} after the backend's passes",
            ),
            (f"{name} est. step time", _estimate_text(step)),
            (
                f"{name} compile time",
                f"{step['compile_time_s']:.1f} s (lowering {step.get('lower_time_s', 0.0):.1f} s)",
            ),
        ]
        for op, count in step["collectives"].items():
            if count:
                rows.append((f"  {op}", f"{count} ops, {_gib(step['collective_bytes'][op])}"))
        for op, count in step.get("dcn_collectives", {}).items():
            rows.append(
                (
                    f"  {op} over DCN",
                    f"{count} ops, {_gib(step['dcn_collective_bytes'][op])} "
                    f"({_gib(step['dcn_wire_bytes'])} sent per device over DCN in all)",
                )
            )
        sliced = step.get("reduce_scatter_as_all_reduce", 0)
        if sliced or step.get("reduce_scatter_program"):
            rows.append(
                (
                    "  reduce-scatter as all-reduce",
                    f"{sliced} tensors read through a dynamic-slice, "
                    f"{_gib(step['reduce_scatter_as_all_reduce_bytes'])} of shards "
                    f"({step.get('reduce_scatter_program', '-')} reduce-scatters in the program)",
                )
            )
    width = max(len(k) for k, _ in rows)
    text = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    profile = report.get("train", {}).get("profile")
    if profile:
        from parallel.hlo_profile import profile_table

        text += "\n\ntrain step op profile (compiler cycles per op; collectives: ring model)\n"
        text += profile_table(profile)
    return text
