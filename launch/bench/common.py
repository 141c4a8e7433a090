"""Flags and helpers that several `launch.bench.step` tools share. absl refuses a flag name
that two imported modules define, and a test process imports several tools, so a flag
that more than one tool takes is defined here, once."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from absl import app, flags

from launch.cli import keep_host_memory, parse_flags, relax_cpu_collective_timeouts
from launch.config_flag import CONFIG  # noqa: F401 (re-exported)

relax_cpu_collective_timeouts()  # before jax starts its backend

MESH = flags.DEFINE_string("mesh", "", "Mesh override, e.g. data=8,model=1.")
STEPS = flags.DEFINE_integer("steps", 20, "Timed train steps per repeat (step, variants).")
REPEATS = flags.DEFINE_integer("repeats", 3, "Repeats; the median is reported.")
ROUNDS = flags.DEFINE_integer(
    "rounds", 5, "Timed rounds (peers: after the warm-up rounds, `peers.alternate`)."
)
JSON = flags.DEFINE_bool("json", False, "Print JSON instead of a table.")
PEER_THREADS = flags.DEFINE_integer(
    "peer_threads", 0, "peers, kernels: CPU threads for both sides (0: each library's default)."
)


def progress(text: str) -> None:
    """One progress line on stderr (stdout stays the result, JSON with --json)."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


def print_rows(rows: Any, table: Callable[[Any], str]) -> None:
    """`rows` as JSON with --json, else as `table` writes them."""
    print(json.dumps(rows, indent=2) if JSON.value else table(rows))


def one_cpu_device() -> None:
    """Starts JAX with one CPU device, whatever `--xla_force_host_platform_device_count`
    says (call before JAX's backend starts). Every peer comparison runs on one device; with
    8 fake devices in the process XLA:CPU runs that device's program markedly slower (the
    Transformer tiny step 171 ms against 121 ms on one core, docs/performance.md)."""
    import jax

    jax.config.update("jax_num_cpu_devices", 1)


def limit_threads(threads: int) -> None:
    """Both sides on the first `threads` CPUs: torch's intra-op threads, and XLA's pool
    (sized from the CPU affinity when its backend starts, so call this before)."""
    import torch

    cpus = sorted(os.sched_getaffinity(0))[:threads]
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads)


def one_device_peers() -> None:
    """The set-up of a JAX-against-torch tool (peers, kernels), before jax starts its
    backend: one CPU device, freed host memory kept (both libraries' buffers come and go
    each call, and they share the process and so the setting), --peer_threads CPUs."""
    one_cpu_device()
    keep_host_memory(default=True)
    if PEER_THREADS.value:
        limit_threads(PEER_THREADS.value)


def run(main: Callable[[list[str]], None], keep_memory: bool = True) -> None:
    """absl's `app.run` for a tool: one-line errors for bad flags or configs, no
    positional arguments, and (with `keep_memory`) MULTIPOD_KEEP_HOST_MEMORY honoured."""

    def checked(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        if keep_memory:
            keep_host_memory()  # when MULTIPOD_KEEP_HOST_MEMORY=1; before jax starts
        main(argv)

    app.run(checked, flags_parser=parse_flags)
