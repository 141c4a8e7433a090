"""Multi-host failures end on every host with one line naming the missing or dead process,
within the timeouts; launch.local tells a crash from a run that missed its target; the
preflight gate stops hosts that would run different things."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, cpu_env, tiny_train_command

from launch.distributed import PeerLostError
from launch.local import free_port
from mlperf.checkpoint import committed_steps
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


# docs/reliability.md, "How a run stops": with several processes SIGINT is passed on to
# JAX's preemption sync point, so every host saves the same step; a failed save is agreed
# on by all hosts at the next logged step and every host stops there.
LONG_RUN = [
    "--config.train.steps=100000",
    "--config.train.log_every_steps=1",
    "--config.train.stop_at_target=False",
    "--config.train.eval_every_samples=10000000",
    "--config.model.num_layers=1",
    "--config.model.hidden_size=32",
    "--config.model.num_heads=4",
    "--config.model.mlp_dim=64",
    "--init_timeout_s=120",
]


def _host(tmp_path, process_id: int, port: int, argv: list[str]) -> subprocess.Popen:
    """One host of a 2-process run, its stdout and stderr in files (never a full pipe)."""
    env = dict(
        cpu_env(4),
        MULTIPOD_COORDINATOR=f"127.0.0.1:{port}",
        MULTIPOD_NUM_PROCESSES="2",
        MULTIPOD_PROCESS_ID=str(process_id),
        PYTHONUNBUFFERED="1",
    )
    logs = tmp_path / "logs"
    os.makedirs(logs, exist_ok=True)
    out = open(logs / f"p{process_id}.out", "w")  # noqa: SIM115 - closed with the process
    err = open(logs / f"p{process_id}.err", "w")  # noqa: SIM115
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err, text=True)


def _output(tmp_path, process_id: int) -> str:
    logs = tmp_path / "logs"
    return (logs / f"p{process_id}.out").read_text() + (logs / f"p{process_id}.err").read_text()


def _wait_for_training(tmp_path, procs, timeout: float = 240) -> None:
    """Until process 0 has printed a step line (both hosts train in lock-step)."""
    deadline = time.time() + timeout
    while not re.search(r"^step +\d+/", _output(tmp_path, 0), re.M):
        assert time.time() < deadline, _output(tmp_path, 0)[-3000:]
        assert all(p.poll() is None for p in procs), _output(tmp_path, 0)[-3000:]
        time.sleep(0.2)


def _finish(procs, timeout: float = 120) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.slow
def test_ctrl_c_on_one_host_saves_the_same_step_on_every_host(tmp_path):
    port = free_port()
    workdir = tmp_path / "w"
    argv = tiny_train_command(workdir, *LONG_RUN, "--config.checkpoint.every_steps=0")
    procs = [_host(tmp_path, i, port, argv) for i in range(2)]
    try:
        _wait_for_training(tmp_path, procs)
        procs[1].send_signal(signal.SIGINT)  # Ctrl-C on process 1's terminal only
    finally:
        codes = _finish(procs)
    out = [_output(tmp_path, i) for i in range(2)]
    # Process 1 stops for its Ctrl-C (130); process 0 for the sync point's notice (143).
    assert codes == [143, 130], [o[-2000:] for o in out]
    assert "Traceback" not in out[0] + out[1]
    saved = [re.findall(r"checkpoint (\S+) written; stopping", o) for o in out]
    assert saved[0] and saved[0] == saved[1], saved  # the same step's checkpoint
    assert f"preemption notice: checkpoint {saved[0][0]} written" in out[0]
    assert f"Ctrl-C: checkpoint {saved[0][0]} written" in out[1]
    result = json.loads((workdir / "result.json").read_text())
    assert result["status"] == "preempted" and result["processes"] == 2, result
    assert committed_steps(str(workdir / "checkpoints")) == [result["steps"]]
    assert saved[0][0].endswith(f"/checkpoints/{result['steps']}")


# launch.train on a host whose checkpoint writes fail in the background from the 3rd
# check on, as a full disk on that host alone would.
FAILING_SAVES = """
import sys
from absl import app
from launch import train
from launch.cli import parse_flags
from mlperf.checkpoint import manager

calls = []

def check(self):
    calls.append(1)
    if len(calls) >= 3:
        raise manager.CheckpointSaveError(
            "writing checkpoint (this host) failed: [Errno 28] No space left on device (ENOSPC)"
        )

manager.Checkpointer.check = check
sys.argv = ["launch.train", *sys.argv[1:]]
app.run(train.main, flags_parser=parse_flags)
"""


def _one_host_fails_its_saves(tmp_path, script: str) -> tuple[list[str], list[list[str]]]:
    """Two hosts save every step; host 1 runs `script` (launch.train with a failing save).
    Both must abort at one step: exit 1, no traceback. Returns (outputs, stop steps)."""
    port = free_port()
    argv = tiny_train_command(tmp_path / "w", *LONG_RUN, "--config.checkpoint.every_steps=1")
    failing = [argv[0], "-c", script, *argv[3:]]  # `-m launch.train` -> the script
    procs = [_host(tmp_path, 0, port, argv), _host(tmp_path, 1, port, failing)]
    codes = _finish(procs, timeout=300)
    out = [_output(tmp_path, i) for i in range(2)]
    # Aborted, not crashed: exit 1 (the run ended without its target) on both hosts.
    assert codes == [1, 1], [o[-2000:] for o in out]
    assert "Traceback" not in out[0] + out[1]
    stop = [re.findall(r"failed.* at step (\d+): stopping", o) for o in out]
    assert stop[0] and stop[0] == stop[1], stop  # both stopped at the same step
    assert "a checkpoint save failed on another process at step" in out[0]
    return out, stop


@pytest.mark.slow
def test_a_save_failing_on_one_host_stops_every_host_at_the_same_step(tmp_path):
    out, stop = _one_host_fails_its_saves(tmp_path, FAILING_SAVES)
    workdir = tmp_path / "w"
    assert "[Errno 28] No space left on device (ENOSPC) at step" in out[1]
    result = json.loads((workdir / "result.json").read_text())
    assert result["status"] == "aborted" and result["steps"] == int(stop[0][0]), result


# launch.train on a host whose checkpoint directory has no room from the 3rd room check
# on (checked before each save starts), as a full disk on that host alone would.
NO_ROOM = """
import errno, sys
from absl import app
from launch import train
from launch.cli import parse_flags
from mlperf.checkpoint import manager

calls = []

def check_room(self, step):
    calls.append(step)
    if len(calls) >= 3:
        raise OSError(errno.ENOSPC, "No space left on device", self.step_path(step))

manager.Checkpointer._check_room = check_room
sys.argv = ["launch.train", *sys.argv[1:]]
app.run(train.main, flags_parser=parse_flags)
"""


@pytest.mark.slow
def test_no_room_for_a_save_on_one_host_stops_every_host_at_the_same_step(tmp_path):
    out, stop = _one_host_fails_its_saves(tmp_path, NO_ROOM)
    assert "No space left on device" in out[1]
