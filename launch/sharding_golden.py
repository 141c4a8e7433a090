"""Writes (or checks) the golden sharding tables of every benchmark (mlperf/sharding_table.py).

    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python -m launch.sharding_golden [--check] [--only bert_tiny_cpu8,...]

One JSON file per case in tests/golden/sharding/: each parameter's shape, PartitionSpec
and weight-update PartitionSpec, for the tiny configs on 8 devices and the mlperf_v07
configs on their v0.7 TPU slices (libtpu's topology description; nothing compiles).
With --check nothing is written: the cases whose table differs are listed (exit 1).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from launch.cli import relax_cpu_collective_timeouts

relax_cpu_collective_timeouts()

_CHECK = flags.DEFINE_bool("check", False, "Compare with the files instead of writing them.")
_ONLY = flags.DEFINE_list("only", [], "Case names to run (default: all).")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from mlperf.sharding_table import GOLDEN_CASES, GOLDEN_DIR, golden_record, golden_text

    names = {c.name for c in GOLDEN_CASES}
    unknown = sorted(set(_ONLY.value) - names)
    if unknown:
        raise app.UsageError(f"unknown cases {unknown}; known: {', '.join(sorted(names))}.")
    directory = os.path.join(_REPO, GOLDEN_DIR)
    os.makedirs(directory, exist_ok=True)
    differ = []
    for case in GOLDEN_CASES:
        if _ONLY.value and case.name not in _ONLY.value:
            continue
        record = golden_record(case)
        path = os.path.join(directory, f"{case.name}.json")
        text = golden_text(record)
        if _CHECK.value:
            same = False
            if os.path.exists(path):
                with open(path) as f:
                    same = f.read() == text
            print(f"{case.name}: {'same' if same else 'DIFFERS'}", flush=True)
            if not same:
                differ.append(case.name)
            continue
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path, _REPO)} ({len(record['params'])} parameters)")
    if differ:
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
