"""`launch.local --supervise` with a stand-in job (no training): preempted twice, then
done; bad input is not retried; the restarts are in WORKDIR/supervisor.json. The real
runs, SIGKILLed, are in tests/system/test_supervise_runs.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, cpu_env

# Process 0 exits with the next of CODES on each attempt (a counter file), process 1 with 0.
JOB = """
import os, sys
counter, codes = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
if os.environ["MULTIPOD_PROCESS_ID"] == "0":
    n = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(n + 1))
    sys.exit(codes[n])
"""


def _supervise(tmp_path, codes: str, *flags: str) -> subprocess.CompletedProcess:
    workdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launch.local", "--processes=2", "--devices_per_process=1"]
    cmd += ["--supervise", "--backoff_s=0.05", *flags, "--", "python", "-c", JOB]
    cmd += [str(tmp_path / "count"), codes, f"--workdir={workdir}"]
    return subprocess.run(
        cmd, cwd=REPO, env=cpu_env(1), capture_output=True, text=True, timeout=120
    )


def test_a_preempted_job_is_started_again_until_it_ends(tmp_path):
    proc = _supervise(tmp_path, "143,137,0")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "launch.local: attempt" in line]
    assert [line.split(":")[1].strip().split(" ended")[0] for line in lines] == [
        "attempt 1",
        "attempt 2",
        "attempt 3",
    ]
    assert (
        "preempted (checkpoint written) (exit 143); restart 1 of at most 3 in 0.05 s." in lines[0]
    )
    assert (
        "killed by SIGKILL (exit 137)" in lines[1] and "restart 2 of at most 3 in 0.1 s" in lines[1]
    )
    assert "the run reached its target (exit 0)" in lines[2] and lines[2].endswith("not restarted.")
    record = json.loads((tmp_path / "run" / "supervisor.json").read_text())
    assert record["attempt"] == 3 and len(record["restarts"]) == 2
    assert [a["exit_code"] for a in record["attempts"]] == [143, 137, 0]


@pytest.mark.parametrize("code", [2, 70, 1])
def test_a_final_code_is_not_retried(tmp_path, code):
    proc = _supervise(tmp_path, f"{code},0")
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.count("launch.local: attempt") == 1 and "not restarted." in proc.stderr


def test_max_restarts_is_honoured(tmp_path):
    proc = _supervise(tmp_path, "143,143,143", "--max_restarts=2")
    assert proc.returncode == 143
    assert "attempt 3 ended" in proc.stderr
    assert "giving up after 2 restart(s) (--max_restarts)." in proc.stderr
