"""`python -m launch.bench.input`: does each host's input pipeline keep up at pod pace?

    python -m launch.bench.input --fixture_dir /tmp/multipod-input [--coco_dir DIR]
        [--input_models bert,transformer,ssd,maskrcnn] [--input_generations v3,v4,v5p]
        [--timed_batches 20] [--min_seconds 5] [--grain_workers 2] [--fixture_records 256]
        [--tpu_table docs/results/tpu-table-rows.json] [--overhead_steps 50]
        [--steps_per_dispatch 1,8] [--as_json]

For every `mlperf_v07` config and TPU generation it prints the examples one host must
deliver per second at the estimated step time of the TPU table (its rows file,
docs/results/tpu-table-rows.json: each row's chips, mesh and estimated step), the CPU
cores that takes at the rate measured here per core, and that against the host's vCPUs.
A host feeds the rows of its devices: global batch / min(hosts, data axis) examples a
step (hosts = chips / 4; where the model axis spans hosts, each of them loads the same
rows).

The per-core rate is the model's real per-host loader (launch/bench/input_data.py:
TFRecord reads and Example parsing, packing, JPEG decode and augmentation, mask
rasterisation, grain batching) timed over `--timed_batches` host batches (and at least
`--min_seconds`) in this process pinned to one CPU, and again with `--grain_workers`
worker processes (their rate over the cores they use); the smaller of the two per-core
figures is the one used. The host-side cost of the train loop itself
(launch/bench/input_overhead.py) is printed against 5% of each estimated step, per step,
once for each of `--steps_per_dispatch` (`train.steps_per_dispatch`: the loop's own
multi-step dispatch, its host work paid once per that many steps).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
from pathlib import Path

from absl import app, flags

from input_pipeline.input_errors import InputError
from launch.bench.input_data import MODELS, mlperf_config, train_iterator, write_fixtures

ROOT = Path(__file__).resolve().parents[2]
# A TPU VM host's vCPUs. v5p: the Cloud TPU v5p page's VM, host and slice properties (208,
# half of them within one NUMA node). v4 240 and v3 96: the TPU VM shapes as usually
# quoted, not checked here against a Google page. Each host has 4 chips.
HOST_VCPUS = {"v3": 96, "v4": 240, "v5p": 208}
CHIPS_PER_HOST = 4
MAX_SHARE = 0.5  # the goal: input takes at most half a host's cores

FIXTURE_DIR = flags.DEFINE_string(
    "fixture_dir", "", "Folder for the generated input files (written where missing)."
)
COCO_DIR = flags.DEFINE_string(
    "coco_dir",
    "",
    "A COCO-format folder of real JPEGs (annotations/instances_train2017.json, "
    "images/train2017/) for SSD and Mask R-CNN; empty: generated images.",
)
INPUT_MODELS = flags.DEFINE_list("input_models", list(MODELS), "Models to measure.")
INPUT_GENERATIONS = flags.DEFINE_list(
    "input_generations", list(HOST_VCPUS), "TPU generations to print rows for."
)
TPU_TABLE = flags.DEFINE_string(
    "tpu_table",
    str(ROOT / "docs" / "results" / "tpu-table-rows.json"),
    "The TPU table's rows (chips, mesh, estimated step per model and generation).",
)
TIMED_BATCHES = flags.DEFINE_integer("timed_batches", 20, "Host batches timed per measurement.")
MIN_SECONDS = flags.DEFINE_float("min_seconds", 5.0, "Seconds each measurement lasts at least.")
GRAIN_WORKERS = flags.DEFINE_integer(
    "grain_workers", 2, "Grain worker processes for the second measurement (0: skip it)."
)
FIXTURE_RECORDS = flags.DEFINE_integer(
    "fixture_records", 256, "Records per generated TFRecord file (images: a quarter)."
)
OVERHEAD_STEPS = flags.DEFINE_integer(
    "overhead_steps", 50, "Stubbed train-loop steps timed for the host overhead (0: skip)."
)
STEPS_PER_DISPATCH = flags.DEFINE_list(
    "steps_per_dispatch",
    ["1"],
    "Train steps per dispatch to time the loop's host work at (train.steps_per_dispatch), "
    "a row each.",
)
AS_JSON = flags.DEFINE_bool("as_json", False, "Print JSON instead of markdown tables.")


class InputBenchError(ValueError):
    """Bad flags or a TPU table without the needed rows: one line for the user."""


@dataclasses.dataclass(frozen=True)
class PodRow:
    """One model on one generation, from the TPU table."""

    model: str
    generation: str
    chips: int
    data: int  # the mesh's data axis
    step_ms: float  # the estimated step


def read_tpu_table(path: str) -> dict[tuple[str, str], PodRow]:
    """(model, generation) -> PodRow, from the TPU table's rows file (one JSON row per
    compile: model, generation, chips, mesh, step_s); rows without a step are left out."""
    if not os.path.isfile(path):
        raise InputBenchError(
            f"--tpu_table {path!r} not found; give docs/results/tpu-table-rows.json"
        )
    try:
        with open(path) as f:
            entries = json.load(f)["rows"]
    except (ValueError, KeyError, TypeError) as e:
        raise InputBenchError(f"--tpu_table {path!r} is not a TPU table rows file ({e})") from None
    rows: dict[tuple[str, str], PodRow] = {}
    for e in entries:
        data = re.search(r"data=(\d+)", str(e.get("mesh", "")))
        if e.get("variant") == "mlperf_v07" and data and e.get("step_s") and e.get("chips"):
            row = PodRow(
                e["model"], e["generation"], int(e["chips"]), int(data[1]), 1e3 * e["step_s"]
            )
            rows[(row.model, row.generation)] = row
    if not rows:
        raise InputBenchError(f"--tpu_table {path!r} has no mlperf_v07 row with chips, mesh, step")
    return rows


def host_batch(global_batch: int, chips: int, data: int) -> int:
    """Examples one host loads a step: its devices' rows. Hosts holding distinct rows are
    min(hosts, data); where the model axis spans hosts they load the same rows."""
    hosts = chips // CHIPS_PER_HOST
    return math.ceil(global_batch / min(hosts, data))


@dataclasses.dataclass(frozen=True)
class Measured:
    """A model's loader rates here."""

    model: str
    batch: int  # host batch timed
    in_process: float  # examples/s, one process (one core)
    workers: int
    with_workers: float  # examples/s with `workers` grain processes (0: not measured)

    @property
    def per_core(self) -> float:
        """The smaller per-core rate of the two runs (workers share this host's cores)."""
        rates = [self.in_process]
        if self.workers:
            rates.append(self.with_workers / min(self.workers, len(os.sched_getaffinity(0))))
        return min(rates)


def time_loader(
    iterator, batches: int, batch: int, warmup: int = 1, min_seconds: float = 0.0
) -> float:
    """Examples/s over at least `batches` batches and `min_seconds`, after `warmup`
    batches (threads and workers start, prefetch buffers fill)."""
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    done = 0
    while done < batches or time.perf_counter() - start < min_seconds:
        next(iterator)
        done += 1
    return done * batch / (time.perf_counter() - start)


def measure(
    model: str,
    batch: int,
    batches: int,
    workers: int,
    fixture_dir: str,
    coco: str,
    min_seconds: float = 0.0,
):
    """The model's loader rate in process, pinned to one CPU (its reader threads share
    it), and with `workers` grain workers on all of this process's CPUs."""
    rates = []
    cpus = os.sched_getaffinity(0)
    for count in (0, workers) if workers else (0,):
        if not count:
            os.sched_setaffinity(0, {min(cpus)})
        try:
            it = train_iterator(model, fixture_dir, coco, batch, count)
            rates.append(time_loader(it, batches, batch, 1 + 2 * count, min_seconds))
            del it  # stops its workers
        finally:
            os.sched_setaffinity(0, cpus)
    return Measured(model, batch, rates[0], workers, rates[1] if workers else 0.0)


@dataclasses.dataclass(frozen=True)
class Row:
    """What one host needs on one generation, against its cores."""

    model: str
    generation: str
    chips: int
    host_batch: int
    step_ms: float
    needed: float  # examples/s a host must deliver
    per_core: float  # examples/s one core delivers here
    cores: float  # needed / per_core
    host_vcpus: int

    @property
    def share(self) -> float:
        return self.cores / self.host_vcpus

    @property
    def ok(self) -> bool:
        return self.share <= MAX_SHARE


def pod_rows(
    measured: dict[str, Measured], table: dict[tuple[str, str], PodRow], generations: list[str]
) -> list[Row]:
    """One row per measured model and generation; a missing TPU-table row is an error."""
    rows = []
    for model, m in measured.items():
        global_batch = int(mlperf_config(model).train.global_batch_size)
        for gen in generations:
            pod = table.get((model, gen))
            if pod is None:
                raise InputBenchError(
                    f"the TPU table has no {model} row on {gen} with an estimated step"
                )
            batch = host_batch(global_batch, pod.chips, pod.data)
            needed = batch / (pod.step_ms / 1e3)
            rows.append(
                Row(model, gen, pod.chips, batch, pod.step_ms, needed, m.per_core,
                    needed / m.per_core, HOST_VCPUS[gen])
            )  # fmt: skip
    return rows


def check_flags(models: list[str], generations: list[str]) -> None:
    """One-line errors for bad flag values, before anything is built."""
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise InputBenchError(f"--input_models: unknown {bad}; use some of {', '.join(MODELS)}")
    bad = [g for g in generations if g not in HOST_VCPUS]
    if bad:
        raise InputBenchError(
            f"--input_generations: unknown {bad}; use some of {', '.join(HOST_VCPUS)}"
        )
    if not FIXTURE_DIR.value:
        raise InputBenchError("--fixture_dir is required: a folder for the generated inputs")
    for name, value in (("timed_batches", TIMED_BATCHES.value),):
        if value < 1:
            raise InputBenchError(f"--{name} must be at least 1, got {value}")
    if min(GRAIN_WORKERS.value, OVERHEAD_STEPS.value, MIN_SECONDS.value) < 0:
        raise InputBenchError("--grain_workers, --overhead_steps and --min_seconds must be >= 0")
    dispatch_steps(STEPS_PER_DISPATCH.value)
    if FIXTURE_RECORDS.value < 8:
        raise InputBenchError(f"--fixture_records must be at least 8, got {FIXTURE_RECORDS.value}")


def dispatch_steps(values: list[str]) -> list[int]:
    """--steps_per_dispatch as integers >= 1 (a one-line error otherwise)."""
    try:
        ks = [int(v) for v in values]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise InputBenchError(
            f"--steps_per_dispatch must be integers >= 1 (e.g. 1,8), got {','.join(values)!r}"
        )
    return ks


def markdown(measured: list[Measured], rows: list[Row], overhead: list) -> str:
    """The three tables: loader rates, per-host needs, host overhead."""
    out = [
        "| model | host batch timed | in process (1 core) | grain workers | per core used |",
        "|---|---|---|---|---|",
    ]
    for m in measured:
        workers = f"{m.with_workers:.1f}/s ({m.workers} workers)" if m.workers else "-"
        out.append(
            f"| {m.model} | {m.batch} | {m.in_process:.1f}/s | {workers} | {m.per_core:.1f}/s |"
        )
    out += [
        "",
        "| model | generation (chips) | host batch | est. step | needed per host | cores "
        "needed | host vCPUs | share | within half |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r.model} | {r.generation} ({r.chips}) | {r.host_batch} | {r.step_ms:.2f} ms | "
            f"{r.needed:.0f}/s | {r.cores:.1f} | {r.host_vcpus} | {r.share:.1%} | "
            f"{'yes' if r.ok else '**no**'} |"
        )
    if overhead:
        out += ["", *overhead_markdown(overhead)]
    return "\n".join(out)


def overhead_markdown(overhead: list) -> list[str]:
    """The host-overhead table: measured host time per step, at each row's steps per
    dispatch, against 5% of each step."""
    from launch.bench.input_overhead import BUDGET

    out = [
        "| model | steps per dispatch | host batch (bytes) | state leaves | dispatch | "
        "host-to-device | logging / step | total | "
        f"{BUDGET:.0%} of est. step ({' / '.join(overhead[0].budgets_s)}) | within "
        "| steps per dispatch to fit | stub run (not counted) "
        "| host-to-device, rows whole (baseline) | sent to devices a step (rows whole) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in overhead:
        budgets = " / ".join(f"{b * 1e6:.0f} us" for b in o.budgets_s.values())
        within = "yes" if all(o.total_s <= b for b in o.budgets_s.values()) else "**no**"
        whole = (
            "- (nothing split)"
            if o.transfer_whole_s is None
            else f"{o.transfer_whole_s * 1e6:.0f} us ({o.transfer_whole_s / o.transfer_s:.2f}x)"
        )
        sent = f"{o.device_bytes / 2**20:.1f} MiB"
        if o.device_bytes_whole is not None:
            sent += f" ({o.device_bytes_whole / 2**20:.1f} MiB)"
        out.append(
            f"| {o.model} | {o.steps_per_dispatch} | {o.host_batch} "
            f"({o.batch_bytes / 2**20:.1f} MiB) | {o.state_leaves} | "
            f"{o.dispatch_s * 1e6:.0f} us | {o.transfer_s * 1e6:.0f} us | "
            f"{o.logging_s * 1e6:.0f} us | {o.total_s * 1e6:.0f} us | {budgets} | {within} | "
            f"{o.steps_per_call} | {o.stub_device_s * 1e6:.0f} us | {whole} | {sent} |"
        )
    return out


def as_json(measured: list[Measured], rows: list[Row], overhead: list) -> dict:
    """The three tables as JSON-ready dicts, derived figures included."""
    return {
        "measured": [dataclasses.asdict(m) | {"per_core": m.per_core} for m in measured],
        "rows": [dataclasses.asdict(r) | {"share": r.share, "ok": r.ok} for r in rows],
        "overhead": [
            dataclasses.asdict(o) | {"total_s": o.total_s, "steps_per_call": o.steps_per_call}
            for o in overhead
        ],
    }


def run(argv: list[str]) -> None:
    if len(argv) > 1:
        raise InputBenchError(f"unexpected arguments: {argv[1:]}")
    models, generations = INPUT_MODELS.value, INPUT_GENERATIONS.value
    check_flags(models, generations)
    table = read_tpu_table(TPU_TABLE.value)
    fixture_dir = os.path.abspath(os.path.expanduser(FIXTURE_DIR.value))
    write_fixtures(fixture_dir, FIXTURE_RECORDS.value, COCO_DIR.value)
    measured = {}
    for model in models:
        global_batch = int(mlperf_config(model).train.global_batch_size)
        pod = table.get((model, "v3")) or next(p for (m, _), p in table.items() if m == model)
        batch = host_batch(global_batch, pod.chips, pod.data)
        print(f"bench_input: timing {model} at host batch {batch}", file=sys.stderr, flush=True)
        measured[model] = measure(
            model,
            batch,
            TIMED_BATCHES.value,
            GRAIN_WORKERS.value,
            fixture_dir,
            COCO_DIR.value,
            MIN_SECONDS.value,
        )
    rows = pod_rows(measured, table, generations)
    overhead = []
    if OVERHEAD_STEPS.value:
        from launch.bench.input_overhead import measure_overhead

        for model in models:
            steps = {g: table[(model, g)].step_ms / 1e3 for g in generations}
            batch = max(r.host_batch for r in rows if r.model == model)
            for k in dispatch_steps(STEPS_PER_DISPATCH.value):
                overhead.append(measure_overhead(model, batch, OVERHEAD_STEPS.value, steps, k))
    if AS_JSON.value:
        print(json.dumps(as_json(list(measured.values()), rows, overhead), indent=2))
    else:
        print(markdown(list(measured.values()), rows, overhead))


def main(argv: list[str]) -> None:
    """Runs the tool; bad input is one line on stderr and exit code 2."""
    try:
        run(argv)
    except (InputBenchError, InputError, FileNotFoundError) as e:
        print(f"multipod: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    from launch.cli import parse_flags

    app.run(main, flags_parser=parse_flags)
