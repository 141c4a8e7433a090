"""Compile a config's train and eval steps for a mesh and report memory, FLOPs, collectives.

    python -m launch.inspect --config configs/bert.py:mlperf_v07 --topology v4:16x16x16 \\
        [--mesh data=-1,model=4] [--slices 2] [--json] [--profile 25]

Without --topology the step is compiled for this machine's (fake CPU) devices; with it,
for a TPU slice of any generation libtpu knows (v2, v3, v4, v5e, v5p, v6e) through
libtpu's compiler, no TPU needed; --slices joins that many slices over DCN with `data`
spanning them. Nothing is trained, no data is read and nothing is allocated. The
library is mlperf/inspection.py.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from launch.cli import parse_flags, relax_cpu_collective_timeouts
from mlperf.inspection import inspect_config, table
from mlperf.validate import apply_mesh_override

relax_cpu_collective_timeouts()  # before jax starts its backend (nothing above imports it)

__all__ = ["inspect_config", "table"]


def _define_flags() -> dict[str, Any]:
    """The CLI's flags; defined only when run as a program, so that other entry points
    can import this module without a duplicate --config."""
    return {
        "config": config_flags.DEFINE_config_file(
            "config", None, "Config file, e.g. configs/bert.py:tiny.", lock_config=False
        ),
        "mesh": flags.DEFINE_string("mesh", "", "Mesh override, e.g. data=8,model=1."),
        "topology": flags.DEFINE_string("topology", "", "TPU topology, e.g. v4:16x16x16."),
        "slices": flags.DEFINE_integer("slices", 1, "Slices of --topology joined over DCN."),
        "eval": flags.DEFINE_bool("eval", True, "Also compile the eval step."),
        "layer_estimate": flags.DEFINE_bool(
            "layer_estimate",
            True,
            "Scanned layers: estimate the step from 1- and 2-layer unrolled compiles.",
        ),
        "layer_estimate_method": flags.DEFINE_enum(
            "layer_estimate_method",
            "unrolled",
            ["unrolled", "scan"],
            "Scanned layers: extrapolate from 1- and 2-layer unrolled compiles (unrolled) or "
            "from the scanned program with 1 and 2 layers per iteration (scan).",
        ),
        "json": flags.DEFINE_bool("json", False, "Print one JSON object instead of a table."),
        "profile": flags.DEFINE_integer(
            "profile",
            0,
            "Also list the train step's N heaviest ops by the compiler's per-op cost, "
            "with totals per kind (matmul, elementwise, collective, copy/transpose).",
        ),
    }


_FLAGS: dict[str, Any] = {}


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _FLAGS["config"].value
    if config is None:
        raise app.UsageError("give --config, e.g. configs/bert.py:mlperf_v07.")
    apply_mesh_override(config, _FLAGS["mesh"].value)
    slices = _FLAGS["slices"].value
    if slices > 1 and not _FLAGS["topology"].value:
        raise app.UsageError("--slices needs --topology (e.g. --topology v5e:16x16 --slices 2).")
    from mlperf.validate import ConfigError
    from parallel.mesh import MeshShapeError
    from parallel.topology import TopologyError

    try:
        report = inspect_config(
            config,
            topology=_FLAGS["topology"].value,
            eval_step=_FLAGS["eval"].value,
            layer_estimate=_FLAGS["layer_estimate"].value and _FLAGS["layer_estimate_method"].value,
            slices=slices,
            profile=_FLAGS["profile"].value,
        )
    except (TopologyError, ConfigError, MeshShapeError, ValueError) as e:
        # One line naming what is wrong (absl's UsageError would add the whole help).
        print(f"multipod: error: {str(e).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(report, indent=2) if _FLAGS["json"].value else table(report))


if __name__ == "__main__":
    _FLAGS.update(_define_flags())
    app.run(main, flags_parser=parse_flags)
