"""Whole runs with the work directory in a bucket, on a real GCS-protocol server
(fake-gcs-server on 127.0.0.1, launch/gcs_emulator.py): a bert:tiny run that ends at a
target, whose logs, result and checkpoints are objects and whose MLPerf log passes the
compliance checker but for BERT-large's target (`make quality` runs the same config to
its real target in a local folder); SIGKILL and an exact resume from the bucket; two
processes saving and one process resuming resharded; the server gone in the middle of a
save and at the next start (exit code 69 both times); hosts that see different checkpoints."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import REPO, compliance_check, cpu_env, tiny_train_command
from tiny_bert_runs import EVERY, OVERRIDES, STEPS

from input_pipeline import storage
from launch.cli import EXIT_STORE_UNREACHABLE
from launch.gcs_emulator import GcsServer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bucket")]

BUCKET = "multipod-test"
# What every result.json holds (docs/benchmarks.md, "What a run writes").
RESULT_KEYS = {
    "benchmark",
    "variant",
    "steps",
    "samples",
    "reached_target",
    "time_to_target_s",
    "train_loss",
    "eval",
    "mesh",
    "devices",
    "processes",
    "params_fingerprint",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("gcs")
    gcs = GcsServer(str(root / "objects"))
    gcs.start()
    gcs.create_bucket(BUCKET)
    yield gcs
    gcs.stop()


def _env(server: GcsServer, devices: int = 8, **extra: str) -> dict[str, str]:
    return {**cpu_env(devices), **server.env(), **extra}


def _objects(server: GcsServer, prefix: str) -> list[str]:
    return [name[len(prefix) + 1 :] for name in server.objects(BUCKET, prefix + "/")]


def _committed(server: GcsServer, prefix: str) -> list[int]:
    """Checkpoint steps under `prefix` with orbax's commit marker, oldest first."""
    names = _objects(server, prefix)
    marker = "/commit_success.txt"
    steps = {n.split("/")[1] for n in names if n.startswith("checkpoints/")}
    return sorted(int(s) for s in steps if s.isdigit() and f"checkpoints/{s}{marker}" in names)


@contextlib.contextmanager
def _clients_on(server: GcsServer) -> Iterator[None]:
    """This process's path layer pointed at `server` for the block (then restored)."""
    saved = dict(os.environ)
    os.environ.update(server.env())
    _fresh_gcsfs()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        _fresh_gcsfs()


def _read(server: GcsServer, url: str, tmp_path) -> str:
    """An object's text, read through the project's own path layer."""
    local = tmp_path / f"copy-{abs(hash(url))}"
    with _clients_on(server):
        storage.download(url, str(local))
    return local.read_text()


def _fresh_gcsfs() -> None:
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()


def _run(cmd, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _run_until(cmd, cwd, env, line_start: str, action) -> tuple[int, str]:
    """Starts `cmd`, calls `action(proc)` once a line starts with `line_start`."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output = []
    for line in proc.stdout:
        output.append(line)
        if line.startswith(line_start):
            action(proc)
            break
    rest, _ = proc.communicate(timeout=600)
    return proc.returncode, "".join(output) + rest


def _train(workdir, *overrides: str) -> list[str]:
    """`python -m launch.train` on bert:tiny, runnable from any folder."""
    cmd = tiny_train_command(workdir, *overrides)
    cmd[cmd.index("configs/bert.py:tiny")] = os.path.join(REPO, "configs", "bert.py") + ":tiny"
    return cmd


def _fingerprint(result_text: str) -> str:
    return json.loads(result_text)["params_fingerprint"]


def test_a_tiny_bert_run_to_its_target_keeps_everything_in_the_bucket(server, tmp_path):
    """The shared 1-layer run with a target its first eval (step 4) reaches: a run that
    ends at its target, as `make quality`'s bert:tiny does after its ~100 steps."""
    url = f"gs://{BUCKET}/target"
    at_first_eval = ["--config.train.target=0.0", "--config.train.stop_at_target=True"]
    proc = _run(_train(url, *OVERRIDES, *at_first_eval), cwd=tmp_path, env=_env(server))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no free-space check there" in proc.stdout
    names = _objects(server, "target")
    for name in ("result.json", "mllog.txt", "metrics.jsonl", "goodput.json"):
        assert name in names, names
    assert any(n.startswith("tensorboard/") and "tfevents" in n for n in names), names
    committed = [n for n in names if n.startswith("checkpoints/") and "commit_success" in n]
    assert committed, names
    result = json.loads(_read(server, f"{url}/result.json", tmp_path))
    assert result["reached_target"] and result["mllog"] == f"{url}/mllog.txt"
    assert result["steps"] == 4 and result["status"] == "success", result
    assert RESULT_KEYS <= set(result), sorted(RESULT_KEYS - set(result))
    assert result["mesh"] == {"data": 2, "model": 4} and result["devices"] == 8
    assert len(result["params_fingerprint"]) == 64
    mllog = tmp_path / "mllog.txt"
    mllog.write_text(_read(server, f"{url}/mllog.txt", tmp_path))
    output, failures = compliance_check(mllog)
    # The tiny run's accuracy is far below BERT-large's 0.712, which the checker enforces.
    assert failures == [
        "WARNING -  Failed checks for eval_accuracy : v['value'] >= 0.712 and v['value'] < 1.0"
    ], output
    # Nothing of the bucket became a local folder.
    assert not any(p.name.startswith("gs:") for p in tmp_path.iterdir())


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """The shared 12-step run (tests/tiny_bert_runs.py) in a local work directory."""
    workdir = tmp_path_factory.mktemp("reference")
    proc = _run(tiny_train_command(workdir, *OVERRIDES), cwd=REPO, env=cpu_env(8))
    assert proc.returncode == 1, proc.stdout[-3000:]  # its target is out of reach
    return workdir


def test_sigkill_then_the_same_command_resumes_from_the_bucket_exactly(
    server, local_reference, tmp_path
):
    url = f"gs://{BUCKET}/killed"
    cmd = _train(url, *OVERRIDES)
    code, out = _run_until(cmd, tmp_path, _env(server), "step      7/", lambda p: p.kill())
    assert code == -signal.SIGKILL, out[-3000:]
    newest = _committed(server, "killed")[-1]
    assert newest >= 4, _objects(server, "killed")
    proc = _run(cmd, cwd=tmp_path, env=_env(server))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resuming from {url}/checkpoints/{newest} (step {newest})" in proc.stdout
    want = _fingerprint((local_reference / "result.json").read_text())
    assert _fingerprint(_read(server, f"{url}/result.json", tmp_path)) == want
    # The logs were cut back to the checkpoint and continued: one line per step.
    lines = _read(server, f"{url}/metrics.jsonl", tmp_path).splitlines()
    steps = [json.loads(x)["step"] for x in lines if json.loads(x)["kind"] == "train"]
    assert steps == list(range(1, STEPS + 1)), steps


def test_two_processes_save_to_the_bucket_and_one_process_resumes_resharded(
    server, local_reference, tmp_path
):
    url = f"gs://{BUCKET}/procs"
    train = _train(url, *OVERRIDES)
    two = [sys.executable, "-m", "launch.local", "--processes=2", "--devices_per_process=4"]
    proc = _run([*two, "--", *train], cwd=tmp_path, env=_env(server, 4))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _committed(server, "procs") == list(range(EVERY, STEPS + 1, EVERY))
    # The checkpoints after step 6 lost: one process of 8 devices resumes from step 6.
    _delete_checkpoints_after(server, f"{url}/checkpoints", 6)
    proc = _run(train, cwd=tmp_path, env=_env(server, 8))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resuming from {url}/checkpoints/6 (step 6)" in proc.stdout
    assert "the checkpoint was written by 2 (resharded)" in proc.stdout
    got = _losses(_read(server, f"{url}/metrics.jsonl", tmp_path))
    want = _losses((local_reference / "metrics.jsonl").read_text())
    assert sorted(got) == sorted(want)
    np.testing.assert_allclose(
        [got[s] for s in sorted(got)], [want[s] for s in sorted(want)], rtol=1e-5
    )


def _delete_checkpoints_after(server: GcsServer, directory: str, step: int) -> None:
    with _clients_on(server):
        for name in storage.listdir(directory):
            if name.isdigit() and int(name) > step:
                storage.rmtree(storage.join(directory, name))


def _losses(jsonl: str) -> dict[int, float]:
    records = [json.loads(line) for line in jsonl.splitlines()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def test_the_store_gone_in_the_middle_of_a_save_loses_nothing(server, local_reference, tmp_path):
    url = f"gs://{BUCKET}/outage"
    cmd = _train(url, *OVERRIDES)
    # Few retries and a short bound per store call: the outage is found in seconds.
    env = _env(server, MULTIPOD_STORE_RETRIES="1", MULTIPOD_STORE_TIMEOUT_S="5")
    stopped = threading.Event()

    def stop_when_step_4_is_being_written() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not stopped.is_set():
            if server.objects(BUCKET, "outage/checkpoints/4/"):
                server.stop()
                stopped.set()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=stop_when_step_4_is_being_written, daemon=True)
    watcher.start()
    proc = _run(cmd, cwd=tmp_path, env=env)
    watcher.join(timeout=5)
    assert stopped.is_set(), proc.stdout[-3000:]
    said = proc.stdout + proc.stderr
    failed = f"gs://{BUCKET}: writing checkpoint {url}/checkpoints/4 (step 4) failed"
    lines = [line for line in said.splitlines() if failed in line]
    # Exit 69, the code a supervisor starts again: nothing is lost, the store was gone.
    assert proc.returncode == EXIT_STORE_UNREACHABLE and len(lines) == 1, said[-4000:]
    assert "the store is unreachable" in lines[0] and "complete checkpoints kept: [2]" in lines[0]
    assert "The same command continues once the store answers" in lines[0]
    assert "Traceback" not in said
    # Started again while the store is still gone: one line at start, the same code.
    proc = _run(cmd, cwd=tmp_path, env=env)
    assert proc.returncode == EXIT_STORE_UNREACHABLE, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("multipod: error:")]
    assert len(errors) == 1 and "the store is unreachable" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "compiled" not in proc.stdout
    server.start()  # the same folder: everything written before the outage is there
    proc = _run(cmd, cwd=tmp_path, env=_env(server))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resuming from {url}/checkpoints/{EVERY} (step {EVERY})" in proc.stdout
    want = _fingerprint((local_reference / "result.json").read_text())
    assert _fingerprint(_read(server, f"{url}/result.json", tmp_path)) == want


def test_hosts_that_see_different_newest_checkpoints_stop_before_compiling(
    local_reference, tmp_path
):
    # Each host's work directory on its own disk: one holds the reference's checkpoints,
    # the other none. The same command (a relative --workdir) on both.
    for host in ("host0", "host1"):
        (tmp_path / host).mkdir()
    shutil.copytree(local_reference / "checkpoints", tmp_path / "host0" / "run" / "checkpoints")
    port = _free_port()
    procs = []
    for i in range(2):
        cmd = _train("run", *OVERRIDES)
        cmd += [f"--coordinator=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=tmp_path / f"host{i}",
                env=cpu_env(4),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 2, out[-2000:] + err[-2000:]
        lines = [line for line in err.splitlines() if "multipod: error" in line]
        assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
        assert 'newest checkpoint step: process 0 has 12; process 1 has "none"' in lines[0]
        assert "workdir: process 0 has" in lines[0]
        assert "compiled" not in out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
