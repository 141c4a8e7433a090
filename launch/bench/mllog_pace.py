"""Per-step pace of MLPerf result logs: host dispatch against the device's own pace.

    python -m launch.bench.mllog_pace result_0.txt [result_1.txt ...]

Prints one row per log and the medians; the library is mlperf/mllog_pace.py.
"""

from __future__ import annotations

import statistics
import sys

from mlperf.mllog_pace import step_pace


def main(paths: list[str]) -> int:
    if not paths:
        print("multipod: error: give one or more MLPerf result logs.", file=sys.stderr)
        return 2
    rows = []
    print(f"{'log':<40}{'dispatch ms/step':>18}{'device ms/step':>16}{'run s':>8}")
    for path in paths:
        try:
            with open(path) as f:
                pace = step_pace(f.read())
        except OSError as e:
            print(f"multipod: error: cannot read {path}: {e.strerror}", file=sys.stderr)
            return 2
        rows.append(pace)
        cells = [pace.get(k) for k in ("dispatch_ms_per_step", "device_ms_per_step", "run_s")]
        text = ["-" if v is None else f"{v:.1f}" for v in cells]
        print(f"{path[-40:]:<40}{text[0]:>18}{text[1]:>16}{text[2]:>8}")
    for key in ("dispatch_ms_per_step", "device_ms_per_step"):
        values = [r[key] for r in rows if key in r]
        if values:
            print(f"median {key}: {statistics.median(values):.1f} over {len(values)} logs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
