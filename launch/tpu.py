"""Cloud TPU VM pods with gcloud: `python -m launch.tpu COMMAND --name N --zone Z [flags]`.

Commands:
  create   make the TPU VM(s): one slice with `tpu-vm create`, or `--num_slices K` > 1
           slices through one queued resource (nodes NAME-0 .. NAME-{K-1}).
  setup    copy this repository to ~/multipod on every worker, give it Python 3.11 (the
           project needs >= 3.11; the v2-v4 images ship 3.10) in ~/multipod/.venv through
           `uv` (from PyPI; it downloads a managed CPython), and install `-e ".[tpu]"`
           there; `--python_version ""` installs into the image's `--python` instead.
  run      the same command on every worker of every slice, e.g.
             launch.tpu run --name N --zone Z -- python3 -m launch.train \\
               --config configs/bert.py:tiny --workdir /tmp/w --tpu_pod
           `--env KEY=VALUE` (repeatable) is exported first; each worker tees its output
           to ~/multipod_logs/run.log; `--logs_dir D` copies them back to D/worker-<i>.log
           (multi-slice: D/slice-<s>-worker-<i>.log), also after a failed run.
  supervise  `run` that brings itself back (launch/tpu_supervise.py): creates the TPU if
           missing, waits until it is READY, sets it up, runs the command on every worker
           and, when an attempt ends in a preemption (exit 143 on a worker, the TPU
           PREEMPTED / TERMINATED / FAILED, ssh failing, a peer lost: exit 4), deletes
           and recreates what was lost, sets it up again and reruns the same command,
           which resumes from the bucket work directory; at most `--max_restarts` times,
           waiting `--backoff_s` (doubling, up to `--max_backoff_s`) in between. It
           stops for good on 0, 1, 2, 70 and codes a restart cannot help.
  ssh      `tpu-vm ssh` to one worker (`--worker`, `--slice`); words after `--` are run.
  delete   delete the TPU VM (or the queued resource with all its slices).

The words after `--` form the remote command: several words are an argv, shell-quoted
with shlex.join so spaces and quotes survive; a single word is used as a shell line as
is (so `-- 'cmd1 && cmd2'` works). `--dry_run` prints each gcloud command, one per
line (shlex.join), and runs nothing. Without it the commands run in order, streaming
their output, and the first failure stops with its command and exit code.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys

from absl import app, flags

from launch import launcher_flags as shared
from launch.launcher_flags import value_or
from launch.supervisor import Backoff, workdir_of
from launch.tpu_supervise import EXIT_MARKER, TpuPlan, TpuSupervisor

COMMANDS = ("create", "setup", "run", "supervise", "ssh", "delete")
REMOTE_DIR = "~/multipod"
REMOTE_LOG_DIR = "~/multipod_logs"
REMOTE_LOG = f"{REMOTE_LOG_DIR}/run.log"
# A supervised run's process group on each worker, so that the next attempt can end it.
REMOTE_PID = f"{REMOTE_LOG_DIR}/run.pgid"
STOP_GRACE_S = 120  # SIGTERM (a checkpoint is written) before SIGKILL
REMOTE_VENV = f"{REMOTE_DIR}/.venv"
PYTHON_VERSION = "3.11"  # pyproject.toml: requires-python >= 3.11
TPU_VM = ["gcloud", "compute", "tpus", "tpu-vm"]
QUEUED = ["gcloud", "compute", "tpus", "queued-resources"]

# Top-level repository entries that `setup` does not copy (local envs, caches, outputs).
_NOT_COPIED = ("build", "runs", "__pycache__")

_VALID_TYPES = (
    "valid accelerator types: v2-N / v3-N (N TensorCores, a power of two >= 8, e.g. v3-8, "
    "v3-32, v3-2048), v4-N / v5p-N (N TensorCores, a multiple of 8, e.g. v4-8, v4-512, "
    "v5p-128), v5litepod-N / v6e-N (N chips: 1, 4, 8, 16, 32, 64, 128 or 256)"
)

_DEFAULT_RUNTIME = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5p": "v2-alpha-tpuv5",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v6e": "v2-alpha-tpuv6e",
}


def _parse_type(accelerator_type: str) -> tuple[str, int]:
    """`v4-512` -> ("v4", 512); ValueError listing the valid forms otherwise."""
    match = re.fullmatch(r"(v2|v3|v4|v5p|v5litepod|v6e)-([0-9]+)", accelerator_type or "")
    if not match:
        raise ValueError(f"unknown accelerator type {accelerator_type!r}; {_VALID_TYPES}")
    return match.group(1), int(match.group(2))


def hosts_for(accelerator_type: str) -> int:
    """Number of TPU VM hosts (gcloud workers) in one slice of `accelerator_type`.

    N is the number after the dash.
    - v2-N, v3-N: N counts TensorCores, 2 per chip, 4 chips (8 cores) per host -> N / 8
      (v3-8: 1, v3-32: 4, v3-2048 (a full pod): 256; v3-8192, the 4096-chip multipod of
      MLPerf v0.7, would be 1024, but Cloud sells v3 only up to v3-2048).
    - v4-N, v5p-N: N counts TensorCores, 2 per chip, 4 chips per host -> N / 8
      (v4-8: 1, v4-512: 64).
    - v5litepod-N, v6e-N: N counts chips. 1, 4 and 8 chips are one host; larger
      slices have 4 chips per host -> N / 4 (v5litepod-16: 4, v5litepod-256: 64).
    """
    family, n = _parse_type(accelerator_type)
    if family in ("v2", "v3"):
        if n < 8 or n & (n - 1):
            raise ValueError(
                f"{accelerator_type}: {family} sizes are powers of two >= 8; {_VALID_TYPES}"
            )
        return n // 8
    if family in ("v4", "v5p"):
        if n < 8 or n % 8:
            raise ValueError(
                f"{accelerator_type}: {family} sizes are multiples of 8; {_VALID_TYPES}"
            )
        return n // 8
    if n not in (1, 4, 8, 16, 32, 64, 128, 256):
        raise ValueError(
            f"{accelerator_type}: {family} has 1, 4, 8, 16, 32, 64, 128 or 256 "
            f"chips; {_VALID_TYPES}"
        )
    return 1 if n <= 8 else n // 4


def default_runtime_version(accelerator_type: str) -> str:
    """The Cloud TPU docs' JAX/PyTorch software version for the type's generation."""
    return _DEFAULT_RUNTIME[_parse_type(accelerator_type)[0]]


@dataclasses.dataclass(frozen=True)
class Target:
    """Which TPU: its name, zone, optional project, and how many slices."""

    name: str
    zone: str
    project: str | None = None
    num_slices: int = 1

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("--name is required (the TPU VM or queued-resource name)")
        if not self.zone:
            raise ValueError("--zone is required (e.g. us-central2-b)")
        if self.num_slices < 1:
            raise ValueError(f"--num_slices={self.num_slices}: must be >= 1")

    @property
    def multislice(self) -> bool:
        return self.num_slices > 1

    def nodes(self) -> list[str]:
        """TPU VM node names: NAME, or the queued resource's NAME-0 .. NAME-{K-1}."""
        if not self.multislice:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(self.num_slices)]

    def project_flag(self) -> list[str]:
        """`--project=P` when a project was given, else nothing (gcloud's default project)."""
        return [f"--project={self.project}"] if self.project else []

    def scope(self) -> list[str]:
        """The trailing `--zone` / `--project` flags every gcloud command gets."""
        return [f"--zone={self.zone}", *self.project_flag()]


def shell_line(words: list[str]) -> str:
    """Remote shell line from the words after `--`: one word as is, several shlex.join-ed."""
    if not words:
        raise ValueError("no command given: put it after `--`, e.g. -- python3 -m launch.train")
    return words[0] if len(words) == 1 else shlex.join(words)


def parse_env(pairs: list[str]) -> list[tuple[str, str]]:
    """`KEY=VALUE` strings -> (key, value), keys checked to be shell variable names."""
    result = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"--env {pair!r}: use KEY=VALUE with KEY a variable name")
        result.append((key, value))
    return result


def create_commands(
    target: Target, accelerator_type: str, runtime_version: str | None = None, spot: bool = False
) -> list[list[str]]:
    """gcloud command(s) that create the slice(s)."""
    hosts_for(accelerator_type)  # validates the type before anything runs
    version = runtime_version or default_runtime_version(accelerator_type)
    spot_flag = ["--spot"] if spot else []
    if not target.multislice:
        cmd = [
            *TPU_VM,
            "create",
            target.name,
            f"--zone={target.zone}",
            f"--accelerator-type={accelerator_type}",
            f"--version={version}",
            *spot_flag,
        ]
    else:
        cmd = [
            *QUEUED,
            "create",
            target.name,
            f"--node-count={target.num_slices}",
            f"--node-prefix={target.name}",
            f"--zone={target.zone}",
            f"--accelerator-type={accelerator_type}",
            f"--runtime-version={version}",
            *spot_flag,
        ]
    return [cmd + target.project_flag()]


def _ssh(target: Target, node: str, worker: str, command: str | None) -> list[str]:
    """`tpu-vm ssh` to one node."""
    cmd = [*TPU_VM, "ssh", node, f"--worker={worker}", *target.scope()]
    return cmd + ([f"--command={command}"] if command is not None else [])


def code_sources(repo: str) -> list[str]:
    """The repository's top-level entries to copy: no hidden ones (.venv, .git), caches, outputs."""
    names = sorted(os.listdir(repo))
    keep = [
        n
        for n in names
        if not n.startswith(".")
        and n not in _NOT_COPIED
        and not n.endswith(".egg-info")
        and not n.startswith("workdir")
    ]
    return [os.path.join(repo, n) for n in keep]


def install_line(python: str = "python3", python_version: str = PYTHON_VERSION) -> str:
    """Worker-side install: uv (pip --user; `--break-system-packages` where the image's
    Python is externally managed) makes ~/multipod/.venv with a managed `python_version`
    and installs the project there; with no `python_version`, pip into `python`."""
    py = shlex.quote(python)
    if not python_version:
        return f'cd {REMOTE_DIR} && {py} -m pip install -e ".[tpu]"'
    uv = "~/.local/bin/uv"
    get_uv = (
        f"( {py} -m pip install --user --upgrade uv || "
        f"{py} -m pip install --user --upgrade --break-system-packages uv )"
    )
    return " && ".join(
        [
            f"cd {REMOTE_DIR}",
            get_uv,
            f"{uv} venv --python {shlex.quote(python_version)} {REMOTE_VENV}",
            f'{uv} pip install --python {REMOTE_VENV}/bin/python -e ".[tpu]"',
        ]
    )


def setup_commands(
    target: Target,
    sources: list[str],
    python: str = "python3",
    python_version: str = PYTHON_VERSION,
) -> list[list[str]]:
    """Fresh ~/multipod on every worker of every slice, the code copied in, installed."""
    install = install_line(python, python_version)
    commands = []
    for node in target.nodes():
        commands.append(_ssh(target, node, "all", f"rm -rf {REMOTE_DIR} && mkdir -p {REMOTE_DIR}"))
        commands.append(
            [
                *TPU_VM,
                "scp",
                "--recurse",
                *sources,
                f"{node}:{REMOTE_DIR}",
                "--worker=all",
                *target.scope(),
            ]
        )
        commands.append(_ssh(target, node, "all", install))
    return commands


def _remote_prefix(env: list[tuple[str, str]]) -> list[str]:
    """cd, the setup's venv first on PATH (so `python3` is its 3.11), export env."""
    parts = [f"cd {REMOTE_DIR}", f"mkdir -p {REMOTE_LOG_DIR}"]
    parts.append('export PATH="$HOME/multipod/.venv/bin:$PATH"')
    return parts + [f"export {key}={shlex.quote(value)}" for key, value in env]


def remote_run_line(line: str, env: list[tuple[str, str]]) -> str:
    """Worker-side shell line: cd, the setup's venv first on PATH (so `python3` is its
    3.11), export env, run `line` with its output teed to the log."""
    parts = _remote_prefix(env)
    parts.append(f"set -o pipefail && ( {line} ) 2>&1 | tee {REMOTE_LOG}")
    return " && ".join(parts)


def supervised_run_line(line: str, env: list[tuple[str, str]]) -> str:
    """`remote_run_line` for `supervise`: the command runs in a process group of its own
    (its id in REMOTE_PID, for `stop_line`; a death by signal N reads as 128 + N), and
    the worker's last line is `multipod-exit-code HOSTNAME CODE`
    (launch/tpu_supervise.py reads it)."""
    group = f"echo $$ > {REMOTE_PID}; bash -c {shlex.quote(line)}; rc=$?; exit $rc"
    run = f"( setsid --wait bash -c {shlex.quote(group)} ) 2>&1 | tee {REMOTE_LOG}"
    report = f'rc=$?; echo "{EXIT_MARKER} $(hostname) $rc"; exit $rc;'
    return " && ".join(_remote_prefix(env)) + f" && {{ set -o pipefail; {run}; {report} }}"


def stop_line() -> str:
    """Worker-side shell line that ends what is left of a supervised attempt: SIGTERM to
    its process group, SIGKILL after STOP_GRACE_S."""
    return (
        f"if [ -f {REMOTE_PID} ]; then pg=$(cat {REMOTE_PID}); "
        "kill -TERM -- -$pg 2>/dev/null; "
        f"for i in $(seq {STOP_GRACE_S}); do kill -0 -- -$pg 2>/dev/null || break; sleep 1; done; "
        f"kill -KILL -- -$pg 2>/dev/null; rm -f {REMOTE_PID}; fi; true"
    )


def describe_command(target: Target) -> list[str]:
    """Prints the TPU's state: the TPU VM's (READY, PREEMPTED, ...) or, for several
    slices, the queued resource's (ACTIVE, SUSPENDED, ...)."""
    if target.multislice:
        return [*QUEUED, "describe", target.name, *target.scope(), "--format=value(state.state)"]
    return [*TPU_VM, "describe", target.name, *target.scope(), "--format=value(state)"]


def run_commands(
    target: Target,
    line: str,
    env: list[tuple[str, str]],
    accelerator_type: str | None = None,
    supervised: bool = False,
) -> list[list[str]]:
    """Start `line` on every worker at once (all slices for multi-slice)."""
    remote = supervised_run_line(line, env) if supervised else remote_run_line(line, env)
    return _on_every_worker(target, remote, accelerator_type)


def _on_every_worker(target: Target, remote: str, accelerator_type: str | None) -> list[list[str]]:
    command = f"--command={remote}"
    if not target.multislice:
        return [[*TPU_VM, "ssh", target.name, "--worker=all", *target.scope(), command]]
    if not accelerator_type:
        raise ValueError(
            "a multi-slice run needs --accelerator_type (to start all workers in one batch)"
        )
    workers = hosts_for(accelerator_type) * target.num_slices
    # queued-resources ssh starts workers in batches (default 64); a training job only
    # finishes once every worker has joined, so all of them go in one batch.
    return [
        [
            *QUEUED,
            "ssh",
            target.name,
            "--node=all",
            "--worker=all",
            f"--batch-size={workers}",
            *target.scope(),
            command,
        ]
    ]


def logs_commands(target: Target, accelerator_type: str, logs_dir: str) -> list[list[str]]:
    """Copy every worker's ~/multipod_logs/run.log to logs_dir/[slice-<s>-]worker-<i>.log."""
    commands = [["mkdir", "-p", logs_dir]]
    for s, node in enumerate(target.nodes()):
        prefix = f"slice-{s}-" if target.multislice else ""
        for i in range(hosts_for(accelerator_type)):
            local = os.path.join(logs_dir, f"{prefix}worker-{i}.log")
            commands.append(
                [*TPU_VM, "scp", f"{node}:{REMOTE_LOG}", local, f"--worker={i}", *target.scope()]
            )
    return commands


def ssh_commands(
    target: Target, worker: str | None = None, command: str | None = None, slice_index: int = 0
) -> list[list[str]]:
    """An interactive ssh (or one command) on one worker of one slice."""
    if not 0 <= slice_index < target.num_slices:
        raise ValueError(f"--slice={slice_index}: the TPU has {target.num_slices} slice(s)")
    cmd = [*TPU_VM, "ssh", target.nodes()[slice_index], *target.scope()]
    cmd += [f"--worker={worker}"] if worker is not None else []
    return [cmd + ([f"--command={command}"] if command is not None else [])]


def delete_commands(target: Target) -> list[list[str]]:
    """Delete the TPU VM, or the queued resource with all its slices."""
    if target.multislice:
        return [[*QUEUED, "delete", target.name, *target.scope(), "--force", "--quiet"]]
    return [[*TPU_VM, "delete", target.name, *target.scope(), "--quiet"]]


class CommandError(Exception):
    """A command exited non-zero (or could not start)."""

    def __init__(self, command: list[str], returncode: int, why: str = "") -> None:
        self.returncode = returncode
        detail = why or f"exit code {returncode}"
        super().__init__(f"command failed ({detail}): {shlex.join(command)}")


def execute(commands: list[list[str]], dry_run: bool) -> None:
    """Print (dry run) or run the commands in order, stopping at the first failure."""
    for cmd in commands:
        if dry_run:
            print(shlex.join(cmd), flush=True)
            continue
        print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
        try:
            returncode = subprocess.run(cmd, check=False).returncode
        except FileNotFoundError:
            raise CommandError(
                cmd, 127, f"{cmd[0]} not found; install the Google Cloud CLI or use --dry_run"
            ) from None
        if returncode != 0:
            raise CommandError(cmd, returncode)


_ZONE = flags.DEFINE_string("zone", None, "Zone, e.g. us-central2-b.")
_PROJECT = flags.DEFINE_string("project", None, "Google Cloud project (default: gcloud's).")
_TYPE = flags.DEFINE_string(
    "accelerator_type",
    None,
    "e.g. v3-8, v4-512, v5litepod-256, v6e-256 (create; run with --logs_dir or --num_slices > 1).",
)
_RUNTIME = flags.DEFINE_string(
    "runtime_version", None, "TPU software version (default: per generation, see the docs)."
)
_SPOT = flags.DEFINE_bool("spot", False, "Create Spot (preemptible) capacity.")
_ENV = flags.DEFINE_multi_string("env", [], "KEY=VALUE exported on the workers (run).")
_LOGS_DIR = flags.DEFINE_string("logs_dir", None, "Copy each worker's run log here (run).")
_WORKER = flags.DEFINE_string("worker", None, "Worker index or `all` (ssh; gcloud's default 0).")
_SLICE = flags.DEFINE_integer("slice", 0, "Slice index for ssh on a multi-slice TPU.")
_PYTHON = flags.DEFINE_string("python", "python3", "Worker Python that setup bootstraps uv with.")
_PYTHON_VERSION = flags.DEFINE_string(
    "python_version",
    PYTHON_VERSION,
    "Python that setup's venv gets through uv; empty: install into --python itself.",
)
_POLL_S = flags.DEFINE_float(
    "poll_s",
    30.0,
    "supervise: seconds between state checks of a TPU not READY yet.",
    lower_bound=0.0,
)

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _need_type(command: str) -> str:
    """--accelerator_type or a usage error naming the command that needs it."""
    if not _TYPE.value:
        raise ValueError(f"{command} needs --accelerator_type (e.g. v4-512); {_VALID_TYPES}")
    return _TYPE.value


def _copy_logs_after_failure(logs: list[list[str]], dry_run: bool) -> None:
    """Copy the logs after a failed run (they matter most then); their own failure only warns."""
    try:
        execute(logs, dry_run)
    except CommandError as e:
        print(f"multipod: warning: {e}", file=sys.stderr)


def supervise_plan(
    target: Target,
    accelerator_type: str,
    words: list[str],
    env: list[tuple[str, str]],
    sources: list[str],
    runtime_version: str | None = None,
    spot: bool = False,
    python: str = "python3",
    python_version: str = PYTHON_VERSION,
) -> TpuPlan:
    """The gcloud commands `supervise` runs (launch/tpu_supervise.py's TpuPlan); the
    command's --workdir must be a bucket URL (a recreated VM starts with an empty disk)."""
    line = shell_line(words)
    workdir = workdir_of(words)
    if not workdir or not workdir.startswith("gs://"):
        raise ValueError(
            f"supervise needs the run's --workdir in a bucket (gs://BUCKET/RUN), got "
            f"{workdir or 'none'}: a recreated TPU VM starts with an empty disk, and the "
            "restarted run resumes from its work directory."
        )
    what = f"queued resource {target.name}" if target.multislice else f"TPU VM {target.name}"
    stop = _on_every_worker(target, stop_line(), accelerator_type)
    return TpuPlan(
        describe=describe_command(target),
        create=create_commands(target, accelerator_type, runtime_version, spot),
        delete=delete_commands(target),
        setup=setup_commands(target, sources, python, python_version),
        run=run_commands(target, line, env, accelerator_type, supervised=True)[0],
        stop=stop,
        workers=hosts_for(accelerator_type) * target.num_slices,
        workdir=workdir,
        what=what,
    )


def _supervise(target: Target, words: list[str]) -> None:
    """`supervise`: the restart loop (or, with --dry_run, a first attempt's commands on a
    TPU that does not exist yet)."""
    plan = supervise_plan(
        target,
        _need_type("supervise"),
        words,
        parse_env(_ENV.value),
        code_sources(_REPO),
        _RUNTIME.value,
        _SPOT.value,
        _PYTHON.value,
        _PYTHON_VERSION.value,
    )
    if shared.DRY_RUN.value:
        execute([*plan.create, plan.describe, *plan.setup, plan.run], dry_run=True)
        return
    backoff = Backoff(value_or(shared.BACKOFF_S, 60.0), value_or(shared.MAX_BACKOFF_S, 1800.0))
    code = TpuSupervisor(plan, value_or(shared.MAX_RESTARTS, 20), backoff, _POLL_S.value).run()
    if code:
        raise SystemExit(code)


def _dispatch(command: str, words: list[str]) -> None:
    """Build and execute one command's gcloud commands."""
    target = Target(shared.NAME.value, _ZONE.value, _PROJECT.value, shared.NUM_SLICES.value)
    if command == "supervise":
        if _LOGS_DIR.value:
            raise ValueError(
                "supervise copies no logs back: every host's log is in WORKDIR/logs/ "
                "(docs/multi-host.md); drop --logs_dir"
            )
        _supervise(target, words)
        return
    if words and command not in ("run", "ssh"):
        raise ValueError(f"{command} takes no arguments after the flags, got {words}")
    dry = shared.DRY_RUN.value
    if command == "create":
        execute(create_commands(target, _need_type(command), _RUNTIME.value, _SPOT.value), dry)
    elif command == "setup":
        sources = code_sources(_REPO)
        execute(setup_commands(target, sources, _PYTHON.value, _PYTHON_VERSION.value), dry)
    elif command == "ssh":
        line = shell_line(words) if words else None
        execute(ssh_commands(target, _WORKER.value, line, _SLICE.value), dry)
    elif command == "delete":
        execute(delete_commands(target), dry)
    else:
        env = parse_env(_ENV.value)
        accel = _need_type("run --logs_dir") if _LOGS_DIR.value else _TYPE.value
        run = run_commands(target, shell_line(words), env, accel)
        logs = logs_commands(target, accel, _LOGS_DIR.value) if _LOGS_DIR.value else []
        try:
            execute(run, dry)
        except CommandError:
            _copy_logs_after_failure(logs, dry)
            raise
        execute(logs, dry)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in COMMANDS:
        got = repr(argv[1]) if len(argv) > 1 else "none"
        raise app.UsageError(f"give a command, one of {', '.join(COMMANDS)} (got {got})")
    try:
        _dispatch(argv[1], argv[2:])
    except ValueError as e:
        print(f"multipod: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except CommandError as e:
        print(f"multipod: error: {e}", file=sys.stderr)
        raise SystemExit(e.returncode if 0 < e.returncode < 256 else 1) from None


if __name__ == "__main__":
    app.run(main)
