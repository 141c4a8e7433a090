"""Helpers shared by the launch/ entry points (no flag definitions here)."""

from __future__ import annotations

import difflib
import faulthandler
import glob
import importlib.util
import os
import signal
import sys
from collections.abc import MutableMapping

from absl import flags

# Exit codes of launch.train; launch.local reads them to say what happened to a process.
EXIT_TARGET_REACHED = 0
EXIT_TARGET_NOT_REACHED = 1  # the run ended (step budget or abort) below its target
EXIT_BAD_INPUT = 2  # config, flags, data files or cluster coordinates: one line, nothing trained
EXIT_WORKDIR_HELD = 3  # another run holds the work directory (mlperf/lease.py): one line
EXIT_PEER_LOST = 4  # another process of the run died or never joined; this one stopped itself
# The object store could not be reached (at start, or by a checkpoint save): nothing lost,
# the same command continues once it answers (sysexits' EX_UNAVAILABLE).
EXIT_STORE_UNREACHABLE = 69
EXIT_CRASH = 70  # an unexpected error (a bug): the traceback is printed
EXIT_STALLED = 75  # launch.local: no process printed for --stall_s seconds (stacks printed)
EXIT_PREEMPTED = 143  # SIGTERM/Ctrl-C: checkpoint written, run the same command again

# Fake CPU devices run as threads. On a loaded 2-core machine one of them can be
# descheduled for longer than XLA's default 40 s collective rendezvous limit, which
# aborts the whole process; a slow machine should make a run slow, not kill it.
CPU_COLLECTIVE_TIMEOUT_FLAGS = (
    "--xla_cpu_collective_call_terminate_timeout_seconds=1800",
    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=300",
)


def train_command(config: str, workdir: str, data_dir: str = "", *extra: str) -> list[str]:
    """`python -m launch.train` argv for a benchmark:variant pair (bert:tiny), with the real
    data folder as an absolute `--config.data.data_dir` when given."""
    benchmark, _, variant = config.partition(":")
    cmd = [
        sys.executable,
        "-m",
        "launch.train",
        f"--config=configs/{benchmark}.py:{variant}",
        f"--workdir={workdir}",
        *extra,
    ]
    if data_dir:
        from input_pipeline import storage

        cmd.append(f"--config.data.data_dir={storage.resolve(data_dir)}")  # or a gs:// URL
    return cmd


def dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints every thread's Python stack to stderr and the process
    goes on: a run that stalls says where it waits, even inside a blocked XLA call.
    launch.local sends it to every process of a run that stopped printing."""
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def relax_cpu_collective_timeouts(env: MutableMapping[str, str] = os.environ) -> None:
    """Adds CPU_COLLECTIVE_TIMEOUT_FLAGS to env['XLA_FLAGS'] (before jax starts)."""
    flags = env.get("XLA_FLAGS", "").split()
    names = {f.split("=")[0] for f in flags}
    flags += [f for f in CPU_COLLECTIVE_TIMEOUT_FLAGS if f.split("=")[0] not in names]
    env["XLA_FLAGS"] = " ".join(flags)


def keep_host_memory(default: bool = False) -> bool:
    """mlperf.host_memory (`default`, or MULTIPOD_KEEP_HOST_MEMORY); call before jax
    starts its backend. A bad MULTIPOD_KEEP_HOST_MEMORY ends the process with one line
    (exit code 2)."""
    from mlperf import host_memory

    try:
        return host_memory.configure(default)
    except ValueError as e:
        usage_error(str(e))  # exits
        raise


def usage_error(message: str) -> None:
    """Bad input before anything starts: one line on stderr, exit code 2."""
    print(f"multipod: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_INPUT)


def parse_flags(argv: list[str]) -> list[str]:
    """absl `flags_parser` for the CLIs: a missing config file, an unknown config key or a
    bad flag value is one line naming it (absl and ml_collections print tracebacks)."""
    config_path = _flag_value(argv, "config")
    if config_path:
        path = config_path.split(":", 1)[0]
        if not os.path.isfile(path):
            known = ", ".join(_config_files()) or "configs/<model>.py"
            usage_error(
                f"--config {config_path}: config file {path!r} not found; use one of {known}."
            )
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        text = str(e).strip().splitlines()
        # ml_collections puts a config file's own traceback in the message; its last line
        # is the error (e.g. an unknown variant).
        usage_error(text[-1] if len(text) > 1 and "Traceback" in str(e) else text[0])
    except (AttributeError, KeyError) as e:
        usage_error(_unknown_key_message(argv, config_path, e))
    return []  # not reached


def _config_files() -> list[str]:
    """configs/*.py files that define get_config (relative to the working directory)."""
    out = []
    for path in sorted(glob.glob("configs/*.py")):
        with open(path, encoding="utf-8") as f:
            if "def get_config(" in f.read():
                out.append(path)
    return out


def _flag_value(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg in (f"--{name}", f"-{name}") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def _unknown_key_message(argv: list[str], config_path: str | None, error: Exception) -> str:
    """Which `--config.a.b=v` override names a key the config lacks, and what it has."""
    config = _load_config(config_path) if config_path else None
    for arg in argv:
        if not arg.startswith("--config."):
            continue
        dotted = arg[len("--config.") :].split("=", 1)[0]
        node, walked = config, []
        for part in dotted.split("."):
            keys = list(node.keys()) if hasattr(node, "keys") else []
            if part not in keys:
                where = ".".join(walked) or "the config"
                close = difflib.get_close_matches(part, keys, n=1)
                hint = f"did you mean {'.'.join([*walked, close[0]])}? " if close else ""
                return (
                    f"--config.{dotted}: {where} has no key {part!r}; {hint}"
                    f"keys there: {', '.join(sorted(keys))}."
                )
            node, walked = node[part], [*walked, part]
    return f"a --config override names a key the config lacks ({error})."


def _load_config(config_path: str):
    path, _, arg = config_path.partition(":")
    try:
        spec = importlib.util.spec_from_file_location("_multipod_config", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.get_config(arg) if arg else module.get_config()
    except Exception:  # noqa: BLE001 - only used to name the bad key; the caller falls back
        return None
