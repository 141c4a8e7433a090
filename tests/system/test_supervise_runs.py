"""Whole runs of the restart machinery, 2 processes x 4 fake CPU devices of tiny BERT:

- a run started with SLURM's variables in place of the project's own (launch/slurm.py
  finds the coordinator, the process count and ids), uninterrupted: the reference;
- `launch.local --supervise` with a process SIGKILLed at a random step twice: the job
  ends at its target with the reference's parameters, bit for bit, and the goodput
  ledger counts 3 attempts. While the first attempt holds the work directory, a second
  run started there is refused with one line naming the holder (host, pid, start time);
  after the holder's kill -9 its lease is free at once and the rerun resumes.

Every run shares one persistent compilation cache, so a restart loads its compiled steps.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import REPO, cpu_env, tiny_train_command
from tiny_bert_runs import SETTINGS, STEPS

from launch.cli import EXIT_WORKDIR_HELD
from launch.slurm import PORT_BASE
from mlperf import lease

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("supervise")]

# The tiny run of tests/tiny_bert_runs.py with a target it reaches at its first eval and
# trains past (exit 0 after all STEPS steps).
OVERRIDES = [f"--config.{k}={v}" for k, v in {**SETTINGS, "train.target": 0.0}.items()]


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("xla")


def _train(workdir, xla_cache) -> list[str]:
    return tiny_train_command(workdir, *OVERRIDES, f"--compilation_cache={xla_cache}")


def _free_job_id() -> int:
    """A SLURM job id whose coordinator port (JAX's range, above the ephemeral ports) is
    free right now."""
    rng = np.random.default_rng(int(time.time()))
    for job_id in rng.integers(0, 4096, size=64):
        with socket.socket() as s:
            try:
                s.bind(("", PORT_BASE + int(job_id)))
            except OSError:
                continue
            return int(job_id)
    raise RuntimeError("no free port in JAX's SLURM range")


def _slurm_env(process_id: int, job_id: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in cpu_env(4).items()
        if not k.startswith(("SLURM_", "MULTIPOD_COORDINATOR", "MULTIPOD_NUM", "MULTIPOD_PRO"))
        and k != "CUDA_VISIBLE_DEVICES"
    }
    return dict(
        env,
        SLURM_JOB_ID=str(job_id),
        SLURM_PROCID=str(process_id),
        SLURM_LOCALID=str(process_id),
        SLURM_NODEID="0",
        SLURM_NTASKS="2",
        SLURM_STEP_NUM_NODES="1",
        SLURM_STEP_NODELIST="localhost",
        SLURM_STEP_TASKS_PER_NODE="2",
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory, xla_cache):
    """An uninterrupted run of 2 processes that srun might have started."""
    workdir = tmp_path_factory.mktemp("slurm")
    job_id = _free_job_id()
    procs = []
    for i in range(2):
        with open(workdir.parent / f"slurm-{i}.out", "w") as out:
            procs.append(
                subprocess.Popen(
                    _train(workdir, xla_cache),
                    cwd=REPO,
                    env=_slurm_env(i, job_id),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
    codes = [p.wait(timeout=600) for p in procs]
    outputs = [(workdir.parent / f"slurm-{i}.out").read_text() for i in range(2)]
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    return workdir, job_id, outputs


def test_a_run_started_with_slurm_variables_joins_its_processes(reference):
    workdir, job_id, outputs = reference
    for i in range(2):
        assert (
            f"SLURM: process {i} of 2 (node 0, 2 tasks per node), coordinator "
            f"localhost:{PORT_BASE + job_id}" in outputs[i]
        )
    result = json.loads((workdir / "result.json").read_text())
    assert result["processes"] == 2 and result["devices"] == 8 and result["steps"] == STEPS
    # Every host's output is in the work directory, from the moment it held it.
    for i in range(2):
        log = (workdir / "logs" / f"host_{i}.log").read_text()
        assert log.startswith(f"==== launch.train on {socket.gethostname()}, pid ")
    assert f"step {STEPS:>6}/{STEPS}" in (workdir / "logs" / "host_0.log").read_text()
    assert lease.current(str(workdir))[1].released  # the run let go of its work directory


def _training_processes(launcher: int) -> dict[int, int]:
    """Process id (MULTIPOD_PROCESS_ID) -> pid of the launcher's current children."""
    with open(f"/proc/{launcher}/task/{launcher}/children") as f:
        children = [int(c) for c in f.read().split()]
    found = {}
    for pid in children:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        found[int(env[b"MULTIPOD_PROCESS_ID"])] = pid
    return found


def _intruder(workdir, xla_cache, out_path) -> subprocess.CompletedProcess:
    """The same command typed again: one process on the same work directory."""
    with open(out_path, "w") as out:
        return subprocess.run(
            _train(workdir, xla_cache),
            cwd=REPO,
            env=cpu_env(8),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=300,
        )


def test_a_supervised_run_survives_two_kills_and_ends_with_the_reference_params(
    reference, xla_cache, tmp_path
):
    workdir = tmp_path / "supervised"
    rng = np.random.default_rng(53)
    kills = [int(rng.integers(3, 6)), int(rng.integers(8, 11))]  # attempt 1, attempt 2
    cmd = [sys.executable, "-m", "launch.local", "--processes=2", "--devices_per_process=4"]
    cmd += ["--supervise", "--max_restarts=3", "--backoff_s=0.5", "--grace_s=3", "--"]
    proc = subprocess.Popen(
        cmd + _train(workdir, xla_cache),
        cwd=REPO,
        env=cpu_env(4),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    output, killed, intruder, resumed = [], [], None, 0
    for line in proc.stdout:  # read to the end: the pipe is always drained
        output.append(line)
        resumed += line.startswith("[p0] resuming from")
        attempt = len(killed)
        if (
            attempt < 2
            and resumed == attempt
            and line.startswith(f"[p0] step {kills[attempt]:>6}/")
        ):
            pids = _training_processes(proc.pid)
            victim = attempt  # process 0 (the lease holder) first, then process 1
            if attempt == 0:
                # Held: a second run on the same work directory is refused, naming p0.
                for pid in pids.values():
                    os.kill(pid, signal.SIGSTOP)
                intruder = (_intruder(workdir, xla_cache, tmp_path / "intruder.out"), pids[0])
                os.kill(pids[victim], signal.SIGKILL)
                for pid in pids.values():
                    os.kill(pid, signal.SIGCONT)
            else:
                os.kill(pids[victim], signal.SIGKILL)
            killed.append(victim)
    proc.wait(timeout=60)
    text = "".join(output)
    assert proc.returncode == 0, text[-5000:]
    assert killed == [0, 1] and resumed == 2, text[-5000:]

    refused, holder_pid = intruder
    refusal = (tmp_path / "intruder.out").read_text()
    assert refused.returncode == EXIT_WORKDIR_HELD, refusal[-3000:]
    assert f"the work directory {workdir} is in use by another run: host " in refusal
    assert f"host {socket.gethostname()}, pid {holder_pid}, started " in refusal

    assert "launch.local: attempt 1 ended after" in text
    assert "process 0 crashed: killed by SIGKILL; stopped the others." in text
    assert "process 1 crashed: killed by SIGKILL; stopped the others." in text
    assert "launch.local: attempt 3 ended after" in text and "not restarted." in text

    got = json.loads((workdir / "result.json").read_text())
    want = json.loads((reference[0] / "result.json").read_text())
    assert got["steps"] == want["steps"] == STEPS and got["reached_target"]
    assert got["params_fingerprint"] == want["params_fingerprint"]  # bit-identical
    assert got["goodput"]["attempts"] == 3
    assert got["goodput"]["restart_lost_s"] > 0 and got["goodput"]["no_machines_s"] == 0
    record = json.loads((workdir / "supervisor.json").read_text())
    assert record["attempt"] == 3 and len(record["restarts"]) == 2
    assert [a["exit_code"] for a in record["attempts"]] == [137, 137, 0]
