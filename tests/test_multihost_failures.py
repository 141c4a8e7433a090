"""Multi-host failures end on every host with one line naming the missing or dead process,
within the timeouts; launch.local tells a crash from a run that missed its target; the
preflight gate stops hosts that would run different things."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, cpu_env, tiny_train_command

from launch.distributed import PeerLostError
from launch.local import free_port
from mlperf.preflight import differences

pytestmark = pytest.mark.xdist_group("multiprocess")


def _local(script: str, processes: int = 2, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.local", f"--processes={processes}"]
        + ["--devices_per_process=1", "--grace_s=5", "--", "python", "-c", script],
        cwd=REPO,
        env=cpu_env(1),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_launcher_names_a_process_killed_by_a_signal():
    script = (
        "import os, signal, time\n"
        "if os.environ['MULTIPOD_PROCESS_ID'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(60)\n"
    )
    proc = _local(script)
    assert proc.returncode == 128 + signal.SIGKILL
    assert "process 1 crashed: killed by SIGKILL; stopped the others." in proc.stderr


def test_launcher_tells_a_missed_target_from_a_crash():
    # launch.train's exit code 1 on every process: the run ended below its target.
    proc = _local("import sys, time; time.sleep(0.5); sys.exit(1)")
    assert proc.returncode == 1
    assert "the run ended without reaching its target (no process crashed" in proc.stderr
    assert "crashed" not in proc.stderr.replace("no process crashed", "")
    # An unexpected error (exit code 70) is a crash.
    proc = _local(
        "import os, sys, time\nsys.exit(70 if os.environ['MULTIPOD_PROCESS_ID'] == '0' else 1)"
    )
    assert proc.returncode == 70
    assert "process 0 exited with code 70 (crashed with an unexpected error" in proc.stderr


def test_preflight_differences_name_hosts_and_values():
    base = {"code": "abc", "jax": "0.10.2", "config": {"train.steps": 60}, "devices": "4 x cpu"}
    other = dict(base, config={"train.steps": 80}, jax="0.10.1")
    found = differences([base, base, other])
    assert "config train.steps: process 0,1 has 60; process 2 has 80" in found
    assert 'jax: process 0,1 has "0.10.2"; process 2 has "0.10.1"' in found
    assert differences([base, dict(base)]) == []
    short = dict(base, devices="2 x cpu", expected_devices=4)
    assert "process 1 holds 2 x cpu devices but the mesh expects 4 per host" in differences(
        [dict(base, expected_devices=4), short]
    )


def _train_process(workdir, process_id: int, port: int, *flags_: str) -> subprocess.Popen:
    env = dict(
        cpu_env(4),
        MULTIPOD_COORDINATOR=f"127.0.0.1:{port}",
        MULTIPOD_NUM_PROCESSES="2",
        MULTIPOD_PROCESS_ID=str(process_id),
        PYTHONUNBUFFERED="1",
    )
    # stderr into a file: absl's log lines must never fill a pipe nobody reads yet.
    os.makedirs(workdir.parent / "logs", exist_ok=True)
    stderr = open(workdir.parent / "logs" / f"p{process_id}.err", "w")  # noqa: SIM115
    return subprocess.Popen(
        tiny_train_command(workdir, *flags_),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def _stderr(workdir, process_id: int) -> str:
    return (workdir.parent / "logs" / f"p{process_id}.err").read_text()


@pytest.mark.slow
def test_process_0_names_a_peer_that_never_joins(tmp_path):
    start = time.time()
    p0 = _train_process(tmp_path / "w", 0, free_port(), "--init_timeout_s=5")
    p0.communicate(timeout=60)
    err = _stderr(tmp_path / "w", 0)
    assert p0.returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1].startswith("multipod: error: process 0 of 2: process(es) 1 did not join")
    assert "within 5 s" in lines[-1]
    assert "Check failure" not in err and "Traceback" not in err
    assert time.time() - start < 40


@pytest.mark.slow
def test_survivor_names_the_peer_that_died_mid_run(tmp_path):
    port = free_port()
    flags_ = [
        "--config.train.steps=100000",
        "--config.train.log_every_steps=1",
        "--config.train.stop_at_target=False",
        "--config.model.num_layers=1",
        "--config.checkpoint.every_steps=0",
        "--heartbeat_timeout_s=10",
        "--init_timeout_s=120",
    ]
    procs = [_train_process(tmp_path / "w", i, port, *flags_) for i in range(2)]
    try:
        # Wait until both train (process 0 prints progress lines), then kill process 1.
        assert procs[0].stdout is not None
        deadline = time.time() + 300
        for line in procs[0].stdout:
            if "step" in line and "loss" in line or time.time() > deadline:
                break
        assert procs[0].poll() is None and procs[1].poll() is None
        procs[1].send_signal(signal.SIGKILL)
        killed = time.time()
        procs[0].communicate(timeout=90)
        took = time.time() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    err = _stderr(tmp_path / "w", 0)
    lines = err.strip().splitlines()
    assert procs[0].returncode == 4, err[-3000:]
    assert "process 0 of 2: process 1" in lines[-1], err[-3000:]
    assert "Check failure" not in err
    assert took < 60


@pytest.mark.slow
def test_preflight_stops_every_host_when_one_config_differs(tmp_path):
    train = " ".join(tiny_train_command(tmp_path / "w", "--config.model.num_layers=1"))
    # Process 1 alone trains 11 steps: the same command otherwise.
    command = f"exec {train} --config.train.steps=$((10 + MULTIPOD_PROCESS_ID))"
    proc = subprocess.run(
        [sys.executable, "-m", "launch.local", "--processes=2", "--devices_per_process=4"]
        + ["--grace_s=5", "--", "sh", "-c", command],
        cwd=REPO,
        env=cpu_env(4),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stdout.splitlines() if "multipod: error: preflight" in line]
    assert errors, proc.stdout[-3000:]
    assert "config train.steps: process 0 has 10; process 1 has 11" in errors[0]
    assert (
        not (tmp_path / "w" / "metrics.jsonl").exists()
        or not (tmp_path / "w" / "metrics.jsonl").read_text()
    )
    assert os.path.isdir(tmp_path / "w")


def test_only_connection_failures_count_as_a_lost_peer():
    gloo = ValueError(
        "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:538] "
        "Read error [127.0.0.1]:21923: Connection reset by peer"
    )
    lost = PeerLostError.from_collective_error(gloo, 0, 2)
    assert lost is not None and str(lost).startswith("process 0 of 2: another process died")
    assert PeerLostError.from_collective_error(gloo, 0, 1) is None  # one process: a bug
    assert PeerLostError.from_collective_error(ValueError("shapes differ"), 0, 2) is None
