"""Run N local processes x M fake CPU devices joined by jax.distributed (gloo).

    python -m launch.local --processes 2 --devices_per_process 4 -- \\
        python -m launch.train --config configs/bert.py:tiny --workdir /tmp/run

Every process gets the same command plus its coordinates through the environment
(MULTIPOD_COORDINATOR on a free 127.0.0.1 port, MULTIPOD_NUM_PROCESSES,
MULTIPOD_PROCESS_ID) and `--xla_force_host_platform_device_count=M`. Output lines are
prefixed with the process index. If one process crashes (a signal, or an exit code other
than launch.train's "target reached", "target not reached" or "preempted"), the others
are stopped and the launcher says which process crashed and how, exiting with its code
(128 + N for signal N). A run that ends without reaching its target on every process is
reported as such (exit 1). Ctrl-C stops all of them.

A stalled run (every process alive, none printing, e.g. all waiting in a collective):
`kill -USR1 <launcher pid>` makes every launch.train process print each thread's Python
stack and go on; with `--stall_s=N` the launcher does that itself once no process has
printed a line for N seconds, then stops them all and exits with EXIT_STALLED (75).

`--supervise` starts the whole job again whenever it ends in a way a restart can help
(a process killed or preempted, a peer lost, a stall), until the run ends, at most
`--max_restarts` times, waiting `--backoff_s` (doubling) in between; the run resumes
from its newest checkpoint each time (launch/supervisor.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import app, flags

from launch import launcher_flags as shared
from launch.cli import (
    EXIT_BAD_INPUT,
    EXIT_CRASH,
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    EXIT_STALLED,
    EXIT_STORE_UNREACHABLE,
    EXIT_TARGET_NOT_REACHED,
    EXIT_TARGET_REACHED,
    EXIT_WORKDIR_HELD,
    relax_cpu_collective_timeouts,
)
from launch.launcher_flags import value_or
from launch.supervisor import Attempt, Backoff, Supervisor, workdir_of

# Exit codes with which a process ends the run in an orderly way: the others are left to
# end by themselves (they reach the same decision within moments).
_ORDERLY = (EXIT_TARGET_REACHED, EXIT_TARGET_NOT_REACHED, EXIT_PREEMPTED)

_PROCESSES = flags.DEFINE_integer("processes", 2, "Number of processes.", lower_bound=1)
_DEVICES = flags.DEFINE_integer(
    "devices_per_process", 4, "Fake CPU devices per process.", lower_bound=1
)
_GRACE_S = flags.DEFINE_float(
    "grace_s", 10.0, "Seconds between SIGTERM and SIGKILL when stopping the other processes."
)
_STALL_S = flags.DEFINE_float(
    "stall_s",
    0.0,
    "Stop the run when no process has printed a line for this many seconds, after asking "
    "each for its Python stacks (SIGUSR1); 0: never. Leave room for the first compile.",
    lower_bound=0.0,
)
_SUPERVISE = flags.DEFINE_bool(
    "supervise", False, "Start the whole job again after a crash or preemption (resumes)."
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(index: int, count: int, devices: int, coordinator: str) -> dict[str, str]:
    """The environment of process `index`: its coordinates and its fake CPU devices."""
    env = dict(os.environ)
    flags_text = " ".join(
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    )
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"{flags_text} --xla_force_host_platform_device_count={devices}".strip(),
        MULTIPOD_COORDINATOR=coordinator,
        MULTIPOD_NUM_PROCESSES=str(count),
        MULTIPOD_PROCESS_ID=str(index),
        PYTHONUNBUFFERED="1",
    )
    relax_cpu_collective_timeouts(env)
    return env


def _pump(index: int, proc: subprocess.Popen, lock: threading.Lock, last: list[float]) -> None:
    """Copies one process's output to ours, each line prefixed with its index; `last[0]`
    is the time of the latest line from any process."""
    assert proc.stdout is not None
    for line in proc.stdout:
        with lock:
            last[0] = time.monotonic()
            sys.stdout.write(f"[p{index}] {line}")
            sys.stdout.flush()


def _signal_alive(procs: list[subprocess.Popen], signum: int) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)


def _stop_all(procs: list[subprocess.Popen], grace_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.time() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def describe_exit(index: int, code: int) -> str:
    """What a process's exit code means (launch.train's codes, launch/cli.py)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"process {index} crashed: killed by {name}"
    meaning = {
        EXIT_BAD_INPUT: "stopped on bad input or cluster setup; its error line is above",
        EXIT_WORKDIR_HELD: "stopped: another run holds the work directory; its line is above",
        EXIT_PEER_LOST: "stopped because another process died or never joined",
        EXIT_STORE_UNREACHABLE: "stopped: the object store was unreachable; its line is above",
        EXIT_CRASH: "crashed with an unexpected error; its traceback is above",
    }.get(code, "crashed")
    return f"process {index} exited with code {code} ({meaning})"


def _orderly_end(codes: list[int], supervised: bool = False) -> int:
    if all(c == EXIT_TARGET_REACHED for c in codes):
        return EXIT_TARGET_REACHED
    if EXIT_PREEMPTED in codes:
        again = "" if supervised else "; run the same command again to continue"
        print(
            f"launch.local: the run was preempted (checkpoint written){again}.",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_PREEMPTED
    print(
        "launch.local: the run ended without reaching its target (no process crashed; "
        "see result.json).",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_TARGET_NOT_REACHED


def launch(
    command: list[str],
    processes: int,
    devices: int,
    grace_s: float = 10.0,
    stall_s: float = 0.0,
    supervised: bool = False,
) -> int:
    """Runs `command` as `processes` joined processes; returns the launcher's exit code."""
    coordinator = f"127.0.0.1:{free_port()}"
    lock = threading.Lock()
    procs, pumps = [], []
    orderly_since = None
    last_line = [time.monotonic()]
    forward = signal.signal(signal.SIGUSR1, lambda *_: _signal_alive(procs, signal.SIGUSR1))
    for i in range(processes):
        proc = subprocess.Popen(
            command,
            env=process_env(i, processes, devices, coordinator),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(proc)
        pump = threading.Thread(target=_pump, args=(i, proc, lock, last_line), daemon=True)
        pump.start()
        pumps.append(pump)
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c is not None and c not in _ORDERLY]
            if failed:
                # The process that crashed, not a survivor that stopped because of it.
                index, code = min(failed, key=lambda f: (f[1] == EXIT_PEER_LOST, f[0]))
                _stop_all(procs, grace_s)
                print(
                    f"launch.local: {describe_exit(index, code)}; stopped the others.",
                    file=sys.stderr,
                    flush=True,
                )
                return code if code > 0 else 128 - code
            if all(c is not None for c in codes):
                return _orderly_end(codes, supervised)
            if stall_s and time.monotonic() - last_line[0] > stall_s:
                _signal_alive(procs, signal.SIGUSR1)
                time.sleep(min(grace_s, 3.0))  # the stacks reach our output meanwhile
                _stop_all(procs, grace_s)
                print(
                    f"launch.local: no process printed a line for {stall_s:.0f} s: the run "
                    "stalled (each process's Python stacks are above); stopped them all.",
                    file=sys.stderr,
                    flush=True,
                )
                return EXIT_STALLED
            if any(c is not None for c in codes) and orderly_since is None:
                orderly_since = time.time()
            if orderly_since is not None and time.time() - orderly_since > max(grace_s, 30.0):
                done = [i for i, c in enumerate(codes) if c is not None]
                _stop_all(procs, grace_s)
                print(
                    f"launch.local: process(es) {', '.join(map(str, done))} finished but the "
                    "others did not within 30 s; stopped them.",
                    file=sys.stderr,
                    flush=True,
                )
                return EXIT_CRASH
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("launch.local: interrupted; stopping all processes.", file=sys.stderr, flush=True)
        _stop_all(procs, grace_s)
        return 130
    finally:
        signal.signal(signal.SIGUSR1, forward)
        for pump in pumps:
            pump.join(timeout=5)


def supervise(
    command: list[str],
    processes: int,
    devices: int,
    grace_s: float = 10.0,
    stall_s: float = 0.0,
    max_restarts: int = 3,
    backoff: Backoff | None = None,
) -> int:
    """`launch` in a restart loop (launch/supervisor.py) until the run ends for good."""
    workdir = workdir_of(command)
    supervisor = Supervisor("launch.local", workdir, max_restarts, backoff or Backoff(1.0, 60.0))

    def recover(previous: Attempt | None, ended: float) -> float:
        if previous is not None and workdir:
            from mlperf import lease

            # Every process of the attempt is gone; a lease left by a killed one is freed
            # by its dead pid, and a run of someone else's is waited for.
            lease.wait_until_free(workdir, lease.TTL_S + 30, supervisor.say)
        return 0.0  # the machine never goes away

    def attempt(_: int) -> Attempt:
        return Attempt(launch(command, processes, devices, grace_s, stall_s, supervised=True))

    return supervisor.run(attempt, recover)


def main(argv: list[str]) -> None:
    command = argv[1:]
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise app.UsageError("give the command to run after --, e.g. -- python -m launch.train ...")
    if command[0] in ("python", "python3"):
        command[0] = sys.executable  # the launcher's own interpreter (the project's venv)
    args = (command, _PROCESSES.value, _DEVICES.value, _GRACE_S.value, _STALL_S.value)
    if _SUPERVISE.value:
        backoff = Backoff(value_or(shared.BACKOFF_S, 1.0), value_or(shared.MAX_BACKOFF_S, 60.0))
        sys.exit(supervise(*args, max_restarts=value_or(shared.MAX_RESTARTS, 3), backoff=backoff))
    sys.exit(launch(*args))


if __name__ == "__main__":
    app.run(main)
