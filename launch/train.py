"""Train one benchmark config: `python -m launch.train --config configs/bert.py:tiny --workdir W`.

Overrides: `--config.train.steps=100`. Multi-host (one process per host) joins
`jax.distributed` first: on Cloud TPU with no arguments, on CPU with an explicit
coordinator (`--coordinator 127.0.0.1:PORT --num_processes N --process_id I`, or the
MULTIPOD_COORDINATOR / MULTIPOD_NUM_PROCESSES / MULTIPOD_PROCESS_ID variables).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/bert.py:tiny.", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where the MLPerf log, result.json and checkpoints go.", required=True
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator",
    os.environ.get("MULTIPOD_COORDINATOR"),
    "host:port of process 0 for jax.distributed (CPU multi-process).",
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes",
    int(os.environ.get("MULTIPOD_NUM_PROCESSES", "1")),
    "Number of processes in the run.",
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", int(os.environ.get("MULTIPOD_PROCESS_ID", "0")), "This process's index."
)
_TPU_POD = flags.DEFINE_bool(
    "tpu_pod",
    False,
    "Call jax.distributed.initialize() with no arguments (Cloud TPU VM pods discover their peers).",
)


def _init_distributed() -> None:
    import jax

    if _TPU_POD.value:
        jax.distributed.initialize()
    elif _NUM_PROCESSES.value > 1:
        if not _COORDINATOR.value:
            raise app.UsageError("--num_processes > 1 needs --coordinator host:port.")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            _COORDINATOR.value,
            num_processes=_NUM_PROCESSES.value,
            process_id=_PROCESS_ID.value,
            initialization_timeout=120,
        )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    _init_distributed()
    from mlperf.train import run

    try:
        result = run(_CONFIG.value, _WORKDIR.value)
    except (ValueError, FileNotFoundError) as e:
        # Bad input (config values, data files): one clear line, no traceback.
        if os.environ.get("MULTIPOD_DEBUG"):
            raise
        print(f"multipod: error: {e}\n(set MULTIPOD_DEBUG=1 for the traceback)", file=sys.stderr)
        raise SystemExit(2) from None
    if not result["reached_target"] or result["status"] != "success":
        raise SystemExit(1)


if __name__ == "__main__":
    app.run(main)
