"""`launch.tpu supervise` against a stand-in `gcloud` (a script first on PATH that replays
TPU states and run outcomes and records every command): the exact command sequence of a
preemption and its recovery, bad input not retried, --max_restarts with backoff; the
supervised worker line's exit codes and process group under a real bash; the restart
rules of launch/supervisor.py. The work directory is in a bucket on a real GCS-protocol
server (the `gcs` fixture); nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO

from input_pipeline import storage
from launch import supervisor, tpu, tpu_supervise
from launch.supervisor import Backoff

WORKDIR = "gs://multipod-test/run"
TRAIN = ["python3", "-m", "launch.train", "--config", "configs/bert.py:tiny"]
TRAIN += ["--workdir", WORKDIR, "--tpu_pod"]
TARGET = tpu.Target("pod", "us-central2-b")

# Replays `plan.json`: each describe takes the next state (the last one repeats), each
# supervised run the next list of (host, exit code) markers; every call is logged.
FAKE_GCLOUD = """#!{python}
import json, os, sys
folder = os.environ["FAKE_GCLOUD_DIR"]
with open(os.path.join(folder, "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
with open(os.path.join(folder, "plan.json")) as f:
    plan = json.load(f)
args = sys.argv[1:]
if "describe" in args:
    state = plan["describe"].pop(0) if len(plan["describe"]) > 1 else plan["describe"][0]
    code = 0
    if state == "MISSING":
        print("ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: pod", file=sys.stderr)
        code = 1
    else:
        print(state)
elif any("multipod-exit-code" in a for a in args):
    markers = plan["run"].pop(0)
    for host, rc in markers:
        print(f"{{host}}: step 1/10")
        print(f"multipod-exit-code {{host}} {{rc}}")
    code = max((rc for _, rc in markers), default=255) or 0
else:
    code = 0
with open(os.path.join(folder, "plan.json"), "w") as f:
    json.dump(plan, f)
sys.exit(code)
"""


def _supervise(tmp_path, plan: dict, *flags: str) -> tuple[subprocess.CompletedProcess, list]:
    folder = tmp_path / "gcloud"
    folder.mkdir()
    (folder / "plan.json").write_text(json.dumps(plan))
    gcloud = folder / "gcloud"
    gcloud.write_text(FAKE_GCLOUD.format(python=sys.executable))
    gcloud.chmod(0o755)
    env = dict(os.environ, PATH=f"{folder}:{os.environ['PATH']}", FAKE_GCLOUD_DIR=str(folder))
    proc = subprocess.run(
        [sys.executable, "-m", "launch.tpu", "supervise", "--name=pod", "--zone=us-central2-b"]
        + ["--accelerator_type=v4-16", "--poll_s=0.01", *flags, "--", *TRAIN],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = folder / "calls.jsonl"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, [["gcloud", *c] for c in calls]


def _setup() -> list[list[str]]:
    return tpu.setup_commands(TARGET, tpu.code_sources(REPO))


def _run() -> list[str]:
    return tpu.run_commands(TARGET, tpu.shell_line(TRAIN), [], "v4-16", supervised=True)[0]


def _stop() -> list[str]:
    return [*tpu.TPU_VM, "ssh", "pod", "--worker=all", "--zone=us-central2-b"] + [
        f"--command={tpu.stop_line()}"
    ]


DESCRIBE = [*tpu.TPU_VM, "describe", "pod", "--zone=us-central2-b", "--format=value(state)"]
DELETE = [*tpu.TPU_VM, "delete", "pod", "--zone=us-central2-b", "--quiet"]
CREATE = [*tpu.TPU_VM, "create", "pod", "--zone=us-central2-b", "--accelerator-type=v4-16"]
CREATE += ["--version=tpu-ubuntu2204-base"]


def test_a_preempted_node_is_recreated_set_up_and_the_run_resumes(gcs, tmp_path):
    plan = {
        "describe": ["READY", "PREEMPTED", "READY"],
        "run": [[["t1v-0", 143], ["t1v-1", 4]], [["t1v-0", 0], ["t1v-1", 0]]],
    }
    proc, calls = _supervise(tmp_path, plan, "--backoff_s=0.01")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert calls == [
        DESCRIBE,  # READY: nothing to create
        *_setup(),
        _run(),  # worker 0 preempted (143), worker 1 lost its peer (4)
        DESCRIBE,  # PREEMPTED
        DELETE,
        CREATE,
        DESCRIBE,  # READY
        *_setup(),  # a recreated VM has an empty disk
        _run(),  # resumes from the bucket, reaches its target
    ]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("launch.tpu: attempt")]
    assert len(lines) == 2, proc.stderr
    assert re.match(
        r"launch\.tpu: attempt 1 ended after \d+ s: preempted \(checkpoint written\) on t1v-0 "
        r"\(exit 143\); TPU VM pod PREEMPTED; restart 1 of at most 20 in 0\.01 s\.",
        lines[0],
    ), lines[0]
    assert "attempt 2 ended after" in lines[1] and "the run reached its target (exit 0)" in lines[1]
    assert "lost before it started" in lines[1] and "without machines); not restarted." in lines[1]
    # The bookkeeping the run folds into its goodput ledger, in the bucket.
    record = json.loads(storage.read_text(f"{WORKDIR}/supervisor.json"))
    assert record["attempt"] == 2
    assert [a["exit_code"] for a in record["attempts"]] == [143, 0]
    (restart,) = record["restarts"]
    assert restart["after_attempt"] == 1 and 0 < restart["no_machines_s"] <= restart["seconds"]


def test_bad_input_is_not_retried(gcs, tmp_path):
    plan = {"describe": ["READY"], "run": [[["t1v-0", 2], ["t1v-1", 2]]]}
    proc, calls = _supervise(tmp_path, plan, "--backoff_s=0.01")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert calls == [DESCRIBE, *_setup(), _run(), DESCRIBE]
    assert "attempt 1 ended after" in proc.stderr
    assert "bad input on t1v-0, t1v-1 (exit 2)" in proc.stderr
    assert "not restarted." in proc.stderr and "restart 1" not in proc.stderr


def test_max_restarts_is_honoured_with_backoff_and_a_missing_tpu_is_created(gcs, tmp_path):
    preempted = [["t1v-0", 143], ["t1v-1", 143]]
    plan = {"describe": ["MISSING", "READY"], "run": [preempted] * 3}
    start = time.monotonic()
    proc, calls = _supervise(tmp_path, plan, "--max_restarts=2", "--backoff_s=0.2")
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert time.monotonic() - start >= 0.2 + 0.4  # the two waits
    again = [_stop(), _run(), DESCRIBE]  # still READY: end what is left of it, rerun
    assert calls == [DESCRIBE, CREATE, DESCRIBE, *_setup(), _run(), DESCRIBE, *again, *again]
    waits = re.findall(r"restart (\d) of at most 2 in ([0-9.]+) s\.", proc.stderr)
    assert waits == [("1", "0.2"), ("2", "0.4")]  # doubling
    assert "attempt 3 ended after" in proc.stderr
    assert "giving up after 2 restart(s) (--max_restarts)." in proc.stderr


def test_a_work_directory_another_run_holds_is_refused_before_any_gcloud_call(gcs, tmp_path):
    from mlperf.lease import Holder

    now = time.time()
    holder = Holder("laptop", 777, now - 60, now, 120.0, boot_id="x")
    storage.write_bytes(f"{WORKDIR}/lease/00000001.json", holder.to_json())
    proc, calls = _supervise(tmp_path, {"describe": ["READY"], "run": []})
    assert proc.returncode == 3 and calls == []
    assert "is in use by another run: host laptop, pid 777, started " in proc.stderr
    assert not storage.exists(f"{WORKDIR}/supervisor.json")


def test_supervise_refuses_a_work_directory_on_the_vm_disk():
    proc = subprocess.run(
        [sys.executable, "-m", "launch.tpu", "supervise", "--name=pod", "--zone=z"]
        + ["--accelerator_type=v4-8", "--", "python3", "-m", "launch.train", "--workdir=/tmp/r"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "supervise needs the run's --workdir in a bucket (gs://BUCKET/RUN), got /tmp/r" in (
        proc.stderr
    )


def _plan(workers: int = 2) -> tpu_supervise.TpuPlan:
    return tpu_supervise.TpuPlan([], [], [], [], [], [], workers, WORKDIR, "TPU VM pod")


@pytest.mark.parametrize(
    "codes, returncode, expected",
    [
        ({"a": 0, "b": 0}, 0, 0),
        ({"a": 143, "b": 4}, 143, 143),  # the root cause, not the peer that followed it
        ({"a": 4, "b": 4}, 4, 4),
        ({"a": 0}, 255, 255),  # b never reported: its ssh or host went away
        ({}, 255, 255),
        ({"a": 70, "b": 4}, 70, 70),
    ],
)
def test_the_attempt_code_comes_from_the_workers_markers(codes, returncode, expected):
    sup = tpu_supervise.TpuSupervisor(_plan(), 3, Backoff(0, 0))
    assert sup._outcome(codes, returncode).code == expected


def _worker_line(command: str, home) -> subprocess.Popen:
    (home / "multipod").mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        ["bash", "-c", tpu.supervised_run_line(command, [("GREETING", "a b")])],
        env=dict(os.environ, HOME=str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )


@pytest.mark.parametrize(
    "command, code", [("echo $GREETING; exit 143", 143), ("kill -9 $$", 137), ("true", 0)]
)
def test_the_supervised_worker_line_reports_the_command_code(tmp_path, command, code):
    proc = _worker_line(command, tmp_path)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == code
    assert out.splitlines()[-1] == f"{tpu_supervise.EXIT_MARKER} {os.uname().nodename} {code}"


def test_the_stop_line_ends_the_whole_process_group_of_an_attempt(tmp_path):
    proc = _worker_line("sleep 300 & sleep 300; wait", tmp_path)
    pgid_file = tmp_path / "multipod_logs" / "run.pgid"
    deadline = time.monotonic() + 20
    while not pgid_file.exists() or not pgid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    group = int(pgid_file.read_text())
    subprocess.run(
        ["bash", "-c", tpu.stop_line()], env=dict(os.environ, HOME=str(tmp_path)), timeout=30
    )
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert out.splitlines()[-1].endswith(f" {128 + signal.SIGTERM}")
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)
    assert not pgid_file.exists()


@pytest.mark.parametrize(
    "code, retry",
    [(0, False), (1, False), (2, False), (70, False), (130, False), (3, True), (4, True)]
    + [(69, True), (75, True), (137, True), (143, True), (255, True), (-9, True), (5, False)],
)
def test_which_exit_codes_are_restarted(code, retry):
    assert supervisor.classify(code)[0] is retry


def test_the_backoff_doubles_up_to_its_cap_and_resets_after_a_long_attempt():
    b = Backoff(base_s=10, max_s=35)
    assert [b.next(5) for _ in range(4)] == [10, 20, 35, 35]
    assert b.next(supervisor.HEALTHY_S) == 10


@pytest.mark.parametrize(
    "words",
    [
        ["python", "-m", "launch.train", "--workdir", "gs://b/r"],
        ["python", "-m", "launch.train", "--workdir_wait_s=5", "--workdir=gs://b/r"],
        ["cd x && python -m launch.train --workdir 'gs://b/r' --tpu_pod"],
    ],
)
def test_the_work_directory_is_read_from_the_command(words):
    assert supervisor.workdir_of(words) == "gs://b/r"


def test_a_resume_folds_the_supervisors_restarts_into_the_ledger_once(tmp_path):
    from mlperf.goodput import Goodput

    workdir = str(tmp_path)
    Goodput(train_s=100.0, train_steps=10, last_step=10, attempts=2).write(workdir)
    record = {
        "attempt": 4,  # the third attempt died before it wrote the ledger
        "restarts": [
            {"after_attempt": 1, "seconds": 30.0, "no_machines_s": 0.0},
            {"after_attempt": 2, "seconds": 500.0, "no_machines_s": 420.0},
            {"after_attempt": 3, "seconds": 5.0, "no_machines_s": 0.0},
        ],
    }
    (tmp_path / "supervisor.json").write_text(json.dumps(record))
    ledger = Goodput.read(workdir)
    ledger.resumed_at(10)
    assert ledger.no_machines_s == pytest.approx(420.0)
    assert ledger.restart_lost_s == pytest.approx(30.0 + 80.0 + 5.0)
    assert ledger.as_dict()["attempts"] == 4 and ledger.as_dict()["no_machines_s"] == 420.0
    ledger.write(workdir)
    again = Goodput.read(workdir)  # the same restarts are not counted twice
    assert again.no_machines_s == pytest.approx(420.0)
    assert again.restart_lost_s == pytest.approx(115.0)


def test_several_slices_are_one_queued_resource_recreated_whole():
    target = tpu.Target("ms", "us-east5-a", num_slices=2)
    plan = tpu.supervise_plan(target, "v5p-128", TRAIN, [], ["/src/launch"], spot=True)
    assert plan.describe == [*tpu.QUEUED, "describe", "ms", "--zone=us-east5-a"] + [
        "--format=value(state.state)"
    ]
    assert plan.delete == [[*tpu.QUEUED, "delete", "ms", "--zone=us-east5-a", "--force", "--quiet"]]
    assert plan.create == tpu.create_commands(target, "v5p-128", spot=True)
    assert plan.workers == 32  # 16 hosts per slice
    for cmd in (plan.run, *plan.stop):
        assert cmd[:8] == [*tpu.QUEUED, "ssh", "ms", "--node=all", "--worker=all"]
        assert "--batch-size=32" in cmd
    assert "multipod-exit-code" in plan.run[-1] and "run.pgid" in plan.stop[0][-1]
    assert plan.what == "queued resource ms" and plan.workdir == WORKDIR
