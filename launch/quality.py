"""Time-to-accuracy runs for CI and the README: `python -m launch.quality --runs bert:tiny`.

Each run is `launch.train` in its own process (clean JAX state, streamed output); the
closing table lists target, reached or not, time to target and wall time. Exits
non-zero if any run misses its target.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

from absl import app, flags

from launch.cli import train_command

_RUNS = flags.DEFINE_list("runs", ["bert:tiny"], "benchmark:variant pairs.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/multipod/quality", "Parent work directory.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", "", "Real data folder (e.g. ../shared/data) for variants that read files."
)
_EXTRA = flags.DEFINE_multi_string("override", [], "Extra --config.x=y overrides for every run.")


def run_one(benchmark: str, variant: str, workdir: str, data_dir: str, extra: list[str]) -> dict:
    """Runs one config to its target in a subprocess; returns its result.json (or a failure)."""
    cmd = train_command(f"{benchmark}:{variant}", workdir, data_dir, *extra)
    print(f"\n=== {benchmark}:{variant}: {' '.join(cmd[1:])}", flush=True)
    start = time.time()
    result_path = os.path.join(workdir, "result.json")
    # A fresh start: a left-over checkpoint would make launch.train resume the old run.
    shutil.rmtree(workdir, ignore_errors=True)
    code = subprocess.call(cmd)
    wall = time.time() - start
    if not os.path.exists(result_path):
        return {
            "run": f"{benchmark}:{variant}",
            "reached_target": False,
            "wall_s": wall,
            "error": f"exit code {code}, no result.json",
        }
    with open(result_path) as f:
        result = json.load(f)
    result.update(run=f"{benchmark}:{variant}", wall_s=wall)
    return result


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    results = []
    for spec in _RUNS.value:
        benchmark, _, variant = spec.partition(":")
        workdir = os.path.join(_WORKDIR.value, f"{benchmark}_{variant}")
        results.append(run_one(benchmark, variant, workdir, _DATA_DIR.value, _EXTRA.value))
    print("\n| run | target | reached | time to target | final | wall |")
    print("|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['run']} | - | no ({r['error']}) | - | - | {r['wall_s']:.0f} s |")
            continue
        ttt = f"{r['time_to_target_s']:.0f} s" if r["reached_target"] else "-"
        final = r["eval"].get(r["target_metric"])
        print(
            f"| {r['run']} | {r['target_metric']} >= {r['target']} | "
            f"{'yes' if r['reached_target'] else 'NO'} | {ttt} | {final:.4f} | "
            f"{r['wall_s']:.0f} s |"
        )
    os.makedirs(_WORKDIR.value, exist_ok=True)
    with open(os.path.join(_WORKDIR.value, "quality.json"), "w") as f:
        json.dump(results, f, indent=2)
    if not all(r.get("reached_target") for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    app.run(main)
