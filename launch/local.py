"""Run N local processes x M fake CPU devices joined by jax.distributed (gloo).

    python -m launch.local --processes 2 --devices_per_process 4 -- \\
        python -m launch.train --config configs/bert.py:tiny --workdir /tmp/run

Every process gets the same command plus its coordinates through the environment
(MULTIPOD_COORDINATOR on a free 127.0.0.1 port, MULTIPOD_NUM_PROCESSES,
MULTIPOD_PROCESS_ID) and `--xla_force_host_platform_device_count=M`. Output lines are
prefixed with the process index. If one process fails, the others are stopped and the
launcher exits non-zero naming it; Ctrl-C stops all of them.
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

from launch.cli import relax_cpu_collective_timeouts

_PROCESSES = flags.DEFINE_integer("processes", 2, "Number of processes.", lower_bound=1)
_DEVICES = flags.DEFINE_integer(
    "devices_per_process", 4, "Fake CPU devices per process.", lower_bound=1
)
_GRACE_S = flags.DEFINE_float(
    "grace_s", 10.0, "Seconds between SIGTERM and SIGKILL when stopping the other processes."
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


def _pump(index: int, proc: subprocess.Popen, lock: threading.Lock) -> None:
    """Copies one process's output to ours, each line prefixed with its index."""
    assert proc.stdout is not None
    for line in proc.stdout:
        with lock:
            sys.stdout.write(f"[p{index}] {line}")
            sys.stdout.flush()


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


def launch(command: list[str], processes: int, devices: int, grace_s: float = 10.0) -> int:
    """Runs `command` as `processes` joined processes; returns the launcher's exit code."""
    coordinator = f"127.0.0.1:{free_port()}"
    lock = threading.Lock()
    procs, pumps = [], []
    for i in range(processes):
        proc = subprocess.Popen(
            command,
            env=process_env(i, processes, devices, coordinator),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(proc)
        pump = threading.Thread(target=_pump, args=(i, proc, lock), daemon=True)
        pump.start()
        pumps.append(pump)
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                index, code = failed[0]
                _stop_all(procs, grace_s)
                print(
                    f"launch.local: process {index} exited with code {code}; stopped the others.",
                    file=sys.stderr,
                    flush=True,
                )
                return code if code > 0 else 1
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("launch.local: interrupted; stopping all processes.", file=sys.stderr, flush=True)
        _stop_all(procs, grace_s)
        return 130
    finally:
        for pump in pumps:
            pump.join(timeout=5)


def main(argv: list[str]) -> None:
    command = argv[1:]
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise app.UsageError("give the command to run after --, e.g. -- python -m launch.train ...")
    if command[0] in ("python", "python3"):
        command[0] = sys.executable  # the launcher's own interpreter (the project's venv)
    sys.exit(launch(command, _PROCESSES.value, _DEVICES.value, _GRACE_S.value))


if __name__ == "__main__":
    app.run(main)
