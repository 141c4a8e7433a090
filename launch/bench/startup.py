"""`python -m launch.bench.startup`: time to MLPerf's `run_start`, first run against a repeat.

    python -m launch.bench.startup [--startup_configs bert:tiny,transformer:tiny]
        [--data_dir DIR] [--json]

Each config is started twice with `launch.train` in its own process, both times on the same
fresh persistent compilation cache (mlperf/compilation_cache.py): the first run compiles
and writes the cache, the repeat should load every program from it. A run is stopped as
soon as its MLPerf log has `run_start`, so only start-up is timed: from process launch to
`run_start` (imports, data preparation, init and compile) and the log's own
`init_start` -> `run_start`. The cache entries each run added show whether the repeat
compiled anything.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from absl import flags

from launch.bench.common import print_rows, run
from launch.cli import train_command, usage_error
from mlperf import mllog_pace

DEFAULT_CONFIGS = ("bert:tiny", "transformer:tiny", "ssd:tiny", "maskrcnn:tiny")

_CONFIGS = flags.DEFINE_list(
    "startup_configs",
    list(DEFAULT_CONFIGS),
    "benchmark:variant pairs, each started twice on one fresh compilation cache.",
)
_DATA_DIR = flags.DEFINE_string("data_dir", "", "The data folder, for variants that read files.")


def known_config(config: str) -> bool:
    """Whether `config` is a benchmark:variant pair of configs/ (bert:tiny, ...)."""
    benchmark, _, variant = config.partition(":")
    if benchmark not in ("bert", "transformer", "ssd", "maskrcnn"):
        return False
    return variant in importlib.import_module(f"configs.{benchmark}").VARIANTS


def _mllog_times(mllog: Path) -> dict[str, int]:
    """time_ms of init_start and run_start in an MLPerf log (those present so far)."""
    times: dict[str, int] = {}
    if mllog.exists():
        for record in mllog_pace.events(mllog.read_text()):
            if record.get("key") in ("init_start", "run_start"):
                times.setdefault(record["key"], int(record["time_ms"]))
    return times


def _cache_entries(cache_dir: Path) -> int:
    return sum(1 for p in cache_dir.rglob("*") if p.is_file()) if cache_dir.exists() else 0


def time_to_run_start(
    config: str, workdir: Path, cache_dir: Path, data_dir: str, timeout_s: float
) -> dict:
    """Starts `launch.train` on `config`, waits for `run_start` in its log, stops it.

    Returns seconds from launch to run_start (`to_run_start_s`), the log's init_start ->
    run_start (`init_s`) and the cache entries the run added; `error` when the run ended
    or timed out before run_start (with the tail of its output)."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    cmd = train_command(config, str(workdir), data_dir, f"--compilation_cache={cache_dir}")
    entries_before = _cache_entries(cache_dir)
    log_path = workdir / "stdout.txt"
    root = Path(__file__).resolve().parents[2]  # the repository root
    with open(log_path, "w") as log:
        start = time.time()
        proc = subprocess.Popen(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT)
        times: dict[str, int] = {}
        try:
            while "run_start" not in (times := _mllog_times(workdir / "mllog.txt")):
                if proc.poll() is not None or time.time() - start > timeout_s:
                    tail = log_path.read_text()[-600:]
                    why = "ended" if proc.poll() is not None else f"took over {timeout_s:.0f} s"
                    return {"config": config, "error": f"{why} before run_start: {tail}"}
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return {
        "config": config,
        "to_run_start_s": times["run_start"] / 1000 - start,
        "init_s": (times["run_start"] - times.get("init_start", times["run_start"])) / 1000,
        "cache_entries_added": _cache_entries(cache_dir) - entries_before,
    }


def bench(configs: list[str], data_dir: str = "", timeout_s: float = 900.0) -> list[dict]:
    """First run and repeat of each config on one fresh compilation cache per config."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="multipod-startup-") as tmp:
        for config in configs:
            cache = Path(tmp) / config.replace(":", "_") / "xla"
            runs = []
            for attempt in ("first", "repeat"):
                workdir = Path(tmp) / config.replace(":", "_") / attempt
                print(f"[startup] {config}: {attempt} run", file=sys.stderr, flush=True)
                runs.append(time_to_run_start(config, workdir, cache, data_dir, timeout_s))
            first, repeat = runs
            row = {"config": config, "first": first, "repeat": repeat}
            if "error" not in first and "error" not in repeat:
                row["speedup"] = first["to_run_start_s"] / repeat["to_run_start_s"]
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table: time to run_start, init_start -> run_start and cache entries added."""
    lines = [
        "| config | first run: to run_start (init) | repeat: to run_start (init) | "
        "first / repeat | cache entries added (first, repeat) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        first, repeat = r["first"], r["repeat"]
        if "error" in first or "error" in repeat:
            lines.append(
                f"| {r['config']} | {first.get('error', 'ok')} | {repeat.get('error', 'ok')} | | |"
            )
            continue
        lines.append(
            f"| {r['config']} | {first['to_run_start_s']:.1f} s ({first['init_s']:.1f} s) | "
            f"{repeat['to_run_start_s']:.1f} s ({repeat['init_s']:.1f} s) | "
            f"{r['speedup']:.2f}x | {first['cache_entries_added']}, "
            f"{repeat['cache_entries_added']} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    bad = [c for c in _CONFIGS.value if not known_config(c)]
    if bad:
        usage_error(
            f"--startup_configs: unknown {', '.join(bad)}; give benchmark:variant pairs such "
            "as bert:tiny or transformer:multi30k."
        )
    print_rows(bench(_CONFIGS.value, _DATA_DIR.value), table)


if __name__ == "__main__":
    run(main)
