"""COMET-style cluster planner: compile candidate parallelisations, rank by time to train.

    python -m launch.plan --config configs/bert.py:mlperf_v07 --topology v3:64x64 \\
        [--chips 1024,4096] [--full] [--budget_s 900] [--hbm_scale 1.6] [--ici_scale 2] \\
        [--dcn_scale 1] [--slices 1] [--price 2.0] [--collectives] [--json] [--plot plan.png]
    python -m launch.plan --config configs/bert.py:large --cluster t4x8x32-10gbe \\
        --batch_per_device 32 --microbatches 4 --grad_reduce_dtype float16 \\
        --config.data.seq_length=128
    python -m launch.plan --honesty
    python -m launch.plan --lin_cluster_study
    python -m launch.plan --scale_study [--points 100b/v4:16x16x16/16/fsdp/1;...] \\
        [--budget_s 900] [--cache_dir /tmp/multipod-scale-study]
    python -m launch.plan --config configs/bert.py:tiny --cpu [--meshes 8x1,4x2] \\
        [--measure] [--steps 10] [--warmup 2]

For a TPU slice every candidate (data x model split, weight-update sharding / FSDP /
replicated optimizer, microbatches, rematerialisation where the config has it) is
AOT-compiled with libtpu within the time budget; its memory per device, the compiler's
step-time estimate, and an analytic split (compute, HBM, ICI; DCN for multi-slice, which
the compiler does not see) give time to train, chip-hours and dollars. A candidate that
fails to compile is a row with its error; the plan goes on. Clusters without a compiler
here (GPU clusters, parallel/hardware.py) are planned from the FLOPs and bytes of a
reference TPU compile with the analytic model alone.

`--cpu` plans this process's fake CPU devices instead (data x model splits of all of
them), each candidate compiled by XLA:CPU and predicted from its FLOPs, bytes and
collectives at rates measured on this host (`mlperf.planning.cpu_check`); `--measure`
also times the compiled steps and prints predicted / measured and the ranking agreement.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from launch.cli import parse_flags, relax_cpu_collective_timeouts, usage_error

relax_cpu_collective_timeouts()


def _define_flags() -> dict[str, Any]:
    """The CLI's flags, defined only when run as a program."""
    return {
        "config": config_flags.DEFINE_config_file(
            "config", None, "e.g. configs/bert.py:mlperf_v07."
        ),
        "topology": flags.DEFINE_string("topology", "", "TPU slice, e.g. v3:64x64."),
        "chips": flags.DEFINE_list("chips", [], "Also plan these chip counts."),
        "full": flags.DEFINE_bool("full", False, "Every combination, not one knob at a time."),
        "budget": flags.DEFINE_float("budget_s", 900.0, "Compile budget in seconds."),
        "hbm": flags.DEFINE_float("hbm_scale", 1.0, "What-if: HBM capacity x this (COMET: 1.6)."),
        "ici": flags.DEFINE_float("ici_scale", 1.0, "What-if: ICI / intra-node bandwidth x this."),
        "dcn": flags.DEFINE_float("dcn_scale", 1.0, "What-if: DCN / inter-node bandwidth x this."),
        "slices": flags.DEFINE_integer("slices", 1, "Slices joined over DCN (data parallel)."),
        "price": flags.DEFINE_float("price", None, "US$ per chip-hour (default: hardware.py)."),
        "cluster": flags.DEFINE_string("cluster", "", "A GPU cluster of parallel/hardware.py."),
        "bpd": flags.DEFINE_integer("batch_per_device", 32, "--cluster: examples per device."),
        "micro": flags.DEFINE_integer("microbatches", 1, "--cluster: gradient accumulation steps."),
        "honesty": flags.DEFINE_bool("honesty", False, "Predict the published MLPerf v0.7 times."),
        "lin_cluster_study": flags.DEFINE_bool(
            "lin_cluster_study",
            False,
            "Lin et al.'s T4-cluster study (arXiv 2008.00177) from the model.",
        ),
        "scale_study": flags.DEFINE_bool(
            "scale_study", False, "COMET's study: 10B/100B/1T BERT over splits on 4096 chips."
        ),
        "points": flags.DEFINE_string(
            "points", "", "--scale_study: size/topology/model[/mode[/micro]];... (else the study)"
        ),
        "cache": flags.DEFINE_string(
            "cache_dir", "/tmp/multipod-scale-study", "--scale_study: per-point row cache."
        ),
        "proxy": flags.DEFINE_string("proxy", "", "--honesty: per-core proxy slice, e.g. v3:4x4."),
        "grad_dtype": flags.DEFINE_enum(
            "grad_reduce_dtype",
            None,
            ["float32", "bfloat16", "float16"],
            "Gradient all-reduce precision (default: the config's parallel.grad_reduce_dtype).",
        ),
        "cpu": flags.DEFINE_bool(
            "cpu", False, "Plan this process's CPU devices (data x model splits of them all)."
        ),
        "meshes": flags.DEFINE_string(
            "meshes", "", "--cpu: DATAxMODEL candidates, e.g. 8x1,4x2 (default: every split)."
        ),
        "measure": flags.DEFINE_bool("measure", False, "--cpu: also time real steps."),
        "steps": flags.DEFINE_integer("steps", 10, "--cpu --measure: timed steps (median)."),
        "warmup": flags.DEFINE_integer("warmup", 2, "--cpu --measure: untimed steps first."),
        "collectives": flags.DEFINE_bool(
            "collectives",
            False,
            "TPU: also compile each gradient all-reduce algorithm per candidate and report "
            "libtpu's pick.",
        ),
        "json": flags.DEFINE_bool("json", False, "Print JSON instead of a table."),
        "plot": flags.DEFINE_string("plot", "", "Write a PNG: step time and memory per candidate."),
    }


_FLAGS: dict[str, Any] = {}


# Flag key in _define_flags -> the knob's name in mlperf.planning.search.KNOB_RANGES.
_KNOBS = {
    "hbm": "hbm_scale",
    "ici": "ici_scale",
    "dcn": "dcn_scale",
    "slices": "slices",
    "price": "price",
    "budget": "budget_s",
    "bpd": "batch_per_device",
    "micro": "microbatches",
}


def check_flags(f: dict[str, Any]) -> None:
    """Knobs out of their sensible range, a chip count that is not a positive integer or an
    unknown --cluster: one line and exit 2, before any config is compiled."""
    from mlperf.planning.search import check_knob

    for key, knob in _KNOBS.items():
        message = check_knob(knob, f[key])
        if message:
            usage_error(message)
    for n in f["chips"]:
        if not n.strip().isdigit() or check_knob("chips", int(n)):
            usage_error(f"--chips {n!r} is not a chip count; give positive integers: 1024,4096.")
    if f["cluster"]:
        from parallel.hardware import CLUSTERS

        if f["cluster"] not in CLUSTERS:
            usage_error(f"--cluster {f['cluster']!r} is unknown; use one of {', '.join(CLUSTERS)}.")


def main(argv: list[str]) -> None:
    f = {name: flag.value for name, flag in _FLAGS.items()}
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    check_flags(f)
    from mlperf.planning import reports as plan_reports
    from mlperf.planning.search import plan, plot, table
    from parallel.topology import TopologyError, get_topology, topology_for_chips

    if f["honesty"]:
        rows = plan_reports.honesty_rows(f["proxy"])
        print(json.dumps(rows, indent=2) if f["json"] else plan_reports.honesty_table(rows))
        return
    if f["scale_study"]:
        _scale_study(f)
        return
    config = f["config"]
    if f["lin_cluster_study"]:
        from mlperf.planning.lin_cluster_study import lin_cluster_study, lin_cluster_study_text

        result = lin_cluster_study(config)  # BERT-large unless --config names another BERT
        print(json.dumps(result, indent=2) if f["json"] else lin_cluster_study_text(result))
        return
    if config is None:
        raise app.UsageError("give --config, e.g. configs/bert.py:mlperf_v07 (or --honesty).")
    if f["grad_dtype"]:
        config.parallel.grad_reduce_dtype = f["grad_dtype"]
    if f["cpu"]:
        _plan_cpu(config, f)
        return
    if f["cluster"]:
        rows = plan_reports.cluster_scaling(config, f["cluster"], f["bpd"], f["micro"])
        print(json.dumps(rows, indent=2) if f["json"] else plan_reports.cluster_table(rows))
        return
    if not f["topology"]:
        raise app.UsageError("give --topology (e.g. v3:64x64) or --cluster (GPU).")
    try:
        topologies = [get_topology(f["topology"]).name]
        generation = topologies[0].split(":")[0]
        topologies += [topology_for_chips(generation, int(n)) for n in f["chips"]]
    except TopologyError as e:
        raise app.UsageError(str(e)) from None
    what_if = dict(
        hbm_scale=f["hbm"],
        ici_scale=f["ici"],
        dcn_scale=f["dcn"],
        slices=f["slices"],
        price=f["price"],
    )
    from mlperf.batch_fit import topology_fit_text

    # The config's own mesh is not a candidate when a batch does not split: say so and
    # what would, before the compiles (on stderr under --json, which prints only JSON).
    for name in dict.fromkeys(topologies):
        note = topology_fit_text(config, name, f["slices"])
        if note:
            print(f"note: {note}", file=sys.stderr if f["json"] else sys.stdout, flush=True)
    rows = plan(
        config,
        list(dict.fromkeys(topologies)),
        what_if,
        f["full"],
        f["budget"],
        collectives=f["collectives"],
    )
    print(json.dumps(rows, indent=2, default=str) if f["json"] else table(rows))
    if f["plot"]:
        plot(rows, f["plot"])


def _scale_study(f: dict[str, Any]) -> None:
    """--scale_study: the 10B/100B/1T points (or --points), compiled or from the cache."""
    from mlperf.planning.scale_study import DEFAULT_POINTS, parse_points, run_study, study_text

    try:
        points = parse_points(f["points"]) if f["points"] else DEFAULT_POINTS
    except ValueError as e:
        usage_error(str(e))
    rows = run_study(points, f["cache"] or None, f["budget"])
    print(json.dumps(rows, indent=2, default=str) if f["json"] else study_text(rows))


def _plan_cpu(config, f: dict[str, Any]) -> None:
    """--cpu: the candidates over this process's CPU devices, predicted (and measured)."""
    import jax

    from mlperf.planning.cpu_check import check_meshes, cpu_table, plan_cpu, report_header

    devices = jax.devices()
    if devices[0].platform != "cpu":
        usage_error(f"--cpu plans CPU devices; this process has {devices[0].platform} ones.")
    if f["steps"] < 1 or f["warmup"] < 0:
        usage_error("--steps must be >= 1 and --warmup >= 0.")
    try:
        check_meshes(f["meshes"], len(devices), tuple(config.mesh.axes))
    except ValueError as e:
        usage_error(str(e))
    result = plan_cpu(config, f["meshes"], f["measure"], f["steps"], f["warmup"], devices)
    if f["json"]:
        print(json.dumps(result, indent=2))
        return
    print(report_header(config, len(devices), " ".join(sys.argv[1:])))
    print(cpu_table(result))


if __name__ == "__main__":
    _FLAGS.update(_define_flags())
    app.run(main, flags_parser=parse_flags)
