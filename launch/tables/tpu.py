"""The TPU table: each `mlperf_v07` config compiled at its published scale on v3 and at
the nearest chip count on each current generation, beside Google's published times.

One row is one `python -m launch.inspect ... --json` run in its own process (with a
timeout; a failed or timed-out compile keeps its error in its row), cached as JSON so
that the table assembles from rows compiled one at a time. From each report the row
derives memory per chip, FLOPs, collectives (with those over DCN), the roofline
(`parallel.costmodel.tpu_step_time`) and the step time of the planner's model
(`step_model.planned_step`: the compiler's estimate, else the generation's fitted model,
else the roofline plus ICI; plus DCN), MFU against the analytic FLOPs, time to train
(steps x step), chip-hours and list-price dollars; the step and what follows from it are
taken from the row's own figures (launch/tables/tpu_step.py), as for a stored row.
`python -m launch.bench.tpu` compiles rows into its cache; `python -m launch.tpu_table`
keeps the summarised rows, each with the commit that compiled it, in the repository
(docs/results/tpu-table-rows.json) and writes the page from them (launch/tables/tpu_page.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from launch.tables.tpu_step import ROOFLINE_ETA_METHOD, restep_row, roofline_method
from mlperf.planning import step_model
from mlperf.planning.search import ici_wire_bytes
from mlperf.provenance import code_commit

MODELS = ("bert", "transformer", "ssd", "maskrcnn")
GENERATIONS = ("v3", "v4", "v5p", "v5e", "v6e")
# The published scale of each v0.7 result (v3) and, per current generation, the slice
# (x slices over DCN) nearest its 4096 chips that the generation sells.
PUBLISHED_SCALE = {
    "bert": "v3:64x64",
    "transformer": "v3:64x64",
    "ssd": "v3:32x64",
    "maskrcnn": "v3:16x32",
}
CURRENT = {
    "v4": ("v4:16x16x16", 1),
    "v5p": ("v5p:16x16x16", 1),
    "v5e": ("v5e:16x16", 2),
    "v6e": ("v6e:16x16", 2),
}
# Other variants (e.g. tiny, for the table code's own test) on the smallest slices.
SMALL = {
    "v3": ("v3:2x2", 1),
    "v4": ("v4:2x2x1", 1),
    "v5p": ("v5p:2x2x1", 1),
    "v5e": ("v5e:2x2", 1),
    "v6e": ("v6e:2x2", 1),
}
# Google's MLPerf v0.7 results on TPU v3 (mlcommons/training_results_v0.7, Google/), as
# read for this table: per-step times derived from the result logs' markers (the
# planner's figures, `mlperf.planning.reports.PUBLISHED_V07`, which a v3 row's ratio of
# its estimate to them takes: tpu_step).
PUBLISHED = {
    "bert": {
        "text": "48.1 ms/step device pace (eval results 62 steps apart, median of 10 runs; "
        "block markers: 17.0 ms host dispatch pace)",
    },
    "transformer": {
        "text": "~12.1 ms/step (276.5-step epochs in 3.35 s); BLEU 25 after 1,106-1,383 steps",
    },
    "ssd": {
        "text": "10.6 ms/step device pace (eval results 5 epochs = 144 steps apart, median of "
        "5 runs; block markers: 6.1 ms host dispatch pace)",
    },
    "maskrcnn": {"text": "8.1 min to train (TF, tpu-v3-1024)"},
}
_OP = {
    "all-reduce": "AR",
    "all-gather": "AG",
    "reduce-scatter": "RS",
    "all-to-all": "A2A",
    "collective-permute": "CP",
}


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """One compile: a config on a topology (x slices), with the overrides that make its
    batches split (`mlperf.batch_fit.suggest`) and why."""

    model: str
    variant: str
    generation: str
    topology: str
    slices: int
    overrides: tuple[tuple[str, str], ...] = ()
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.variant}-{self.model}-{self.generation}"

    @property
    def label(self) -> str:
        return self.topology + (f" x {self.slices}" if self.slices > 1 else "")

    def command(self, python: str = sys.executable) -> list[str]:
        """The `launch.inspect` command line of this row."""
        argv = [python, "-m", "launch.inspect", f"--config=configs/{self.model}.py:{self.variant}"]
        argv += [f"--topology={self.topology}", f"--slices={self.slices}", "--eval=false"]
        argv += [f"--{k}={v}" for k, v in self.overrides]
        return argv + ["--json"]


def devices_of(topology: str, slices: int = 1) -> int:
    """JAX devices of a named slice x slices, without libtpu: v2/v3 show 2 per chip."""
    generation, _, shape = topology.partition(":")
    chips = math.prod(int(d) for d in shape.split("x"))
    return chips * (2 if generation in ("v2", "v3") else 1) * slices


def chips_of(topology: str, slices: int = 1) -> int:
    return math.prod(int(d) for d in topology.partition(":")[2].split("x")) * slices


def load_config(model: str, variant: str, overrides: tuple[tuple[str, str], ...] = ()):
    """The config `configs/<model>.py:<variant>` with a row's overrides applied."""
    import importlib

    from mlperf.validate import apply_mesh_override, set_config_key  # as the command line

    config = importlib.import_module(f"configs.{model}").get_config(variant)
    for key, value in overrides:
        if key == "mesh":
            apply_mesh_override(config, value)
            continue
        set_config_key(config, key.removeprefix("config."), value, convert=True)
    return config


def row_spec(model: str, generation: str, variant: str = "mlperf_v07") -> RowSpec:
    """The row of `model` on `generation`: published scale (v3) or nearest chip count,
    with overrides where the config's batches do not split over its mesh there."""
    from mlperf.batch_fit import mesh_text, problems, suggest, use_slices
    from mlperf.validate import ConfigError, mesh_sizes

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; use one of {', '.join(MODELS)}.")
    if generation not in GENERATIONS:
        raise ValueError(f"unknown generation {generation!r}; use {', '.join(GENERATIONS)}.")
    if variant != "mlperf_v07":
        topology, slices = SMALL[generation]
    elif generation == "v3":
        topology, slices = PUBLISHED_SCALE[model], 1
    else:
        topology, slices = CURRENT[generation]
    config = load_config(model, variant)
    use_slices(config, slices)
    devices = devices_of(topology, slices)
    fix: dict[str, str] = {}
    try:
        sizes = mesh_sizes(config, devices)
    except ConfigError:  # a fixed mesh for another device count: let `data` take the rest
        axes = list(config.mesh.axes)
        ici = [
            -1 if a == "data" else int(n) for a, n in zip(axes, config.mesh.ici_shape, strict=True)
        ]
        config.mesh.ici_shape = tuple(ici)
        sizes = mesh_sizes(config, devices)
        fix["mesh"] = mesh_text({a: n for a, n in zip(axes, ici, strict=True)})
    fix.update(suggest(config, sizes, devices, slices))
    note = "; ".join(
        f"{p.name.split('.')[-1]} {p.batch} does not split over data={sizes['data']}"
        for p in problems(config, sizes["data"])
    )
    if fix:
        note += (": " if note else "") + ", ".join(f"--{k}={v}" for k, v in fix.items())
    return RowSpec(model, variant, generation, topology, slices, tuple(fix.items()), note)


def run_row(
    spec: RowSpec, cache_dir: str, timeout_s: float, compile_missing: bool = True
) -> dict[str, Any]:
    """The cached result of `spec` (same command), else its compile in a subprocess of
    at most `timeout_s` seconds; the result (report or error) is cached either way."""
    path = Path(cache_dir) / f"{spec.key}.json"
    command = spec.command("python")
    if path.exists():
        cached = json.loads(path.read_text())
        if cached.get("command") == command:
            return cached
    if not compile_missing:
        return {"spec": dataclasses.asdict(spec), "command": command, "error": "not compiled"}
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    start = time.perf_counter()
    commit, tree_clean = code_commit()  # the subprocess runs this checkout's code
    result: dict[str, Any] = {
        "spec": dataclasses.asdict(spec),
        "command": command,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": commit,
        "tree_clean": tree_clean,
        **package_versions(),
        "machine": f"{os.cpu_count()}-core CPU host",
    }
    try:
        done = subprocess.run(
            spec.command(sys.executable),
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        result["rc"] = done.returncode
        if done.returncode == 0:
            result["report"] = json.loads(done.stdout)
        else:
            lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
            errors = [ln for ln in lines if "error" in ln.lower()]
            result["error"] = ((errors or lines or ["no output"])[-1])[:500]
    except subprocess.TimeoutExpired:
        result["error"] = f"timed out after {timeout_s:.0f} s"
    result["wall_s"] = time.perf_counter() - start
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return result


def package_versions() -> dict[str, str]:
    """The installed libtpu and jax versions (the compiler that made a row)."""
    import importlib.metadata as md

    versions = {}
    for package in ("libtpu", "jax"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


# What a summarised row carries over from its cached result: when, with which code and
# compiler it was compiled.
PROVENANCE = ("date", "commit", "tree_clean", "libtpu", "jax", "machine")


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """The table's figures of one row from its cached result (see the module doc)."""
    from mlperf.planning.search import steps_to_target
    from mlperf.tasks import get_task
    from parallel import costmodel
    from parallel.hardware import CHIPS

    fields = result["spec"]
    spec = RowSpec(**{**fields, "overrides": tuple(map(tuple, fields["overrides"]))})
    chip = CHIPS[spec.generation]
    per_chip = devices_of(spec.topology) // chips_of(spec.topology)
    chips = chips_of(spec.topology, spec.slices)
    row: dict[str, Any] = {
        "key": spec.key,
        **{k: result.get(k) for k in PROVENANCE},
        "model": spec.model,
        "generation": spec.generation,
        "variant": spec.variant,
        "topology": spec.label,
        "chips": chips,
        "note": spec.note,
        "wall_s": result.get("wall_s"),
        "published": PUBLISHED[spec.model]["text"] if spec.generation == "v3" else "",
    }
    report = result.get("report")
    if report is None:
        row["error"] = result.get("error", "no report")
        return row
    train = report["train"]
    row["mesh"] = ",".join(f"{a}={n}" for a, n in report["mesh"].items())
    if spec.slices > 1:
        row["mesh"] += f" ({spec.slices} slices)"
    total = report["bytes_per_device"]["total"]
    row.update(
        fits=report["fits"],
        memory_per_chip=None if total is None else total * per_chip,
        hbm_per_chip=chip.hbm_bytes,
        compile_s=train.get("compile_time_s", 0.0) + train.get("lower_time_s", 0.0),
    )
    if "error" in train:
        row["error"] = "out of HBM" if train.get("out_of_memory") else train["error"]
        return row
    config = load_config(spec.model, spec.variant, spec.overrides)
    task = get_task(config)
    phase = task.phases()[0]
    batch = phase.global_batch_size
    analytic = task.flops_per_example(phase) * batch  # per step, all chips
    dcn_bw = chip.dcn_bandwidth / per_chip
    step = costmodel.tpu_step_time(
        flops=train["flops_per_device"],
        # A scanned stack's HBM bytes from its unrolled 1- and 2-layer compiles, as the
        # planner takes them (the cost analysis sees the loop body once).
        bytes_accessed=train.get("layer_extrapolated", train)["bytes_accessed_per_device"],
        wire_bytes=ici_wire_bytes(train),
        compiler_s=train.get("estimated_step_s") if "compiler_step_s" in train else None,
        peak_flops=chip.peak_flops / per_chip,
        hbm_bandwidth=chip.hbm_bandwidth / per_chip,
        ici_bandwidth=2 * chip.link_bandwidth / per_chip,
        slices=spec.slices,
        dcn_bandwidth=dcn_bw,
        dcn_wire_bytes=train.get("dcn_wire_bytes", 0.0 if spec.slices > 1 else None),
    )
    row.update(
        flops_per_chip=train["flops_per_device"] * per_chip,
        flops_vs_analytic=train["flops_per_device"] * report["devices"] / analytic,
        collectives={
            op: (n, train["collective_bytes"].get(op, 0))
            for op, n in train["collectives"].items()
            if n
        },
        dcn_collectives=train.get("dcn_collectives", {}),
        dcn_wire_bytes=train.get("dcn_wire_bytes", 0),
        gather_scatter=train.get("gather_scatter"),
        step_s=step.total_s,  # the compiler's estimate plus DCN, or the serial roofline
        step_bounds_s=(step.overlapped_s, step.serial_s),
        compiler_s=step.compiler_s,
        compiler_estimate=step.compiler_s is not None,
        dcn_s=step.dcn_s,
        step_method=_method(train, spec.generation),
        steps=steps_to_target(config),
        # Rows compiled before the ICI term counted the torus dimensions a collective
        # spans lack the field: their ICI slot is every collective on one ring.
        ici="links spanned" if "ici_ring_bytes_per_device" in train else "one ring",
    )
    # The planner's step model on these figures, and what follows from the step: the
    # same code that resteps a stored row (tpu_step).
    return restep_row(row)


def _method(train: dict[str, Any], generation: str) -> str:
    """Where a row's step time comes from (see `mlperf.inspection`, `step_model`)."""
    if "layer_step_s" in train:
        return "compiler, 1-2 layers extrapolated"
    if "compiler_step_s" not in train:
        return roofline_method(generation)
    return "compiler + loops at peak" if "estimate_method" in train else "compiler"


def _step_cell(row: dict[str, Any]) -> str:
    """The estimated step, its method and the roofline's bounds: ICI hidden behind
    compute, and ICI after it (the step itself where the plain roofline is the step)."""
    text = f"{row['step_s'] * 1e3:.2f} ms ({row['step_method']}"
    if row.get("step_bounds_s"):
        low, high = (s * 1e3 for s in row["step_bounds_s"])
        if row["compiler_estimate"] or row["step_method"].startswith(ROOFLINE_ETA_METHOD):
            text += f"; roofline {low:.2f} ms with ICI overlapped, {high:.2f} ms serial"
        else:  # the step is the serial figure
            text += f"; {low:.2f} ms with ICI overlapped"
        if not row["compiler_estimate"] and row.get("ici") != "links spanned":
            text += "; ICI: each collective on one ring"
    return text + ")"


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _time(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _cells(row: dict[str, Any]) -> list[str]:
    head = [row["model"], f"{row['topology']} ({row['chips']})", row.get("mesh", "-")]
    head.append(row["note"] or "-")
    memory = "-"
    if row.get("memory_per_chip") is not None:
        verdict = "fits" if row["fits"] else "**does not fit**"
        used, hbm = row["memory_per_chip"] / 2**30, row["hbm_per_chip"] / 2**30
        memory = f"{verdict}: {used:.1f} of {hbm:.0f} GiB"
    if "step_s" not in row:
        error = row.get("error", "-").replace("|", "/")
        error = error if error == "not compiled" else f"error: {error}"
        wall = f"{row['wall_s']:.0f}" if row.get("wall_s") else "-"
        return head + [memory, error] + ["-"] * 9 + [row["published"] or "-", wall]
    colls = ", ".join(
        f"{n} {_OP.get(op, op)} {_gb(b)}" for op, (n, b) in row["collectives"].items()
    )
    dcn = "-"
    if row["dcn_collectives"]:
        ops = ", ".join(f"{n} {_OP.get(op, op)}" for op, n in row["dcn_collectives"].items())
        dcn = f"{ops}; {_gb(row['dcn_wire_bytes'])} sent/chip ({row['dcn_s'] * 1e3:.2f} ms)"
    published = row["published"] or "-"
    if row.get("vs_published"):
        published += f"; est./published {row['vs_published']:.2f}"
    if row["generation"] not in step_model.VALIDATED:  # no measured run: no number
        # The planner's cells (mlperf.planning.search.table) for such a row.
        timing = ["not validated", "-", str(row["steps"]), "not validated", "-", "-"]
    else:
        timing = [_step_cell(row), f"{100 * row['mfu']:.0f}%", str(row["steps"])]
        timing += [_time(row["time_to_train_s"]), f"{row['chip_hours']:.1f}"]
        timing += [f"${row['dollars']:.0f}"]
    return head + [
        memory,
        f"{row['flops_per_chip']:.3g} ({row['flops_vs_analytic']:.2f}x analytic)",
        colls or "-",
        dcn,
        str(row["gather_scatter"]),
        *timing,
        published,
        f"{row['wall_s']:.0f}" if row.get("wall_s") else "-",
    ]


COLUMNS = (
    "model",
    "topology (chips)",
    "mesh",
    "batch / mesh change",
    "memory per chip",
    "train FLOPs per chip",
    "collectives (ICI and DCN)",
    "over DCN",
    "gather/scatter",
    "est. step",
    "MFU",
    "steps",
    "time to train",
    "chip-hours",
    "list price",
    "published (Google v0.7, v3)",
    "wall s",
)


INTRO = """# TPU table: the `mlperf_v07` configs compiled per TPU generation

Each row is one full-size compile by libtpu's TPU compiler on a CPU machine
(`python -m launch.inspect --json`, train step only; nothing runs on a TPU): the
published scale of Google's MLPerf v0.7 result on v3, and the nearest chip count on each
current generation (v4 and v5p: 16x16x16 = 4096 chips; v5e and v6e: two 16x16 slices =
512 chips joined over DCN, `data` spanning the slices). Where a config's global batch
does not split over the topology's `data` size, the row names the change it compiled
with (`mlperf/batch_fit.py`: the published train batch is kept by changing the mesh
where one allows it; an eval batch takes its nearest valid value, and the eval step is
not compiled here).

Columns: memory per chip against HBM (the compiler's figure; out of HBM at the real
capacity: its message), the train step's FLOPs per chip (loops times trip count) and
their ratio to the analytic count, collectives (ops and result bytes: AR all-reduce, AG
all-gather, RS reduce-scatter, CP collective-permute), those whose groups cross slices
with the bytes each chip sends over DCN and their time at the host NIC's share, the
gather/scatter count, the estimated step (the planner's: the compiler's estimate, a
scanned layer stack extrapolated from 1- and 2-layer compiles, or where libtpu's estimate
is unusable the generation's step model, v4's roofline-eta, else the roofline plus ICI;
plus DCN) with the roofline's
two figures beside it, ICI hidden behind compute ("overlapped") and after it ("serial";
see [aot-and-planning](aot-and-planning.md#plan-comet-methodology)), MFU (analytic
FLOPs over chips x peak x step), steps (`config.plan.steps_to_target`, else the step budget),
time to train = steps x step, chip-hours and dollars at the list price
(`parallel/hardware.py`; on a generation with no measured run, the step and time to
train read "not validated" and MFU, chip-hours and price "-", as in `launch.plan`'s
table), Google's published v0.7 figures for the v3 rows with the
ratio of the estimate to them, and the wall
time of the row's command (its own process, alone on the machine).
"""


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    """The page: title and column notes, `header`, then the table (one line per row)."""
    models = (
        "Step model per generation ([measured bands](results/tpu-estimates-vs-measured.md)): "
        + "; ".join(f"{g}: {step_model.validation_label(g)}" for g in GENERATIONS)
    )
    lines = [INTRO, header, "", models + ".", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"
