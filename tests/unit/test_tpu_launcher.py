"""launch/tpu.py: the exact gcloud commands, the worker table, dry-run output, bad input.

Nothing here calls the real gcloud: commands are checked as argv lists, the CLI runs with
--dry_run, and the one non-dry run uses a fake `gcloud` script on PATH.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from launch import tpu

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TPU_VM = ["gcloud", "compute", "tpus", "tpu-vm"]
QUEUED = ["gcloud", "compute", "tpus", "queued-resources"]
TRAIN = [
    "python",
    "-m",
    "launch.train",
    "--config",
    "configs/bert.py:tiny",
    "--workdir",
    "/tmp/a b",
]


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.tpu", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _command_flag(argv: list[str]) -> str:
    """The value of the single --command=... argument."""
    values = [a.removeprefix("--command=") for a in argv if a.startswith("--command=")]
    assert len(values) == 1, argv
    return values[0]


@pytest.mark.parametrize(
    "accelerator_type, hosts",
    [
        ("v3-8", 1),
        ("v3-32", 4),
        ("v3-2048", 256),
        ("v3-8192", 1024),
        ("v2-8", 1),
        ("v4-8", 1),
        ("v4-512", 64),
        ("v5p-8", 1),
        ("v5p-128", 16),
        ("v5litepod-4", 1),
        ("v5litepod-8", 1),
        ("v5litepod-16", 4),
        ("v5litepod-256", 64),
        ("v6e-8", 1),
        ("v6e-256", 64),
    ],
)
def test_hosts_for(accelerator_type, hosts):
    assert tpu.hosts_for(accelerator_type) == hosts


@pytest.mark.parametrize(
    "bad", ["v9-8", "v3-7", "abc", "", "V4-8", "v3-12", "v4-12", "v5litepod-2", "v6e-512"]
)
def test_hosts_for_rejects_bad_types_listing_valid_forms(bad):
    with pytest.raises(ValueError) as e:
        tpu.hosts_for(bad)
    message = str(e.value)
    assert repr(bad) in message or bad in message
    for form in ("v3-N", "v4-N", "v5p-N", "v5litepod-N", "v6e-N"):
        assert form in message


def test_default_runtime_versions():
    assert tpu.default_runtime_version("v3-8") == "tpu-ubuntu2204-base"
    assert tpu.default_runtime_version("v4-512") == "tpu-ubuntu2204-base"
    assert tpu.default_runtime_version("v5litepod-256") == "v2-alpha-tpuv5-lite"
    assert tpu.default_runtime_version("v5p-128") == "v2-alpha-tpuv5"
    assert tpu.default_runtime_version("v6e-256") == "v2-alpha-tpuv6e"


def test_create_single_slice():
    target = tpu.Target("pod", "us-central2-b")
    assert tpu.create_commands(target, "v4-512") == [
        [
            *TPU_VM,
            "create",
            "pod",
            "--zone=us-central2-b",
            "--accelerator-type=v4-512",
            "--version=tpu-ubuntu2204-base",
        ]
    ]


def test_create_single_slice_spot_project_and_version():
    target = tpu.Target("pod", "europe-west4-a", project="proj")
    assert tpu.create_commands(target, "v3-8", runtime_version="tpu-vm-base", spot=True) == [
        [
            *TPU_VM,
            "create",
            "pod",
            "--zone=europe-west4-a",
            "--accelerator-type=v3-8",
            "--version=tpu-vm-base",
            "--spot",
            "--project=proj",
        ]
    ]


def test_create_multislice_uses_one_queued_resource():
    target = tpu.Target("ms", "us-east5-a", num_slices=4)
    assert tpu.create_commands(target, "v5p-128", spot=True) == [
        [
            *QUEUED,
            "create",
            "ms",
            "--node-count=4",
            "--node-prefix=ms",
            "--zone=us-east5-a",
            "--accelerator-type=v5p-128",
            "--runtime-version=v2-alpha-tpuv5",
            "--spot",
        ]
    ]


def test_create_rejects_bad_type_before_building():
    with pytest.raises(ValueError, match="unknown accelerator type 'v9-8'"):
        tpu.create_commands(tpu.Target("pod", "z"), "v9-8")


def test_setup_cleans_copies_and_installs_on_all_workers():
    target = tpu.Target("pod", "z", project="p")
    sources = ["/src/launch", "/src/pyproject.toml"]
    scope = ["--zone=z", "--project=p"]
    assert tpu.setup_commands(target, sources) == [
        [
            *TPU_VM,
            "ssh",
            "pod",
            "--worker=all",
            *scope,
            "--command=rm -rf ~/multipod && mkdir -p ~/multipod",
        ],
        [*TPU_VM, "scp", "--recurse", *sources, "pod:~/multipod", "--worker=all", *scope],
        [
            *TPU_VM,
            "ssh",
            "pod",
            "--worker=all",
            *scope,
            "--command=cd ~/multipod && ( python3 -m pip install --user --upgrade uv || "
            "python3 -m pip install --user --upgrade --break-system-packages uv ) && "
            "~/.local/bin/uv venv --python 3.11 ~/multipod/.venv && "
            '~/.local/bin/uv pip install --python ~/multipod/.venv/bin/python -e ".[tpu]"',
        ],
    ]


def test_setup_without_a_python_version_installs_into_the_image_python():
    [*_, install] = tpu.setup_commands(tpu.Target("pod", "z"), ["/src"], "python3.11", "")
    assert _command_flag(install) == 'cd ~/multipod && python3.11 -m pip install -e ".[tpu]"'


@pytest.mark.parametrize(
    "accelerator_type, runtime",
    [
        ("v4-512", "tpu-ubuntu2204-base"),
        ("v5litepod-256", "v2-alpha-tpuv5-lite"),
        ("v5p-1024", "v2-alpha-tpuv5"),
        ("v6e-256", "v2-alpha-tpuv6e"),
    ],
)
def test_dry_run_create_and_setup_for_each_current_generation(accelerator_type, runtime):
    proc = _cli(
        "create", "--name=p", "--zone=z", f"--accelerator_type={accelerator_type}", "--dry_run"
    )
    assert proc.returncode == 0, proc.stderr
    assert shlex.split(proc.stdout) == [
        *TPU_VM,
        "create",
        "p",
        "--zone=z",
        f"--accelerator-type={accelerator_type}",
        f"--version={runtime}",
    ]
    proc = _cli("setup", "--name=p", "--zone=z", "--dry_run")
    install = shlex.split(proc.stdout.splitlines()[-1])
    assert "uv venv --python 3.11 ~/multipod/.venv" in _command_flag(install)


def test_setup_multislice_covers_every_node():
    commands = tpu.setup_commands(tpu.Target("ms", "z", num_slices=3), ["/src/launch"])
    assert len(commands) == 9
    assert [c[5] for c in commands if c[4] == "ssh"] == ["ms-0", "ms-0", "ms-1", "ms-1"] + [
        "ms-2",
        "ms-2",
    ]
    assert [c[-3] for c in commands if c[4] == "scp"] == [f"ms-{i}:~/multipod" for i in range(3)]


def test_code_sources_skip_venv_git_and_caches(tmp_path):
    for name in (".venv", ".git", "launch", "build", "__pycache__", "multipod.egg-info"):
        (tmp_path / name).mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    names = [os.path.basename(p) for p in tpu.code_sources(str(tmp_path))]
    assert names == ["launch", "pyproject.toml"]
    real = [os.path.basename(p) for p in tpu.code_sources(REPO)]
    assert {"launch", "parallel", "pyproject.toml"} <= set(real) and ".venv" not in real


def test_run_single_slice_env_and_quoting():
    target = tpu.Target("pod", "z")
    line = tpu.shell_line(TRAIN)
    env = tpu.parse_env(["XLA_FLAGS=--xla_a=1 --xla_b=2", "NAME=it's"])
    [cmd] = tpu.run_commands(target, line, env)
    assert cmd[:8] == [*TPU_VM, "ssh", "pod", "--worker=all", "--zone=z"]
    remote = _command_flag(cmd)
    assert remote.startswith("cd ~/multipod && mkdir -p ~/multipod_logs && ")
    assert ' && export PATH="$HOME/multipod/.venv/bin:$PATH" && ' in remote
    assert "export XLA_FLAGS='--xla_a=1 --xla_b=2'" in remote
    assert shlex.split(remote.split("export NAME=")[1].split(" && ")[0]) == ["it's"]
    assert remote.endswith(" ) 2>&1 | tee ~/multipod_logs/run.log")
    user = remote.split("( ", 1)[1].rsplit(" )", 1)[0]
    assert shlex.split(user) == TRAIN


def test_shell_line_one_word_is_a_shell_line_several_are_argv():
    assert tpu.shell_line(["ls ~/multipod_logs && df -h"]) == "ls ~/multipod_logs && df -h"
    assert tpu.shell_line(["echo", "a b", "it's"]) == "echo 'a b' 'it'\"'\"'s'"
    with pytest.raises(ValueError, match="after `--`"):
        tpu.shell_line([])


@pytest.mark.parametrize("bad", ["NOEQUALS", "1X=2", "A-B=3", "=v"])
def test_parse_env_rejects_bad_pairs(bad):
    with pytest.raises(ValueError, match="KEY=VALUE"):
        tpu.parse_env([bad])


def test_remote_line_runs_in_bash_tees_and_keeps_exit_code(tmp_path):
    """The worker-side line itself, run by bash with HOME=tmp: env, quoting, log, status."""
    (tmp_path / "multipod").mkdir()
    program = "import os, sys; print(sys.argv[1:], os.environ['FOO'], os.getcwd()); sys.exit(3)"
    line = tpu.shell_line([sys.executable, "-c", program, "a b", "it's"])
    remote = tpu.remote_run_line(line, [("FOO", "x 'y' $z")])
    proc = subprocess.run(
        ["bash", "-c", remote],
        env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3  # pipefail: the command's status, not tee's
    expected = f"['a b', \"it's\"] x 'y' $z {tmp_path / 'multipod'}"
    assert proc.stdout.strip() == expected
    assert (tmp_path / "multipod_logs" / "run.log").read_text().strip() == expected


def test_run_logs_copy_every_worker():
    target = tpu.Target("pod", "z")
    commands = tpu.logs_commands(target, "v4-32", "/tmp/logs")
    assert commands[0] == ["mkdir", "-p", "/tmp/logs"]
    assert commands[1:] == [
        [
            *TPU_VM,
            "scp",
            "pod:~/multipod_logs/run.log",
            f"/tmp/logs/worker-{i}.log",
            f"--worker={i}",
            "--zone=z",
        ]
        for i in range(4)
    ]


def test_run_multislice_starts_every_worker_in_one_batch():
    target = tpu.Target("ms", "z", num_slices=2)
    [cmd] = tpu.run_commands(target, "hostname", [], "v4-512")
    assert cmd[:10] == [
        *QUEUED,
        "ssh",
        "ms",
        "--node=all",
        "--worker=all",
        "--batch-size=128",
        "--zone=z",
    ]
    assert "( hostname ) 2>&1 | tee" in _command_flag(cmd)
    logs = tpu.logs_commands(target, "v4-16", "out")
    assert [c[5:7] for c in logs[1:]] == [
        ["ms-0:~/multipod_logs/run.log", "out/slice-0-worker-0.log"],
        ["ms-0:~/multipod_logs/run.log", "out/slice-0-worker-1.log"],
        ["ms-1:~/multipod_logs/run.log", "out/slice-1-worker-0.log"],
        ["ms-1:~/multipod_logs/run.log", "out/slice-1-worker-1.log"],
    ]
    with pytest.raises(ValueError, match="needs --accelerator_type"):
        tpu.run_commands(target, "hostname", [])


def test_ssh_commands():
    target = tpu.Target("pod", "z", project="p")
    assert tpu.ssh_commands(target) == [[*TPU_VM, "ssh", "pod", "--zone=z", "--project=p"]]
    assert tpu.ssh_commands(target, worker="3", command="ls -l") == [
        [*TPU_VM, "ssh", "pod", "--zone=z", "--project=p", "--worker=3", "--command=ls -l"]
    ]
    multi = tpu.Target("ms", "z", num_slices=2)
    assert tpu.ssh_commands(multi, worker="all", slice_index=1) == [
        [*TPU_VM, "ssh", "ms-1", "--zone=z", "--worker=all"]
    ]
    with pytest.raises(ValueError, match="--slice=2"):
        tpu.ssh_commands(multi, slice_index=2)


def test_delete_commands():
    assert tpu.delete_commands(tpu.Target("pod", "z")) == [
        [*TPU_VM, "delete", "pod", "--zone=z", "--quiet"]
    ]
    assert tpu.delete_commands(tpu.Target("ms", "z", project="p", num_slices=2)) == [
        [*QUEUED, "delete", "ms", "--zone=z", "--project=p", "--force", "--quiet"]
    ]


def test_target_requires_name_and_zone():
    with pytest.raises(ValueError, match="--name is required"):
        tpu.Target("", "z")
    with pytest.raises(ValueError, match="--zone is required"):
        tpu.Target("pod", None)


def test_execute_stops_at_first_failure_naming_command_and_code(tmp_path):
    marker = tmp_path / "ran"
    commands = [["true"], ["sh", "-c", "exit 7"], ["touch", str(marker)]]
    with pytest.raises(tpu.CommandError) as e:
        tpu.execute(commands, dry_run=False)
    assert e.value.returncode == 7
    assert "exit code 7" in str(e.value) and "sh -c 'exit 7'" in str(e.value)
    assert not marker.exists()


def test_cli_dry_run_run_prints_exact_argv():
    proc = _cli(
        "run",
        "--name=pod",
        "--zone=us-central2-b",
        "--accelerator_type=v3-32",
        "--env",
        "A=x y",
        "--logs_dir=/tmp/l",
        "--dry_run",
        "--",
        *TRAIN,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 + 1 + 4  # the run, mkdir, one scp per worker
    run = shlex.split(lines[0])
    assert run[:8] == [*TPU_VM, "ssh", "pod", "--worker=all", "--zone=us-central2-b"]
    remote = _command_flag(run)
    assert "export A='x y'" in remote
    assert shlex.split(remote.split("( ", 1)[1].rsplit(" )", 1)[0]) == TRAIN
    assert shlex.split(lines[1]) == ["mkdir", "-p", "/tmp/l"]
    assert shlex.split(lines[5]) == [
        *TPU_VM,
        "scp",
        "pod:~/multipod_logs/run.log",
        "/tmp/l/worker-3.log",
        "--worker=3",
        "--zone=us-central2-b",
    ]


def test_cli_dry_run_create_and_delete_multislice():
    proc = _cli(
        "create",
        "--name=ms",
        "--zone=z",
        "--accelerator_type=v6e-256",
        "--num_slices=2",
        "--spot",
        "--project=p",
        "--dry_run",
    )
    assert proc.returncode == 0, proc.stderr
    assert [shlex.split(line) for line in proc.stdout.splitlines()] == [
        [
            *QUEUED,
            "create",
            "ms",
            "--node-count=2",
            "--node-prefix=ms",
            "--zone=z",
            "--accelerator-type=v6e-256",
            "--runtime-version=v2-alpha-tpuv6e",
            "--spot",
            "--project=p",
        ]
    ]
    proc = _cli("delete", "--name=ms", "--zone=z", "--num_slices=2", "--dry_run")
    assert shlex.split(proc.stdout) == [*QUEUED, "delete", "ms", "--zone=z", "--force", "--quiet"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["create", "--name=p", "--zone=z", "--accelerator_type=v9-8"], "unknown accelerator"),
        (["create", "--name=p", "--zone=z", "--accelerator_type=v3-7"], "powers of two"),
        (["create", "--name=p", "--zone=z"], "create needs --accelerator_type"),
        (["create", "--zone=z", "--accelerator_type=v3-8"], "--name is required"),
        (["delete", "--name=p"], "--zone is required"),
        (["reboot", "--name=p", "--zone=z"], "one of create, setup, run, supervise, ssh, delete"),
        (["run", "--name=p", "--zone=z"], "no command given"),
        (["run", "--name=p", "--zone=z", "--logs_dir=d", "--", "ls"], "needs --accelerator"),
        (["run", "--name=p", "--zone=z", "--env=1A=b", "--", "ls"], "--env '1A=b'"),
        (["delete", "--name=p", "--zone=z", "--", "extra"], "takes no arguments"),
    ],
)
def test_cli_bad_input_is_a_clear_error(args, message):
    proc = _cli(*args, "--dry_run")
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert proc.stdout == ""  # nothing printed as if it would run


def test_cli_failed_run_still_copies_logs_and_exits_with_its_code(tmp_path):
    """Non-dry run with a fake gcloud: ssh fails with 5, the scp of each log still runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    fake = bin_dir / "gcloud"
    fake.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *" ssh "*) exit 5;; esac\nexit 0\n'
    )
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = _cli(
        "run",
        "--name=pod",
        "--zone=z",
        "--accelerator_type=v3-32",
        f"--logs_dir={tmp_path / 'logs'}",
        "--",
        "hostname",
        env=env,
    )
    assert proc.returncode == 5
    assert "exit code 5" in proc.stderr and "tpu-vm ssh pod" in proc.stderr
    lines = calls.read_text().splitlines()
    assert len(lines) == 1 + 4 and all(" scp " in line for line in lines[1:])
    assert (tmp_path / "logs").is_dir()
