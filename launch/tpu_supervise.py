"""`launch.tpu supervise`: keep a run going on preemptible TPU VMs until it ends.

Each attempt: make sure the TPU VM (or, for several slices, the queued resource) exists
and is READY (ACTIVE), creating it when it is missing and deleting and recreating it
when it was PREEMPTED, TERMINATED, FAILED or SUSPENDED; set it up after every creation
(and before the first attempt); otherwise end what is left of the previous attempt on
every worker; wait until no live run holds the work directory (mlperf/lease.py); then
run the command on every worker of every slice and watch it. Every worker's line ends
with `multipod-exit-code HOST CODE`, so the attempt's code is the workers' own, not
gcloud's: the root cause (a worker's 143 rather than a peer's 4), or 255 (ssh failed)
for a worker that never reported. launch/supervisor.py decides whether to start again.

This module runs gcloud commands that launch/tpu.py builds (TpuPlan) and imports
nothing of it.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable

from launch.cli import EXIT_PEER_LOST
from launch.supervisor import EXIT_SSH_FAILED, Attempt, Backoff, Supervisor, classify

EXIT_MARKER = "multipod-exit-code"
READY = ("READY", "ACTIVE")
LOST = ("PREEMPTED", "TERMINATED", "FAILED", "SUSPENDED", "SUSPENDING")
MISSING = "MISSING"
STATE_FRESH_S = 60.0  # a state read this recently is not read again
MAX_UNKNOWN = 60  # state reads that fail in a row before giving up (30 min at --poll_s=30)


@dataclasses.dataclass
class TpuPlan:
    """The gcloud commands of a supervised run, built by launch/tpu.py."""

    describe: list[str]  # prints the state (tpu-vm: READY; queued resource: ACTIVE)
    create: list[list[str]]
    delete: list[list[str]]
    setup: list[list[str]]
    run: list[str]  # every worker; each ends with an EXIT_MARKER line
    stop: list[list[str]]  # ends what is left of an attempt on every worker
    workers: int
    workdir: str
    what: str  # "node pod" or "queued resource ms"


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


class TpuSupervisor:
    """Runs a TpuPlan under launch/supervisor.py's restart loop."""

    def __init__(
        self,
        plan: TpuPlan,
        max_restarts: int,
        backoff: Backoff,
        poll_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.plan, self.poll_s, self.sleep = plan, poll_s, sleep
        self.supervisor = Supervisor("launch.tpu", plan.workdir, max_restarts, backoff, sleep)
        self.say = self.supervisor.say
        self.max_create_failures = max_restarts + 1
        self._seen: tuple[str, float] | None = None  # (state, monotonic time) after an attempt

    # ---- gcloud -------------------------------------------------------------------------
    def _call(self, cmd: list[str]) -> int:
        print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
        try:
            return subprocess.run(cmd, check=False, stdin=subprocess.DEVNULL).returncode
        except FileNotFoundError:
            self.say(f"{cmd[0]} not found; install the Google Cloud CLI")
            return 127

    def _all(self, commands: list[list[str]]) -> int:
        """Runs commands in order; the first non-zero code (0 when all succeed)."""
        for cmd in commands:
            code = self._call(cmd)
            if code:
                return code
        return 0

    def state(self) -> str:
        """The TPU's state: READY / ACTIVE, PREEMPTED, ..., MISSING, or UNKNOWN (gcloud
        could not say; the reason is printed)."""
        try:
            proc = subprocess.run(
                self.plan.describe,
                capture_output=True,
                text=True,
                timeout=300,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            self.say(f"could not read the state of the {self.plan.what}: {e}")
            return "UNKNOWN"
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip().split()[0].upper()
        if "NOT_FOUND" in proc.stderr or "not found" in proc.stderr.lower():
            return MISSING
        self.say(f"could not read the state of the {self.plan.what}: {_first_line(proc.stderr)}")
        return "UNKNOWN"

    # ---- machines -----------------------------------------------------------------------
    def _make_ready(self) -> bool:
        """Creates, recreates or waits for the TPU until it is ready; True when it had
        to be (re)created (the attempt then found no machines for a while). The state
        read when the last attempt ended is used if it is recent."""
        created, failures, unknown, said = False, 0, 0, ""
        seen, self._seen = self._seen, None
        while True:
            fresh = seen is not None and time.monotonic() - seen[1] < STATE_FRESH_S
            state = seen[0] if fresh else self.state()
            seen = None
            if state in READY:
                return created
            unknown = unknown + 1 if state == "UNKNOWN" else 0
            if unknown >= MAX_UNKNOWN:
                raise _GiveUpError(1, f"gcloud could not say the state {unknown} times in a row")
            if state not in (said, "UNKNOWN"):
                shown = "does not exist" if state == MISSING else f"is {state}"
                self.say(f"the {self.plan.what} {shown}")
                said = state
            if state in (MISSING, *LOST):
                if state != MISSING:
                    self.say(f"deleting and recreating the {self.plan.what}")
                    self._all(self.plan.delete)
                code = self._all(self.plan.create)
                created = True
                if code:
                    failures += 1
                    if failures >= self.max_create_failures:
                        raise _GiveUpError(
                            code, f"creating the {self.plan.what} failed {failures} times"
                        )
                    self.sleep(self.poll_s)
                continue
            self.sleep(self.poll_s)  # CREATING, PROVISIONING, WAITING_FOR_RESOURCES, ...

    def recover(self, previous: Attempt | None, ended: float) -> float:
        """Machines ready, set up, nothing left of the last attempt, work directory free;
        returns the seconds since `ended` that passed without machines."""
        created = self._make_ready()
        no_machines = time.time() - ended if created else 0.0
        if created or previous is None:
            code = self._all(self.plan.setup)
            if code:
                raise _GiveUpError(code, f"setting up the {self.plan.what} failed")
        else:
            self._all(self.plan.stop)  # a worker may still run the old job
        from mlperf import lease

        if not lease.wait_until_free(self.plan.workdir, lease.TTL_S + 60, self.say):
            self.say(f"{self.plan.workdir} is still held; the run will say by whom")
        return no_machines

    # ---- one attempt --------------------------------------------------------------------
    def attempt(self, _: int) -> Attempt:
        cmd = self.plan.run
        print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
        codes: dict[str, int] = {}
        try:
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
            )
        except FileNotFoundError:
            return Attempt(127, f"{cmd[0]} not found", retry=False)
        assert proc.stdout is not None
        for line in proc.stdout:  # read to the end: the pipe is always drained
            sys.stdout.write(line)
            sys.stdout.flush()
            words = line.split()
            if len(words) == 3 and words[0] == EXIT_MARKER and words[2].lstrip("-").isdigit():
                codes[words[1]] = int(words[2])
        returncode = proc.wait()
        result = self._outcome(codes, returncode)
        if result.code != 0:
            state = self.state()
            self._seen = (state, time.monotonic())
            result.state = f"{self.plan.what} {state}"
            if state in LOST or state == MISSING:
                result.retry = True  # the machines went away: whatever the code said
        return result

    def _outcome(self, codes: dict[str, int], returncode: int) -> Attempt:
        """The attempt's code from the workers' markers (see the module docstring)."""
        failed = {h: c for h, c in codes.items() if c != 0}
        silent = self.plan.workers - len(codes)
        if not failed and silent <= 0:
            return Attempt(0)
        roots = {h: c for h, c in failed.items() if c != EXIT_PEER_LOST} or failed
        if roots:
            counts = Counter(roots.values())  # the code most workers report
            code = min(counts, key=lambda c: (-counts[c], c))
            hosts = sorted(h for h, c in roots.items() if c == code)
            where = ", ".join(hosts[:4]) + (" ..." if len(hosts) > 4 else "")
            return Attempt(code, cause=f"{classify(code)[1]} on {where}")
        if codes:
            return Attempt(
                EXIT_SSH_FAILED, cause=f"{silent} worker(s) never reported (ssh or host lost)"
            )
        code = returncode if returncode else EXIT_SSH_FAILED
        return Attempt(code, cause=f"no worker reported (gcloud exited {returncode})")

    def run(self) -> int:
        try:
            return self.supervisor.run(self.attempt, self.recover)
        except _GiveUpError as e:
            self.say(f"{e.reason}; giving up (exit {e.code}).")
            return e.code if 0 < e.code < 256 else 1


class _GiveUpError(Exception):
    """The machines cannot be made ready: the supervisor stops with `code`."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code, self.reason = code, reason
