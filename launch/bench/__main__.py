"""`python -m launch.bench.step`: names the tools (each is its own module)."""

import sys

from launch import bench

print(
    f"multipod: error: name a tool, e.g. python -m launch.bench.step --config ...\n{bench.__doc__}",
    file=sys.stderr,
)
raise SystemExit(2)
