"""A stalled run says where it waits: launch.train prints every thread's Python stack on
SIGUSR1 and goes on; launch.local forwards the signal, and with --stall_s stops a run in
which no process printed for that long, after collecting the stacks."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from conftest import REPO, cpu_env

from launch.cli import EXIT_STALLED

QUIET_CHILD = (
    "import os, time\n"
    "from launch.cli import dump_stacks_on_sigusr1\n"
    "dump_stacks_on_sigusr1()\n"
    "def wait_for_the_collective(seconds):\n"
    "    print('joined', flush=True)\n"
    "    time.sleep(seconds)\n"
    "wait_for_the_collective(float(os.environ.get('QUIET_S', '120')))\n"
)


def _local(*flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "launch.local",
        "--processes=2",
        "--devices_per_process=1",
        "--grace_s=5",
        *flags,
        "--",
        "python",
        "-c",
        QUIET_CHILD,
    ]


def _stacks_of(stdout: str, index: int) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(f"[p{index}]")]


def test_launcher_stops_a_stalled_run_after_printing_each_processs_stacks():
    """Both processes live but print nothing (as when they wait in a collective): after
    --stall_s the launcher asks each for its Python stacks, stops them and says so."""
    start = time.time()
    proc = subprocess.run(
        _local("--stall_s=3"),
        cwd=REPO,
        env=cpu_env(1),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == EXIT_STALLED, proc.stdout + proc.stderr
    assert "no process printed a line for 3 s" in proc.stderr
    for index in (0, 1):
        stack = _stacks_of(proc.stdout, index)
        assert any("in wait_for_the_collective" in line for line in stack), proc.stdout
    assert time.time() - start < 30


def test_the_launcher_passes_sigusr1_on_and_the_processes_go_on():
    env = {**cpu_env(1), "QUIET_S": "6"}
    proc = subprocess.Popen(
        _local(), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    joined = 0
    # Both children registered the handler and entered the waiting function before
    # printing this (a signal between the print and the call would show the caller).
    while joined < 2:
        line = proc.stdout.readline()
        assert line, "launch.local ended before both processes joined"
        joined += line.strip().endswith("joined")
    proc.send_signal(signal.SIGUSR1)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stdout + stderr  # both slept on and ended normally
    for index in (0, 1):
        stack = _stacks_of(stdout, index)
        assert any("in wait_for_the_collective" in line for line in stack), stdout + stderr


def test_launch_train_prints_its_stacks_on_sigusr1_and_goes_on(tmp_path):
    """launch.train as process 1 of 2 answers process 0's roll call (here: this test's
    socket), so it has installed its handler; SIGUSR1 then prints where it waits."""
    with socket.socket() as coordinator:
        coordinator.bind(("127.0.0.1", 0))
        coordinator.listen(1)
        coordinator.settimeout(60)
        port = coordinator.getsockname()[1]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "launch.train",
                "--config=configs/bert.py:tiny",
                f"--workdir={tmp_path}",
                f"--coordinator=127.0.0.1:{port}",
                "--num_processes=2",
                "--process_id=1",
                "--init_timeout_s=60",
            ],
            cwd=REPO,
            env=cpu_env(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            peer, _ = coordinator.accept()
            with peer:
                time.sleep(0.5)
                proc.send_signal(signal.SIGUSR1)
                time.sleep(2)
                assert proc.poll() is None, "the process must go on after printing"
        finally:
            proc.kill()
            stdout, stderr = proc.communicate(timeout=30)
    assert "in answer_roll_call" in stderr, stdout + stderr
    assert "in main" in stderr
