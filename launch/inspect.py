"""Compile a config's train step for a mesh and report memory, FLOPs and collectives.

    python -m launch.inspect --config configs/bert.py:tiny [--mesh data=8,model=1] [--json]

Nothing is trained and no data is read: the step is lowered from abstract shapes.
"""

from __future__ import annotations

import json
import time
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from launch.cli import apply_mesh_override, relax_cpu_collective_timeouts

relax_cpu_collective_timeouts()  # before jax starts its backend

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/bert.py:tiny.", lock_config=False
)
_MESH = flags.DEFINE_string("mesh", "", "Mesh override, e.g. data=8,model=1 (axis=size,...).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of a table.")


def inspect_config(config, devices=None) -> dict[str, Any]:
    """Compiles the first phase's train step and returns the report as a dict."""
    from mlperf.train import build_trainer
    from mlperf.train_state import param_count
    from parallel.aot import bytes_per_device, compiled_stats, total_bytes
    from parallel.mesh import mesh_shape

    trainer = build_trainer(config, devices=devices, prepare_data=False)
    phase = trainer.phases[0]
    start = time.perf_counter()
    compiled = trainer.lower_train_step(phase).compile()
    compile_s = time.perf_counter() - start
    stats = compiled_stats(compiled)
    state = trainer.layout.abstract_train_state
    report = {
        "config": f"{config.benchmark}:{config.variant}",
        "params": param_count(trainer.layout),
        "bytes_per_device": {
            "params": bytes_per_device(state["params"]),
            "opt_state": bytes_per_device(state["opt_state"]),
            "temp": stats.get("memory", {}).get("temp", 0),
        },
        "bytes_total": {
            "params": total_bytes(state["params"]),
            "opt_state": total_bytes(state["opt_state"]),
        },
        "flops_per_step": stats["flops"],
        "collectives": stats["collectives"],
        "collective_bytes": stats["collective_bytes"],
        "gather_scatter": stats["gather_scatter"],
        "mesh": mesh_shape(trainer.partitioner.mesh),
        "global_batch_size": phase.global_batch_size,
        "microbatches": config.train.microbatches,
        "compile_time_s": compile_s,
    }
    if "optimal_seconds" in stats:
        report["estimated_step_s"] = stats["optimal_seconds"]
    return report


def _table(report: dict[str, Any]) -> str:
    mib = 1024 * 1024
    rows = [
        ("config", report["config"]),
        ("mesh", " x ".join(f"{k}={v}" for k, v in report["mesh"].items())),
        ("parameters", f"{report['params']:,}"),
        (
            "params / device",
            f"{report['bytes_per_device']['params'] / mib:.2f} MiB "
            f"(of {report['bytes_total']['params'] / mib:.2f} MiB)",
        ),
        (
            "opt state / device",
            f"{report['bytes_per_device']['opt_state'] / mib:.2f} MiB "
            f"(of {report['bytes_total']['opt_state'] / mib:.2f} MiB)",
        ),
        ("temporaries / device", f"{report['bytes_per_device']['temp'] / mib:.2f} MiB"),
        ("FLOPs / step", f"{report['flops_per_step']:.3e} (scan bodies counted once)"),
        ("gather + scatter ops", str(report["gather_scatter"])),
        ("compile time", f"{report['compile_time_s']:.1f} s"),
    ]
    for op, count in report["collectives"].items():
        rows.append((op, f"{count} ops, {report['collective_bytes'][op] / mib:.3f} MiB"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    apply_mesh_override(config, _MESH.value)
    report = inspect_config(config)
    print(json.dumps(report, indent=2) if _JSON.value else _table(report))


if __name__ == "__main__":
    app.run(main)
