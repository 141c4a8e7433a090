"""One run per work directory (mlperf/lease.py), on a local folder and in a bucket (a real
GCS-protocol server): a held lease refuses a second run naming its holder; a holder
killed with SIGKILL frees it (at once on its own machine, after the TTL elsewhere); a
renewal keeps it; a holder whose lease was taken over finds out at its next renewal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO

from input_pipeline import storage
from mlperf import lease
from mlperf.lease import Holder, WorkdirHeldError, WorkdirLease


@pytest.fixture(params=["local", "gs"])
def workdir(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "run")
    request.getfixturevalue("gcs")
    return "gs://multipod-test/run"


def _write_holder(workdir: str, seq: int, holder: Holder) -> None:
    storage.write_bytes(storage.join(workdir, "lease", f"{seq:08d}.json"), holder.to_json())


def _other_host(renewed_ago: float, ttl_s: float = 120.0) -> Holder:
    now = time.time()
    return Holder("tpu-worker-7", 4242, now - 3600, now - renewed_ago, ttl_s, boot_id="x")


def test_a_live_holder_refuses_a_second_run_naming_it(workdir):
    _write_holder(workdir, 1, _other_host(renewed_ago=5))
    with pytest.raises(WorkdirHeldError) as refused:
        WorkdirLease.acquire(workdir)
    line = str(refused.value)
    assert "\n" not in line
    assert f"the work directory {workdir} is in use by another run" in line
    assert "host tpu-worker-7, pid 4242, started " in line and " UTC " in line
    assert lease.held_by(workdir).pid == 4242


def test_an_expired_lease_is_taken_over_and_released(workdir):
    _write_holder(workdir, 1, _other_host(renewed_ago=121))  # killed 121 s ago, TTL 120 s
    held = WorkdirLease.acquire(workdir)
    try:
        seq, holder = lease.current(workdir)
        assert seq == 2 and holder.pid == os.getpid()
        assert storage.listdir(storage.join(workdir, "lease")) == ["00000002.json"]
        before = holder.renewed
        time.sleep(0.01)
        held.renew()
        assert lease.current(workdir)[1].renewed > before
    finally:
        held.release()
    assert lease.current(workdir)[1].released and lease.held_by(workdir) is None
    again = WorkdirLease.acquire(workdir)  # a released lease is free at once
    again.release()
    assert lease.current(workdir)[0] == 3


def test_a_holder_that_lost_its_lease_stops_at_its_next_renewal(workdir):
    lost = []
    held = WorkdirLease.acquire(workdir, on_lost=lambda w, taker: lost.append(taker))
    _write_holder(workdir, held.seq + 1, _other_host(renewed_ago=0))  # presumed dead
    held.renew()
    assert [t.host for t in lost] == ["tpu-worker-7"]
    held.release()  # not ours any more: left as the new holder wrote it
    assert lease.held_by(workdir).host == "tpu-worker-7"


_HOLD = """
import sys, time
from mlperf.lease import WorkdirLease
WorkdirLease.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def test_a_holder_killed_with_sigkill_frees_the_lease_on_its_machine(workdir, tmp_path):
    out = tmp_path / "holder.out"
    with open(out, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD, workdir],
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 60
        while "held" not in out.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        with pytest.raises(WorkdirHeldError, match=f"pid {proc.pid}, started "):
            WorkdirLease.acquire(workdir)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    held = WorkdirLease.acquire(workdir)  # its pid is gone: no wait for the TTL
    held.release()
    assert held.seq == 2


def test_the_exit_code_of_a_lost_lease_is_the_cli_one():
    from launch.cli import EXIT_WORKDIR_HELD

    assert lease.EXIT_LEASE_LOST == EXIT_WORKDIR_HELD


def test_a_run_holds_its_lease_until_result_json_is_written_and_frees_it_on_an_error(
    tmp_path, monkeypatch
):
    from conftest import small_bert_config

    from mlperf import train

    workdir = str(tmp_path / "run")
    config = small_bert_config(**{"train.steps": 2, "mesh.ici_shape": (8, 1)})
    held_at_write = []

    def write_result(path, result):
        held_at_write.append(lease.held_by(path))
        raise RuntimeError("result.json failed")

    monkeypatch.setattr(train, "write_result", write_result)
    with pytest.raises(RuntimeError, match="result.json failed"):
        train.run(config, workdir)
    assert held_at_write[0] is not None and held_at_write[0].pid == os.getpid()
    assert lease.held_by(workdir) is None  # released although write_result raised
