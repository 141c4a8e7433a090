"""launch/slurm.py: a run's coordinates from synthetic SLURM environments (2 nodes x 8
GPUs, one task per node and one task per GPU), partial or inconsistent environments as one
line naming the variable, and the sbatch template with a stand-in `srun`. The real
2-process run started with SLURM variables is in tests/system/test_supervise_runs.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from conftest import REPO, cpu_env

from launch import slurm

GPUS = ",".join(str(i) for i in range(8))
PORT = slurm.PORT_BASE + 734521 % 4096


def _env(**overrides: str | None) -> dict[str, str]:
    """Task 11 of 16: two nodes (gpu[007-008]) of 8 tasks, each node with 8 GPUs."""
    env = {
        "SLURM_JOB_ID": "734521",
        "SLURM_PROCID": "11",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "3",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NODELIST": "gpu[007-008]",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
        "CUDA_VISIBLE_DEVICES": GPUS,
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def test_one_task_per_node_owns_every_gpu_of_its_node():
    task = slurm.resolve(
        _env(
            SLURM_PROCID="1",
            SLURM_NTASKS="2",
            SLURM_LOCALID="0",
            SLURM_STEP_TASKS_PER_NODE="1(x2)",
        )
    )
    assert task.coordinator == f"gpu007:{PORT}"
    assert (task.num_processes, task.process_id, task.node, task.tasks_per_node) == (2, 1, 1, 1)
    assert task.gpus == tuple(GPUS.split(",")) and task.local_device_ids == tuple(range(8))
    assert task.describe().startswith("SLURM: process 1 of 2 (node 1, one task per node")


@pytest.mark.parametrize(
    "visible, gpus, ids",
    [(GPUS, ("3",), (3,)), ("3", ("3",), (0,))],
    ids=["sees-all-8", "bound-to-one"],
)
def test_one_task_per_gpu_owns_its_gpu(visible, gpus, ids):
    task = slurm.resolve(_env(CUDA_VISIBLE_DEVICES=visible))
    assert task.coordinator == f"gpu007:{PORT}"
    assert (task.num_processes, task.process_id, task.node, task.tasks_per_node) == (16, 11, 1, 8)
    assert task.gpus == gpus and task.local_device_ids == ids


def test_two_tasks_per_node_share_the_gpus_in_order_and_a_cpu_run_has_none():
    task = slurm.resolve(
        _env(
            SLURM_NTASKS="4", SLURM_PROCID="3", SLURM_LOCALID="1", SLURM_STEP_TASKS_PER_NODE="2(x2)"
        )
    )
    assert task.gpus == ("4", "5", "6", "7") and task.local_device_ids == (4, 5, 6, 7)
    assert slurm.resolve(_env(CUDA_VISIBLE_DEVICES=None)).local_device_ids is None


def test_the_project_port_overrides_the_job_id_one():
    assert slurm.resolve(_env(MULTIPOD_COORDINATOR_PORT="8476")).coordinator == "gpu007:8476"


@pytest.mark.parametrize(
    "overrides, names",
    [
        (
            {"SLURM_NTASKS": None},
            "SLURM_STEP_NUM_TASKS is not set (nor SLURM_NTASKS or SLURM_NPROCS)",
        ),
        ({"SLURM_LOCALID": None}, "SLURM_LOCALID is not set"),
        ({"SLURM_STEP_NODELIST": None}, "SLURM_STEP_NODELIST is not set"),
        ({"SLURM_JOB_ID": None}, "SLURM_JOB_ID is not set"),
        ({"SLURM_NTASKS": "sixteen"}, "SLURM_NTASKS='sixteen' is not a whole number"),
        ({"SLURM_PROCID": "16"}, "SLURM_PROCID=16 is not below SLURM_NTASKS=16"),
        ({"SLURM_STEP_NODELIST": "gpu007"}, "SLURM_STEP_NODELIST='gpu007' names 1 host(s)"),
        ({"SLURM_NTASKS": "15", "SLURM_PROCID": "1"}, "15 tasks over 2 nodes"),
        ({"SLURM_STEP_TASKS_PER_NODE": "8,7"}, "SLURM_STEP_TASKS_PER_NODE='8,7'"),
        ({"SLURM_LOCALID": "8"}, "SLURM_LOCALID=8 is not below the 8 task(s) per node"),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"}, "CUDA_VISIBLE_DEVICES='0,1,2,3,4,5' shows 6"),
    ],
)
def test_a_partial_or_inconsistent_environment_is_one_line_naming_the_variable(overrides, names):
    with pytest.raises(slurm.SlurmError) as raised:
        slurm.resolve(_env(**overrides))
    assert names in str(raised.value) and "\n" not in str(raised.value)


def test_host_lists_expand_as_slurm_writes_them():
    assert slurm.expand_hostlist("gpu[001-003,010],login") == [
        "gpu001",
        "gpu002",
        "gpu003",
        "gpu010",
        "login",
    ]
    assert slurm.expand_hostlist("r[1-2]-n[08-09]") == ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]
    with pytest.raises(slurm.SlurmError, match="cannot read the node list"):
        slurm.expand_hostlist("gpu[a-b]")


def test_launch_train_under_a_partial_slurm_environment_says_which_variable(tmp_path):
    env = {k: v for k, v in cpu_env(8).items() if not k.startswith(("SLURM_", "MULTIPOD_C"))}
    env.update(_env(SLURM_LOCALID=None, CUDA_VISIBLE_DEVICES=None))
    proc = subprocess.run(
        [sys.executable, "-m", "launch.train", "--config=configs/bert.py:tiny"]
        + [f"--workdir={tmp_path / 'w'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "multipod: error: SLURM: SLURM_LOCALID is not set" in proc.stderr


def test_the_sbatch_template_runs_launch_train_through_srun(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        SRUN_ARGS=str(tmp_path / "args"),
        WORKDIR="gs://bucket/run",
        SLURM_SUBMIT_DIR=REPO,
    )
    script = os.path.join(REPO, "launch", "slurm_gpu.sbatch")
    proc = subprocess.run(
        ["bash", script, "--config.train.steps=3"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "args").read_text().split("\n")[:-1] == [
        "--kill-on-bad-exit=1",
        ".venv/bin/python",
        "-m",
        "launch.train",
        "--config",
        "configs/bert.py:large",
        "--workdir",
        "gs://bucket/run",
        "--workdir_wait_s=300",
        "--config.train.steps=3",
    ]
    del env["WORKDIR"]
    proc = subprocess.run(["bash", script], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "set WORKDIR" in proc.stderr


def _stand_ins(tmp_path, srun_code: int) -> dict[str, str]:
    """PATH with a stand-in `srun` that records its words and exits `srun_code`, and a
    stand-in `scontrol` that records its words: the scheduler's side of the template."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, code in (("srun", srun_code), ("scontrol", 0)):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/{name}.args"\nexit {code}\n')
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        WORKDIR="gs://bucket/run",
        SLURM_SUBMIT_DIR=REPO,
        SLURM_JOB_ID="4242",
    )


@pytest.mark.parametrize(
    "code, restarts, requeued",
    [
        (143, "0", True),  # preempted or the time limit: a checkpoint was written
        (69, "3", True),  # the store was unreachable
        (4, "0", True),  # a peer died
        (143, "20", False),  # MAX_REQUEUES requeues already
        (2, "0", False),  # bad input
        (70, "0", False),  # a bug
        (1, "0", False),  # ended below its target
        (0, "0", False),  # reached its target
    ],
)
def test_the_sbatch_template_requeues_only_what_a_restart_can_help(
    tmp_path, code, restarts, requeued
):
    env = _stand_ins(tmp_path, code)
    env["SLURM_RESTART_COUNT"] = restarts
    script = os.path.join(REPO, "launch", "slurm_gpu.sbatch")
    proc = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr  # the job ends with the run's own code
    assert (tmp_path / "srun.args").exists()
    scontrol = tmp_path / "scontrol.args"
    if requeued:
        assert scontrol.read_text().split() == ["requeue", "4242"]
        assert f"the run ended with code {code} (" in proc.stderr
        assert f"requeueing job 4242 (restart {int(restarts) + 1} of at most 20)" in proc.stderr
    else:
        assert not scontrol.exists(), proc.stderr
        if code:
            assert "not requeued" in proc.stderr
        else:
            assert proc.stderr == ""


def test_restartable_says_what_a_code_means_and_whether_to_restart(capsys):
    from launch import restartable

    assert restartable.main(["69"]) == 0
    assert capsys.readouterr().out == "the object store was unreachable\n"
    assert restartable.main(["143"]) == 0 and restartable.main(["137"]) == 0
    assert restartable.main(["2"]) == 1
    assert "bad input" in capsys.readouterr().out
    assert restartable.main(["x"]) == 2 and restartable.main([]) == 2
    assert "give one exit code" in capsys.readouterr().err
