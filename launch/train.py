"""Train one benchmark config: `python -m launch.train --config configs/bert.py:tiny --workdir W`.

Overrides: `--config.train.steps=100`. Multi-host (one process per host, the same
command on every host) joins `jax.distributed` first: on Cloud TPU VM pods with
`--tpu_pod`, on CPU with `--coordinator 127.0.0.1:PORT --num_processes N --process_id I`
(or MULTIPOD_COORDINATOR / MULTIPOD_NUM_PROCESSES / MULTIPOD_PROCESS_ID, which
`launch.local` sets); under SLURM's srun without those, from the `SLURM_*` variables and
CUDA_VISIBLE_DEVICES (launch/slurm.py).

One run per work directory: a run holds a lease on it (mlperf/lease.py) and a second run
started there is refused with one line naming the holder (exit code 3), or waits up to
`--workdir_wait_s` for it to end. Each host copies its output into
WORKDIR/logs/host_<i>.log (launch/host_log.py).

Exit codes (launch/cli.py, docs/multi-host.md): 0 target reached, 1 the run ended
without reaching its target, 2 bad input (one line, nothing trained), 3 another run holds
the work directory, 4 another process of the run died or never joined, 69 the object
store could not be reached (at start or by a save; nothing lost), 70 an unexpected
error (traceback printed), 143 preempted (checkpoint written; run the same command again).
Bad input is what the project's checks raise as such (`bad_input_errors`), not any
ValueError: one raised inside JAX mid-run is a bug.
"""

from __future__ import annotations

import os
import sys
import traceback

from absl import app, flags

from launch.cli import (
    EXIT_BAD_INPUT,
    EXIT_CRASH,
    EXIT_PREEMPTED,
    EXIT_STORE_UNREACHABLE,
    EXIT_TARGET_NOT_REACHED,
    EXIT_WORKDIR_HELD,
    dump_stacks_on_sigusr1,
    keep_host_memory,
    parse_flags,
    relax_cpu_collective_timeouts,
)
from launch.config_flag import CONFIG
from launch.distributed import DistributedSetupError, PeerLostError, init_distributed
from launch.slurm import SlurmError, in_slurm_task, resolve

relax_cpu_collective_timeouts()  # before jax starts its backend

PREEMPTED_EXIT_CODE = EXIT_PREEMPTED
# 128 + the signal, as if it had ended the process (the checkpoint is written first).
PREEMPTED_EXIT_CODES = {"SIGTERM": 143, "SIGINT": 130}

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
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache",
    None,
    "JAX's persistent compilation cache directory: a repeated or resumed run loads its "
    "compiled steps from there ('' or 'none': off). Default: $MULTIPOD_COMPILATION_CACHE, "
    "else ~/.cache/multipod/xla.",
)
_INIT_TIMEOUT = flags.DEFINE_integer(
    "init_timeout_s", 300, "Seconds to wait for every process to join before failing."
)
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout_s",
    60,
    "Multi-process runs: jax.distributed declares a process dead after this many seconds "
    "without a heartbeat (a hung process; a dead one breaks the next collective at once).",
)
_WORKDIR_WAIT = flags.DEFINE_float(
    "workdir_wait_s",
    0.0,
    "When another live run holds the work directory, wait up to this many seconds for it "
    "to end before refusing to start (0: refuse at once).",
    lower_bound=0.0,
)
# The run's coordinates as used (the flags, or derived from SLURM).
_coordinates = {"num_processes": 1, "process_id": 0}


def _cluster() -> tuple[str | None, int, int, tuple[int, ...] | None]:
    """(coordinator, process count, process id, local GPU ids): the flags or MULTIPOD_*
    variables when given, else SLURM's when srun started this process."""
    given = any(f.present for f in (_COORDINATOR, _NUM_PROCESSES, _PROCESS_ID)) or any(
        name in os.environ
        for name in ("MULTIPOD_COORDINATOR", "MULTIPOD_NUM_PROCESSES", "MULTIPOD_PROCESS_ID")
    )
    if given or _TPU_POD.value or not in_slurm_task(os.environ):
        return _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, None
    try:
        task = resolve(os.environ)
    except SlurmError as e:
        raise DistributedSetupError(str(e)) from None
    print(task.describe(), flush=True)
    return task.coordinator, task.num_processes, task.process_id, task.local_device_ids


def _start_host_log(workdir: str) -> None:
    """Every host's output into WORKDIR/logs/host_<i>.log, once the run holds the
    work directory (mlperf.lease calls this)."""
    import jax

    from launch import host_log

    host_log.start(workdir, jax.process_index())


def bad_input_errors() -> tuple[type[BaseException], ...]:
    """The error types raised where bad input is detected: a config value, a flag, a file
    the config names, the cluster's coordinates or a checkpoint that does not fit. Only
    these end a run with exit code 2 and their one line; any other exception, a
    ValueError from inside JAX included, is a bug (exit code 70, traceback printed)."""
    from input_pipeline.coco_records import CocoFormatError
    from input_pipeline.input_errors import InputError
    from input_pipeline.leveldb_table import TableError
    from input_pipeline.protobuf_wire import WireError
    from input_pipeline.storage import StorageError
    from input_pipeline.subword_vocab import VocabFileError
    from input_pipeline.tf1_checkpoint import CheckpointError
    from input_pipeline.tf_example import ExampleError
    from input_pipeline.tfrecord import TFRecordError
    from mlperf.checkpoint.integrity import CheckpointMismatchError
    from mlperf.checkpoint.manager import NoUsableCheckpointError
    from mlperf.checkpoint.torch_file import TorchFileError
    from mlperf.validate import ConfigError
    from parallel.mesh import MeshShapeError
    from parallel.topology import TopologyError
    from parallel.torus import MeshMappingError

    return (
        ConfigError,  # PreflightError too: the hosts disagree on config, data or checkpoint
        InputError,
        FileNotFoundError,
        DistributedSetupError,
        # An object store that refuses or cannot be reached names the store, the
        # operation and the path.
        StorageError,
        MeshShapeError,
        TopologyError,
        MeshMappingError,
        CheckpointMismatchError,  # ConfigChangeError too
        NoUsableCheckpointError,
        TFRecordError,
        ExampleError,
        CocoFormatError,
        TableError,
        VocabFileError,
        WireError,
        CheckpointError,
        TorchFileError,
    )


def _handle(e: Exception) -> None:
    """Ends the process for an exception out of init or training (never returns)."""
    from mlperf.lease import WorkdirHeldError

    if os.environ.get("MULTIPOD_DEBUG"):
        raise e
    if isinstance(e, WorkdirHeldError):  # nothing written: the work directory is not ours
        print(f"multipod: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_WORKDIR_HELD)
    from input_pipeline.storage import StorageError

    if isinstance(e, StorageError) and e.transient:  # the store did not answer: start again
        print(f"multipod: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_STORE_UNREACHABLE)
    if isinstance(e, bad_input_errors()):  # bad input: one clear line
        print(f"multipod: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_BAD_INPUT)
    # A peer's death surfaces as a failed collective (gloo raises ValueError).
    lost = PeerLostError.from_collective_error(
        e, _coordinates["process_id"], _coordinates["num_processes"]
    )
    if lost is not None:
        lost.exit()
    traceback.print_exception(e)
    print(f"multipod: unexpected error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CRASH)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    dump_stacks_on_sigusr1()
    keep_host_memory()  # when MULTIPOD_KEEP_HOST_MEMORY=1; before jax starts its backend
    try:
        coordinator, num_processes, process_id, local_devices = _cluster()
        _coordinates.update(num_processes=num_processes, process_id=process_id)
        init_distributed(
            coordinator,
            num_processes,
            process_id,
            _TPU_POD.value,
            _INIT_TIMEOUT.value,
            _HEARTBEAT_TIMEOUT.value,
            local_devices,
        )
        from mlperf import compilation_cache, lease
        from mlperf.checkpoint import configure_checkpointing
        from mlperf.train import run

        lease.WAIT_S = _WORKDIR_WAIT.value
        lease.ON_ACQUIRED.append(_start_host_log)

        configure_checkpointing()  # process-wide orbax settings, once, after distributed
        cache = _COMPILATION_CACHE.value
        compilation_cache.enable(compilation_cache.default_directory() if cache is None else cache)
        config = CONFIG.value
        config.lock()  # no key may be added to the run's config after it is read
        result = run(
            config,
            _WORKDIR.value,
            profile_steps=_PROFILE_STEPS.value,
            allow_config_change=_ALLOW_CONFIG_CHANGE.value,
        )
    except PeerLostError as e:
        e.exit()
    except KeyboardInterrupt:
        # Ctrl-C before training started (or a second one): nothing new to save.
        print(
            "multipod: interrupted (Ctrl-C) without a checkpoint of the current step; the "
            "same command continues from the newest checkpoint, if any.",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    except Exception as e:  # noqa: BLE001 - sorted below: bad input, peer lost, or a bug
        _handle(e)
    if result["status"] == "preempted":  # checkpoint written: run the command again
        raise SystemExit(PREEMPTED_EXIT_CODES.get(result["stop_signal"], EXIT_PREEMPTED))
    if result["store_unreachable"]:  # a save found the store gone: nothing lost
        raise SystemExit(EXIT_STORE_UNREACHABLE)
    if not result["reached_target"] or result["status"] != "success":
        raise SystemExit(EXIT_TARGET_NOT_REACHED)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
