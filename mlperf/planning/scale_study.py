"""COMET's design-space study done with the real TPU compiler: BERT encoders of 10B, 100B
and 1T parameters (`configs/bert_scale.py`) on 4096-chip slices of v3, v4 and v5p, over
the tensor-parallel degree and how the optimizer state is kept (FSDP, weight-update
sharding, replicated).

Each point is one planner candidate (`search.evaluate`: the AOT compile, the compiler's
step estimate, the analytic compute / HBM / ICI / DCN split, MFU against the task's
analytic FLOPs; a program out of HBM is extrapolated from 1- and 2-layer compiles and
gets its memory need). Memory expansion is read from the same compiles: the best split
that fits at `hbm_scale` 1.0, 1.6 and 2.0 of the chip's HBM, and how much faster the
larger memory makes the best step (COMET's "up to 1.4x"). `launch.plan --scale_study`
is its command line; each point's row is cached as JSON, so a rerun or a longer budget
only compiles what is missing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from mlperf.planning.search import fmt_pct

HBM_SCALES = (1.0, 1.6, 2.0)
DEFAULT_CACHE = "/tmp/multipod-scale-study"


@dataclasses.dataclass(frozen=True)
class StudyPoint:
    """One split of one model size on one slice."""

    size: str  # a configs/bert_scale.py size
    topology: str
    model: int  # tensor-parallel degree
    mode: str = "fsdp"  # optimizer state: "fsdp", "wus" or "replicated"
    microbatches: int = 1  # gradient accumulation: the same global batch in k pieces

    @property
    def key(self) -> str:
        micro = f"-micro{self.microbatches}" if self.microbatches > 1 else ""
        return f"{self.size}-{self.topology.replace(':', '_')}-model{self.model}-{self.mode}{micro}"


# The 100B model on v4 carries the sweep (tensor parallelism 4..32, the degrees that
# divide its 96 heads, and the three ways to keep the optimizer state); v5p and v3 repeat
# it at model=16 for comparison; 10B brackets it below, 1T (256 heads) above up to
# 256-way tensor parallelism. Listed in the order they are compiled, most telling first,
# so a short --budget_s still answers the main questions; the table sorts them.
DEFAULT_POINTS: tuple[StudyPoint, ...] = (
    *(StudyPoint("100b", "v4:16x16x16", m) for m in (16, 8, 32)),
    StudyPoint("100b", "v4:16x16x16", 16, "replicated"),
    StudyPoint("100b", "v4:16x16x16", 16, "wus"),
    StudyPoint("100b", "v5p:16x16x16", 16),
    StudyPoint("100b", "v3:64x64", 16),
    StudyPoint("10b", "v4:16x16x16", 8),
    *(StudyPoint("1t", "v4:16x16x16", m) for m in (64, 256, 128)),
    # 1T's activations: 4096 sequences over data=16..64 are 64-256 per device at once;
    # gradient accumulation cuts them (the same global batch in 8 microbatches).
    *(StudyPoint("1t", "v4:16x16x16", m, "fsdp", 8) for m in (64, 256)),
    StudyPoint("100b", "v4:16x16x16", 4),
    StudyPoint("100b", "v4:16x16x16", 64),  # does not divide 96 heads: an error row
    StudyPoint("100b", "v5p:16x16x16", 32),
    StudyPoint("10b", "v4:16x16x16", 1),
)
_SIZE_ORDER = {"10b": 0, "100b": 1, "1t": 2}
_MODE_ORDER = {"fsdp": 0, "wus": 1, "replicated": 2}


def parse_points(text: str) -> tuple[StudyPoint, ...]:
    """Points from "size/topology/model[/mode[/microbatches]];...", e.g.
    "100b/v4:16x16x16/16/fsdp". Raises ValueError naming the bad entry and the form."""
    from configs.bert_scale import SIZES

    points = []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        parts = entry.split("/")
        ok = 3 <= len(parts) <= 5 and parts[0] in SIZES and parts[2].isdigit()
        ok = ok and (len(parts) == 3 or parts[3] in ("fsdp", "wus", "replicated"))
        ok = ok and (len(parts) < 5 or parts[4].isdigit() and int(parts[4]) >= 1)
        if not ok or int(parts[2]) < 1:
            raise ValueError(
                f"scale-study point {entry!r} is not size/topology/model[/mode[/microbatches]] "
                f"with size in {tuple(SIZES)}, model >= 1, mode fsdp, wus or replicated and "
                "microbatches >= 1; e.g. 100b/v4:16x16x16/16/fsdp"
            )
        micro = (int(parts[4]),) if len(parts) == 5 else ()
        points.append(StudyPoint(parts[0], parts[1], int(parts[2]), *parts[3:4], *micro))
    if not points:
        raise ValueError("no scale-study points given; e.g. 100b/v4:16x16x16/16/fsdp")
    return tuple(points)


def config_for(point: StudyPoint, num_layers: int | None = None, batch: int | None = None):
    """The bert_scale config of a point's size (optionally with fewer layers and a smaller
    global batch, for small slices and tests)."""
    from configs.bert_scale import get_config

    config = get_config(point.size)
    if num_layers is not None:
        config.model.num_layers = num_layers
    if batch is not None:
        config.train.update(global_batch_size=batch, eval_batch_size=batch)
    return config


def _cache_key(point: StudyPoint, config) -> str:
    """The point plus a digest of its config and the compiler's version: a changed config
    or libtpu never reuses a stale row."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        libtpu = version("libtpu")
    except PackageNotFoundError:
        libtpu = "none"
    digest = hashlib.sha256((config.to_json() + libtpu).encode()).hexdigest()[:12]
    return f"{point.key}-{digest}"


def _cache_path(point: StudyPoint, config, cache_dir: str | None) -> Path | None:
    return Path(cache_dir) / f"{_cache_key(point, config)}.json" if cache_dir else None


def study_row(point: StudyPoint, config, cache_dir: str | None) -> dict[str, Any]:
    """One point's planner row: from the cache when the same config and compiler made it,
    else compiled now (and cached, errors included)."""
    import jax

    from mlperf.planning.search import Candidate, evaluate

    path = _cache_path(point, config, cache_dir)
    if path is not None and path.exists():
        return json.loads(path.read_text())
    remat = bool(config.model.remat)
    cand = Candidate(point.topology, point.model, point.mode, point.microbatches, remat)
    start = time.perf_counter()
    row = evaluate(config, cand, {})
    row.update(size=point.size, params=_params(config), wall_s=time.perf_counter() - start)
    jax.clear_caches()  # the next 4096-device program does not need this one's
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(row, indent=1, default=str))
    return row


def _params(config) -> float:
    """Encoder parameters, 12 x layers x hidden^2 (the size's nominal count)."""
    return 12.0 * config.model.num_layers * config.model.hidden_size**2


def run_study(
    points: tuple[StudyPoint, ...] = DEFAULT_POINTS,
    cache_dir: str | None = DEFAULT_CACHE,
    budget_s: float = 1e7,
    num_layers: int | None = None,
    batch: int | None = None,
) -> list[dict[str, Any]]:
    """Every point's row, compiling what the cache lacks until `budget_s` is spent (the
    rest are rows marked skipped)."""
    start, rows = time.perf_counter(), []
    for point in points:
        config = config_for(point, num_layers, batch)
        path = _cache_path(point, config, cache_dir)
        if not (path and path.exists()) and time.perf_counter() - start > budget_s:
            rows.append({**dataclasses.asdict(point), "skipped": "compile budget spent"})
            continue
        rows.append(study_row(point, config, cache_dir))
    return rows


def memory_expansion(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (size, slice): the fastest split that fits at each of HBM_SCALES (a row fits at
    scale s when its memory need is within s x the chip's HBM), the gain of each scale's
    best over the real HBM's best, and the spread (slowest / fastest step) of the splits
    with a step time, fitting or not."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if "step_s" in r:
            groups.setdefault((r["size"], r["topology"]), []).append(r)
    out = []
    for (size, topology), group in groups.items():
        entry: dict[str, Any] = {"size": size, "topology": topology, "best": {}}
        for scale in HBM_SCALES:
            fit = [r for r in group if r["min_hbm_scale"] <= scale]
            best = min(fit, key=lambda r: r["step_s"]) if fit else None
            entry["best"][scale] = best
        real = entry["best"][HBM_SCALES[0]]
        entry["gain"] = {
            s: (real["step_s"] / b["step_s"] if real and b else None)
            for s, b in entry["best"].items()
        }
        steps = [r["step_s"] for r in group]
        entry["spread"] = max(steps) / min(steps) if len(steps) > 1 else None
        out.append(entry)
    return out


def _split(r: dict[str, Any]) -> str:
    micro = r.get("microbatches", 1)
    return f"model={r['model']} {r['mode']}" + (f" micro={micro}" if micro > 1 else "")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.0f}"


def study_text(rows: list[dict[str, Any]]) -> str:
    """The study's two markdown tables: every point, then memory expansion per slice."""
    head = (
        "| size | slice | split | mem/device | fits (real HBM) | step ms | compute | HBM "
        "| ICI | DCN | MFU | compiled / analytic FLOPs | compile s |"
    )
    lines = [head, "|" + "---|" * 13]
    order = sorted(
        rows,
        key=lambda r: (
            _SIZE_ORDER.get(r["size"], 9),
            r["topology"],
            _MODE_ORDER.get(r["mode"], 9),
            r["model"],
            r.get("microbatches", 1),
        ),
    )
    for r in order:
        lead = f"| {r['size']} | {r['topology']} | {_split(r)} |"
        if "skipped" in r or "error" in r:
            why = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r['error']}"
            lines.append(f"{lead} {why} |" + " |" * 9)
            continue
        mem = r.get("memory_per_device")
        mem_txt = "-" if mem is None else f"{mem / (1 << 30):.1f} GiB"
        if "step_s" not in r:
            lines.append(f"{lead} {mem_txt} | NO ({r.get('note')}) |" + " |" * 8)
            continue
        fits = "yes" if r["min_hbm_scale"] <= 1.0 else f"NO (x{r['min_hbm_scale']:.2f})"
        ratio = "-" if r.get("flops_vs_analytic") is None else f"{r['flops_vs_analytic']:.2f}"
        lines.append(
            f"{lead} {mem_txt} | {fits} | {_ms(r['step_s'])} | {_ms(r['compute_s'])} | "
            f"{_ms(r['memory_s'])} | {_ms(r['comm_s'] - r['dcn_s'])} | {_ms(r['dcn_s'])} | "
            f"{fmt_pct(r.get('mfu'))} | {ratio} | {r.get('wall_s', 0):.0f} |"
        )
    lines += [
        "",
        "Memory expansion (the fastest split that fits each HBM size; gain = the real HBM's "
        "best step / this one's):",
        "",
        "| size | slice | "
        + " | ".join(f"best at {s:g}x HBM" for s in HBM_SCALES)
        + " | gain at "
        + " / ".join(f"{s:g}x" for s in HBM_SCALES[1:])
        + " | spread of splits (slowest / fastest step) |",
        "|" + "---|" * (3 + len(HBM_SCALES)) + "---|",
    ]
    for e in memory_expansion(rows):
        bests = [
            f"{_split(b)}, {_ms(b['step_s'])} ms" if b else "none fits" for b in e["best"].values()
        ]
        gains = " / ".join(
            "-" if e["gain"][s] is None else f"{e['gain'][s]:.2f}x" for s in HBM_SCALES[1:]
        )
        spread = "-" if e["spread"] is None else f"{e['spread']:.1f}x"
        lines.append(
            f"| {e['size']} | {e['topology']} | " + " | ".join(bests) + f" | {gains} | {spread} |"
        )
    return "\n".join(lines)
