"""launch/gke.py: the JobSet manifests of 2 slices of v5e:16x16 and of one v4:8x8x8 slice
against golden files, read back with a YAML reader (replicas, hosts, node selectors,
restarts, the command and the jax.distributed environment); `apply` through a stand-in
`kubectl`; bad input in one line.

The golden files are written by the commands in GOLDEN (run them from the repository
root with `--output tests/golden/<file>` to update them after a deliberate change)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO

from launch import gke, supervisor

IMAGE = "us-docker.pkg.dev/proj/multipod:latest"
TRAIN = ["python3", "-m", "launch.train", "--config", "configs/bert.py:mlperf_v07"]
GOLDEN = {
    "jobset_v5e_16x16_2_slices.yaml": (
        ["--name=bert", "--topology=v5e:16x16", "--num_slices=2", "--max_restarts=8"],
        [*TRAIN, "--workdir", "gs://bucket/bert_v5e"],
    ),
    "jobset_v4_8x8x8.yaml": (
        ["--name=bert-v4", "--topology=v4:8x8x8"],
        [*TRAIN, "--workdir", "gs://bucket/bert_v4"],
    ),
}


def _cli(*args: str, env: dict | None = None, stdin: str | None = None):
    return subprocess.run(
        [sys.executable, "-m", "launch.gke", *args],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("golden", sorted(GOLDEN))
def test_the_manifest_is_the_golden_file(golden):
    flags, words = GOLDEN[golden]
    proc = _cli("jobset", *flags, f"--image={IMAGE}", "--", *words)
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(REPO, "tests", "golden", golden)) as f:
        assert proc.stdout == f.read()


def _pods(manifest: dict) -> list[tuple[dict, dict]]:
    """(job spec, container) of every replicatedJob."""
    out = []
    for rjob in manifest["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        (container,) = job["template"]["spec"]["containers"]
        out.append((job, container))
    return out


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def test_two_v5e_slices_read_back_as_two_jobs_of_64_hosts():
    words = GOLDEN["jobset_v5e_16x16_2_slices.yaml"][1]
    text = gke.to_yaml(gke.jobset("bert", "v5e:16x16", 2, IMAGE, words, 8))
    manifest = yaml.safe_load(text)
    assert manifest["kind"] == "JobSet" and manifest["spec"]["failurePolicy"]["maxRestarts"] == 8
    rjobs = manifest["spec"]["replicatedJobs"]
    assert [r["name"] for r in rjobs] == ["slice-0", "slice-1"]
    assert all(r["replicas"] == 1 for r in rjobs)
    for s, (job, container) in enumerate(_pods(manifest)):
        assert job["parallelism"] == job["completions"] == 64  # 256 chips, 4 per host
        assert job["completionMode"] == "Indexed"
        assert job["template"]["spec"]["nodeSelector"] == {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
            "cloud.google.com/gke-tpu-topology": "16x16",
        }
        assert container["resources"]["limits"]["google.com/tpu"] == 4
        assert _env(container) == {
            "MULTIPOD_COORDINATOR": "bert-slice-0-0-0.bert:8476",
            "MULTIPOD_NUM_PROCESSES": "128",
            "MEGASCALE_COORDINATOR_ADDRESS": "bert-slice-0-0-0.bert",
            "MEGASCALE_NUM_SLICES": "2",
            "MEGASCALE_SLICE_ID": str(s),
            "MEGASCALE_PORT": "8080",
        }
        shell, flag, script = container["command"]
        assert (shell, flag) == ("bash", "-c")
        assert script == (
            f"export MULTIPOD_PROCESS_ID=$(( {64 * s} + JOB_COMPLETION_INDEX )) && exec "
            "python3 -m launch.train --config configs/bert.py:mlperf_v07 "
            "--workdir gs://bucket/bert_v5e --workdir_wait_s=300"
        )


def test_only_codes_a_restart_can_help_restart_the_jobset():
    """A pod's final code (bad input 2, a bug 70, the run ended below its target 1) fails
    its Job by the pod failure policy, and the JobSet fails on that reason instead of
    restarting; every other failure (143 preempted, 4 a peer lost, 69 the store
    unreachable, a node gone) restarts it, as the supervisors do."""
    words = [*TRAIN, "--workdir", "gs://bucket/b"]
    manifest = yaml.safe_load(gke.to_yaml(gke.jobset("b", "v5e:16x16", 2, IMAGE, words, 5)))
    policy = manifest["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 5
    (rule,) = policy["rules"]
    assert rule["action"] == "FailJobSet" and rule["onJobFailureReasons"] == ["PodFailurePolicy"]
    for job, container in _pods(manifest):
        (pod_rule,) = job["podFailurePolicy"]["rules"]
        on = pod_rule["onExitCodes"]
        assert pod_rule["action"] == "FailJob" and on["operator"] == "In"
        assert on["containerName"] == container["name"] and job["backoffLimit"] == 0
        assert on["values"] == [1, 2, 70]
        for code in on["values"]:
            assert supervisor.classify(code)[0] is False
        for code in (3, 4, 69, 75, 143):
            assert supervisor.classify(code)[0] is True and code not in on["values"]
        # The container's code is launch.train's own: bash execs it.
        assert " && exec python3 -m launch.train " in container["command"][2]


def test_one_v4_slice_reads_back_as_one_job_of_128_hosts():
    with open(os.path.join(REPO, "tests", "golden", "jobset_v4_8x8x8.yaml")) as f:
        manifest = yaml.safe_load(f)
    assert manifest["metadata"]["name"] == "bert-v4"
    assert manifest["spec"]["failurePolicy"]["maxRestarts"] == 10
    ((job, container),) = _pods(manifest)
    assert job["parallelism"] == job["completions"] == 128  # 512 chips, 4 per host
    assert job["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "8x8x8"
    assert _env(container) == {
        "MULTIPOD_COORDINATOR": "bert-v4-slice-0-0-0.bert-v4:8476",
        "MULTIPOD_NUM_PROCESSES": "128",
    }
    assert "--workdir gs://bucket/bert_v4 --workdir_wait_s=300" in container["command"][2]


@pytest.mark.parametrize(
    "topology, hosts, chips",
    [("v5e:2x4", 1, 8), ("v6e:4x4", 4, 4), ("v5p:2x2x1", 1, 4), ("v4:4x4x4", 16, 4)],
)
def test_hosts_per_slice_follow_the_topology(topology, hosts, chips):
    assert gke.slice_shape(topology) == (hosts, chips)


def test_the_yaml_writer_round_trips_awkward_strings():
    value = {"a": ["yes", "1.5", "x: y", "", "naïve", "#c", "-"], "b": {}, "c": [], "d": True}
    assert yaml.safe_load(gke.to_yaml(value)) == value


def test_apply_pipes_the_manifest_to_kubectl(tmp_path):
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\ncat > {tmp_path}/manifest\n')
    kubectl.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    flags, words = GOLDEN["jobset_v4_8x8x8.yaml"]
    proc = _cli("apply", *flags, f"--image={IMAGE}", "--", *words, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "args").read_text().split() == ["apply", "-f", "-"]
    with open(os.path.join(REPO, "tests", "golden", "jobset_v4_8x8x8.yaml")) as f:
        assert (tmp_path / "manifest").read_text() == f.read()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--topology=v3:4x4"], "--topology 'v3:4x4': use <generation>:<AxB[xC]> with a gen"),
        (["--topology=v4:8x8"], "a v4 slice is AxBxC chips"),
        (["--topology=v5e:4x4", "--name=Bad_Name"], "--name 'Bad_Name': use lower-case"),
        (
            ["--topology=v5e:4x4", "--", "python3", "-m", "launch.train", "--workdir=/tmp/r"],
            "got /tmp/r",
        ),
    ],
)
def test_bad_input_is_one_line(args, message):
    base = ["jobset", "--name=bert", f"--image={IMAGE}"]
    if "--" not in args:
        args = [*args, "--", *TRAIN, "--workdir", "gs://b/r"]
    proc = _cli(*base, *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_apply_without_kubectl_says_so(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # no kubectl there
    flags, words = GOLDEN["jobset_v4_8x8x8.yaml"]
    proc = subprocess.run(
        [sys.executable, "-m", "launch.gke", "apply", *flags, f"--image={IMAGE}", "--", *words],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "kubectl not found" in proc.stderr
