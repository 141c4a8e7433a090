"""Runs side by side: `python -m launch.report WORKDIR [WORKDIR ...] [--published F,DIR]`.

Reads each run's result.json, MLPerf log (mllog.txt) and metrics.jsonl and prints one
table: benchmark, mesh, devices, time to target, samples/s, MFU, final metric, and the
MLPerf time to train (run_stop - run_start in the log). Writes PNG plots next to the
first run (or into --plots_dir): eval metric against time with the target line, loss
against step, and, for several runs, time to target against device count.

`--published` adds official MLPerf result files of other systems (`result_*.txt` with
`:::MLLOG` lines, e.g. from mlcommons/training_results_v0.7). They are scored the way
the v0.7 result summarizer (mlcommons/logging, mlperf_logging/result_summarizer) does:
per file, minutes = (run_stop - run_start) / 60000 ms; a run whose run_stop status is
not "success" did not converge and is dropped; the system's score is the olympic mean
over its files: drop the fastest and the slowest, or, when one run was dropped, drop
only the fastest (the dropped run stands for the slowest); more than one dropped run
makes the score invalid. Each file's median time per step (from its block_start /
block_stop events) and steps to target are printed under the table.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from absl import app, flags

from input_pipeline import storage

_PUBLISHED = flags.DEFINE_list(
    "published", [], "Official MLPerf result files or folders of them (result_*.txt)."
)
_PLOTS_DIR = flags.DEFINE_string("plots_dir", "", "Where the PNGs go (default: first workdir).")

_MLLOG_LINE = re.compile(r":::MLLOG (\{.*\})\s*$")


# ---- MLPerf logs ---------------------------------------------------------------------------
def read_mllog(path: str) -> list[dict[str, Any]]:
    """The `:::MLLOG {json}` events of a log, in order (other lines, e.g. a host prefix
    before the marker or plain program output, are skipped)."""
    events = []
    text = storage.read_bytes(path).decode("utf-8", errors="replace")
    for line in text.splitlines():
        match = _MLLOG_LINE.search(line)
        if match:
            try:
                events.append(json.loads(match.group(1)))
            except json.JSONDecodeError:
                continue  # a line cut by a crashed writer
    return events


def first_event(events: Iterable[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return next((e for e in events if e.get("key") == key), None)


def time_to_train_ms(events: Sequence[dict[str, Any]]) -> float:
    """run_stop - run_start in ms, from the first of each (as the summarizer reads them)."""
    start, stop = first_event(events, "run_start"), first_event(events, "run_stop")
    if start is None or stop is None:
        missing = "run_start" if start is None else "run_stop"
        raise ValueError(f"{missing} not recorded: the run did not start or did not finish.")
    return float(stop["time_ms"]) - float(start["time_ms"])


def run_status(events: Sequence[dict[str, Any]]) -> str | None:
    """The status in run_stop's metadata ("success" or "aborted"), None without one."""
    stop = first_event(events, "run_stop")
    return None if stop is None else (stop.get("metadata") or {}).get("status")


def olympic_mean(scores: Sequence[float], dropped: int) -> float | None:
    """The v0.7 summarizer's olympic average: without dropped runs, drop min and max;
    with one dropped (non-converged) run, drop only the min; None when nothing is left or
    more than one run was dropped (the summarizer flags that as a critical error)."""
    if dropped > 1:
        return None
    kept = sorted(scores)[1:]
    if dropped == 0:
        kept = kept[:-1]
    return sum(kept) / len(kept) if kept else None


@dataclasses.dataclass
class PublishedScore:
    """One system's score on one benchmark from its result files."""

    org: str
    platform: str
    benchmark: str
    minutes: float | None  # olympic mean; None when invalid
    runs: int
    dropped: int
    files: list[str]


def _value(events, key: str, default: str = "?") -> str:
    e = first_event(events, key)
    return default if e is None else str(e.get("value"))


def _result_files(paths: Sequence[str]) -> list[str]:
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "**", "result_*.txt"), recursive=True))
        elif os.path.exists(p):
            files.append(p)
        else:
            raise FileNotFoundError(f"published result {p!r} does not exist.")
    return files


def summarize_published(paths: Sequence[str]) -> list[PublishedScore]:
    """Scores per (org, platform, benchmark) over the result files found under `paths`."""
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path in _result_files(paths):
        events = read_mllog(path)
        key = (
            _value(events, "submission_org"),
            _value(events, "submission_platform"),
            _value(events, "submission_benchmark"),
        )
        g = groups.setdefault(key, {"scores": [], "dropped": 0, "files": []})
        g["files"].append(path)
        converged = run_status(events) == "success"
        if converged and first_event(events, "run_start") is not None:
            g["scores"].append(time_to_train_ms(events) / 60000.0)
        else:
            g["dropped"] += 1
    return [
        PublishedScore(
            org,
            platform,
            bench,
            olympic_mean(g["scores"], g["dropped"]),
            len(g["files"]),
            g["dropped"],
            g["files"],
        )
        for (org, platform, bench), g in sorted(groups.items())
    ]


# ---- our runs --------------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    """One workdir: result.json, its MLPerf events, and metrics.jsonl entries."""

    workdir: str
    result: dict[str, Any]
    events: list[dict[str, Any]]
    metrics: list[dict[str, Any]]

    @property
    def final_metric(self) -> float | None:
        return self.result.get("eval", {}).get(self.result.get("target_metric"))

    def eval_curve(self) -> tuple[list[float], list[float]]:
        """(seconds since run_start, eval metric) from the MLPerf log's eval_accuracy."""
        start = first_event(self.events, "run_start")
        t0 = float(start["time_ms"]) if start else 0.0
        evals = [e for e in self.events if e.get("key") == "eval_accuracy"]
        return [(float(e["time_ms"]) - t0) / 1000 for e in evals], [
            float(e["value"]) for e in evals
        ]

    def loss_curve(self) -> tuple[list[int], list[float]]:
        train = [m for m in self.metrics if m.get("kind") == "train" and "loss" in m]
        return [m["step"] for m in train], [m["loss"] for m in train]


def load_run(workdir: str) -> Run:
    """Reads a run's workdir; a clear error when it is not a finished run."""
    path = storage.join(workdir, "result.json")
    if not storage.exists(path):
        raise FileNotFoundError(
            f"{path} not found: give the --workdir of a finished launch.train run."
        )
    result = json.loads(storage.read_text(path))
    mllog = storage.join(workdir, "mllog.txt")
    events = read_mllog(mllog) if storage.exists(mllog) else []
    metrics = []
    jsonl = storage.join(workdir, "metrics.jsonl")
    if storage.exists(jsonl):
        lines = storage.read_text(jsonl).splitlines()
        metrics = [json.loads(line) for line in lines if line.strip()]
    return Run(workdir, result, events, metrics)


def run_row(run: Run) -> dict[str, Any]:
    """The table's values for one of our runs."""
    r = run.result
    try:
        mlperf_s = time_to_train_ms(run.events) / 1000
    except ValueError:
        mlperf_s = None
    return {
        "name": os.path.basename(os.path.normpath(run.workdir)),
        "benchmark": f"{r['benchmark']}:{r.get('variant', '')}",
        "mesh": "x".join(f"{k}={v}" for k, v in r.get("mesh", {}).items()) or "-",
        "devices": r.get("devices"),
        "time_to_target_s": r.get("time_to_target_s"),
        "mlperf_time_s": mlperf_s,
        "samples_per_s": r.get("samples_per_s"),
        "mfu": r.get("mfu"),
        "metric": r.get("target_metric"),
        "final_metric": run.final_metric,
        "target": r.get("target"),
    }


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: Sequence[dict[str, Any]], published: Sequence[PublishedScore] = ()) -> str:
    """Our runs and published systems in one fixed-width table (times in seconds)."""
    head = (
        f"{'run / system':<28} {'benchmark':<18} {'mesh':<16} {'devices':>7} "
        f"{'to target s':>11} {'mlperf s':>9} {'samples/s':>10} {'MFU':>7} {'final metric':<24}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        metric = f"{r['metric']} {_fmt(r['final_metric'], '.4f')}" if r["metric"] else "-"
        mfu = f"{100 * r['mfu']:.2f}%" if r["mfu"] is not None else "-"
        lines.append(
            f"{r['name'][:28]:<28} {r['benchmark'][:18]:<18} {r['mesh'][:16]:<16} "
            f"{_fmt(r['devices'], 'd'):>7} {_fmt(r['time_to_target_s'], '.1f'):>11} "
            f"{_fmt(r['mlperf_time_s'], '.1f'):>9} {_fmt(r['samples_per_s'], '.1f'):>10} "
            f"{mfu:>7} {metric:<24}"
        )
    for p in published:
        seconds = None if p.minutes is None else p.minutes * 60
        note = f"olympic mean of {p.runs} runs ({p.dropped} dropped)"
        if p.minutes is None:
            note = f"INVALID: {p.dropped} of {p.runs} runs did not converge"
        lines.append(
            f"{(p.org + ' ' + p.platform)[:28]:<28} {p.benchmark[:18]:<18} {'-':<16} "
            f"{'-':>7} {'-':>11} {_fmt(seconds, '.1f'):>9} {'-':>10} {'-':>7} {note}"
        )
    return "\n".join(lines)


# ---- plots -----------------------------------------------------------------------------------
def write_plots(runs: Sequence[Run], out_dir: str) -> list[str]:
    """eval-vs-time (with target), loss-vs-step, and (2+ runs) time-to-target-vs-devices."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        t, v = run.eval_curve()
        ax.plot(t, v, marker="o", label=os.path.basename(os.path.normpath(run.workdir)))
    targets = {(r.result.get("target_metric"), r.result.get("target")) for r in runs}
    for metric, target in targets:
        if target is not None:
            ax.axhline(target, color="red", linestyle="--", label=f"target {metric} {target}")
    ax.set_xlabel("seconds since run_start")
    ax.set_ylabel("eval metric")
    ax.set_title("Eval metric against time")
    ax.legend(fontsize="small")
    paths.append(_save(fig, os.path.join(out_dir, "eval_vs_time.png")))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        steps, loss = run.loss_curve()
        ax.plot(steps, loss, label=os.path.basename(os.path.normpath(run.workdir)))
    ax.set_xlabel("step")
    ax.set_ylabel("train loss")
    ax.set_title("Loss against step")
    ax.legend(fontsize="small")
    paths.append(_save(fig, os.path.join(out_dir, "loss_vs_step.png")))

    reached = [r for r in runs if r.result.get("time_to_target_s") is not None]
    if len(runs) > 1:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        by_bench: dict[str, list[tuple[int, float]]] = {}
        for r in reached:
            by_bench.setdefault(r.result["benchmark"], []).append(
                (r.result["devices"], r.result["time_to_target_s"])
            )
        for bench, points in sorted(by_bench.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=bench)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices")
        ax.set_ylabel("time to target (s)")
        ax.set_title("Time to target against device count")
        if by_bench:
            ax.legend(fontsize="small")
        paths.append(_save(fig, os.path.join(out_dir, "time_to_target_vs_devices.png")))
    return paths


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def published_steps_text(paths: Sequence[str]) -> str:
    """Per result file: the median time per step over its training blocks and the steps
    to target (`mlperf.planning.published_logs`), what the planner's step time predicts."""
    from mlperf.planning.published_logs import step_summary

    lines = ["published step times (median over block_start/block_stop blocks):"]
    for path in _result_files(paths):
        try:
            s = step_summary(read_mllog(path))
        except ValueError as e:
            lines.append(f"  {path}: {e}")
            continue
        step = "-" if s["step_s"] is None else f"{s['step_s'] * 1e3:.2f} ms/step"
        target = "-" if s["steps_to_target"] is None else f"{s['steps_to_target']:.0f}"
        lines.append(f"  {path}: {step} over {s['blocks']} blocks, {target} steps to target")
    return "\n".join(lines)


def report(workdirs: Sequence[str], published: Sequence[str] = (), plots_dir: str = "") -> str:
    """The table text; writes the plots. Used by main and the tests."""
    if not workdirs and not published:
        raise ValueError("give at least one workdir or --published result file.")
    runs = [load_run(w) for w in workdirs]
    scores = summarize_published(published) if published else []
    text = table([run_row(r) for r in runs], scores)
    if published:
        text += "\n" + published_steps_text(published)
    if runs:
        out = plots_dir or runs[0].workdir
        text += "\nplots: " + ", ".join(write_plots(runs, out))
    return text


def main(argv: list[str]) -> None:
    try:
        print(report(argv[1:], _PUBLISHED.value, _PLOTS_DIR.value))
    except (ValueError, FileNotFoundError) as e:
        raise app.UsageError(str(e)) from None


if __name__ == "__main__":
    app.run(main)
