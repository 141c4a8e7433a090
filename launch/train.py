"""Train one benchmark config: `python -m launch.train --config configs/bert.py:tiny --workdir W`.

Overrides: `--config.train.steps=100`. Multi-host (one process per host, the same
command on every host) joins `jax.distributed` first: on Cloud TPU VM pods with
`--tpu_pod`, on CPU with `--coordinator 127.0.0.1:PORT --num_processes N --process_id I`
(or MULTIPOD_COORDINATOR / MULTIPOD_NUM_PROCESSES / MULTIPOD_PROCESS_ID, which
`launch.local` sets).
"""

from __future__ import annotations

import os
import sys
import traceback

from absl import app, flags
from ml_collections import config_flags

from launch.cli import relax_cpu_collective_timeouts
from launch.distributed import DistributedSetupError, init_distributed

relax_cpu_collective_timeouts()  # before jax starts its backend

# 128 + the signal, as if it had ended the process (the checkpoint is written first).
PREEMPTED_EXIT_CODES = {"SIGTERM": 143, "SIGINT": 130}

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/bert.py:tiny.", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where the MLPerf log, result.json and metrics go.", required=True
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator", os.environ.get("MULTIPOD_COORDINATOR"), "host:port of process 0 (CPU runs)."
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", int(os.environ.get("MULTIPOD_NUM_PROCESSES", "1")), "Processes in the run."
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", int(os.environ.get("MULTIPOD_PROCESS_ID", "0")), "This process's index."
)
_TPU_POD = flags.DEFINE_bool(
    "tpu_pod", False, "Cloud TPU VM pod: jax.distributed.initialize() discovers the peers."
)
_PROFILE_STEPS = flags.DEFINE_string(
    "profile_steps", "", "'a:b': write a jax.profiler trace of steps a..b-1 into WORKDIR/profile."
)
_ALLOW_CONFIG_CHANGE = flags.DEFINE_list(
    "allow_config_change",
    [],
    "Resume even though these config keys (dotted, comma-separated) differ from the "
    "checkpoint's in a way that alters the training trajectory; recorded in the MLPerf log "
    "and result.json. See docs/reliability.md.",
)
_INIT_TIMEOUT = flags.DEFINE_integer(
    "init_timeout_s", 300, "Seconds to wait for every process to join before failing."
)


def _fail(message: str, workdir: str | None) -> None:
    where = "set MULTIPOD_DEBUG=1 to raise it"
    if workdir:
        # Keep the traceback for bugs that surface as ValueError, without burying the message.
        path = os.path.join(workdir, "error.txt")
        try:
            os.makedirs(workdir, exist_ok=True)
            with open(path, "w") as f:
                f.write(traceback.format_exc())
            where = f"traceback in {path}; {where}"
        except OSError:  # the error may be that the workdir cannot be written
            pass
    print(f"multipod: error: {message}\n({where})", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        init_distributed(
            _COORDINATOR.value,
            _NUM_PROCESSES.value,
            _PROCESS_ID.value,
            _TPU_POD.value,
            _INIT_TIMEOUT.value,
        )
        from mlperf.checkpoint import configure_checkpointing
        from mlperf.train import run

        configure_checkpointing()  # process-wide orbax settings, once, after distributed
        result = run(
            _CONFIG.value,
            _WORKDIR.value,
            profile_steps=_PROFILE_STEPS.value,
            allow_config_change=_ALLOW_CONFIG_CHANGE.value,
        )
    except KeyboardInterrupt:
        # Ctrl-C before training started (or a second one): nothing new to save.
        print(
            "multipod: interrupted (Ctrl-C) without a checkpoint of the current step; the "
            "same command continues from the newest checkpoint, if any.",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    except (ValueError, FileNotFoundError, DistributedSetupError) as e:
        # Bad input (config values, data files, cluster coordinates): one clear line.
        if os.environ.get("MULTIPOD_DEBUG"):
            raise
        _fail(str(e), _WORKDIR.value)
    if result["status"] == "preempted":  # checkpoint written: run the command again
        raise SystemExit(PREEMPTED_EXIT_CODES.get(result["stop_signal"], 143))
    if not result["reached_target"] or result["status"] != "success":
        raise SystemExit(1)


if __name__ == "__main__":
    app.run(main)
