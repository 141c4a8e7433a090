"""The restart loop that `launch.tpu supervise` and `launch.local --supervise` share.

An attempt is one run of the whole job (every process of every host). When it ends, its
exit code (launch/cli.py) decides:

- 0 (target reached), 1 (the run ended below its target), 2 (bad input), 70 (a bug),
  130 (Ctrl-C) and any code not named below: the job stops for good with that code;
- 143 (preempted: a checkpoint was written), 4 (a peer died), 3 (another run held the
  work directory), 69 (the object store was unreachable), 75 (the run stalled), 255 (ssh
  failed) and deaths by a signal other
  than SIGINT (128 + N, e.g. 137 for SIGKILL): the job is started again, and resumes from
  its newest checkpoint.

Restarts wait `backoff_s`, doubling with every restart up to `max_backoff_s`; an attempt
that ran for at least `HEALTHY_S` resets the wait (a preemption after hours of training
is not a crash loop). After `max_restarts` restarts the job stops with the last code.

Each attempt ends in one line (its cause, the machines' state, how long it ran and how
much time was lost before it), and WORKDIR/supervisor.json records the attempt being
started and every restart's lost time, which the run folds into its goodput ledger
(mlperf/goodput.py).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from launch.cli import (
    EXIT_BAD_INPUT,
    EXIT_CRASH,
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    EXIT_STALLED,
    EXIT_STORE_UNREACHABLE,
    EXIT_TARGET_NOT_REACHED,
    EXIT_TARGET_REACHED,
    EXIT_WORKDIR_HELD,
)

EXIT_SSH_FAILED = 255  # ssh's own code when the connection fails or drops
HEALTHY_S = 1800.0  # an attempt this long resets the backoff

_RETRYABLE = {
    EXIT_PREEMPTED: "preempted (checkpoint written)",
    EXIT_PEER_LOST: "a peer process died",
    EXIT_WORKDIR_HELD: "the work directory was held by another run",
    EXIT_STALLED: "the run stalled",
    EXIT_STORE_UNREACHABLE: "the object store was unreachable",
    EXIT_SSH_FAILED: "ssh failed",
}
_FINAL = {
    EXIT_TARGET_REACHED: "the run reached its target",
    EXIT_TARGET_NOT_REACHED: "the run ended without reaching its target",
    EXIT_BAD_INPUT: "bad input",
    EXIT_CRASH: "a bug (unexpected error)",
    128 + signal.SIGINT: "interrupted (Ctrl-C)",
}


def final_failure_codes() -> list[int]:
    """The non-zero exit codes that no restart can help (bad input, a bug, a run that
    ended below its target): what a scheduler's own restart policy should fail on."""
    return sorted(c for c in _FINAL if c not in (EXIT_TARGET_REACHED, 128 + signal.SIGINT))


def classify(code: int) -> tuple[bool, str]:
    """(start again?, what the code means) for an attempt's exit code."""
    if code in _RETRYABLE:
        return True, _RETRYABLE[code]
    if code in _FINAL:
        return False, _FINAL[code]
    if code < 0 or 128 < code < 128 + 65:
        number = -code if code < 0 else code - 128
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return True, f"killed by {name}"
    return False, f"exit code {code} (not one a restart can help)"


def workdir_of(words: list[str]) -> str | None:
    """The value of `--workdir` in a launch.train command (argv words, or one shell line
    as a single word), or None."""
    if len(words) == 1:
        try:
            words = shlex.split(words[0])
        except ValueError:
            return None
    for i, word in enumerate(words):
        for flag in ("--workdir", "-workdir"):
            if word == flag and i + 1 < len(words):
                return words[i + 1]
            if word.startswith(flag + "="):
                return word[len(flag) + 1 :]
    return None


@dataclasses.dataclass
class Attempt:
    """How one attempt ended: its exit code, what it means, the machines' state after it."""

    code: int
    cause: str = ""
    state: str = ""  # e.g. "node PREEMPTED" (TPU) or "" (local)
    retry: bool | None = None  # None: decided by the exit code


@dataclasses.dataclass
class Backoff:
    """Exponential waits between restarts, reset after a long (healthy) attempt."""

    base_s: float
    max_s: float
    _streak: int = 0

    def next(self, attempt_s: float) -> float:
        if attempt_s >= HEALTHY_S:
            self._streak = 0
        wait = min(self.base_s * (2**self._streak), self.max_s)
        self._streak += 1
        return wait


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class SupervisorRecord:
    """WORKDIR/supervisor.json: the attempt being started, each attempt's end and each
    restart's lost time (written through input_pipeline.storage, local or bucket)."""

    def __init__(self, workdir: str | None, say: Callable[[str], None]):
        self.workdir, self.say = workdir, say
        self.data: dict[str, Any] = {"attempt": 0, "attempts": [], "restarts": []}
        self._warned = False

    def starting(self, attempt: int) -> None:
        self.data["attempt"] = attempt
        self.write()

    def restarted(self, after: Attempt, seconds: float, no_machines_s: float) -> None:
        """The wait before an attempt: `seconds` since the last one ended, of which
        `no_machines_s` without machines."""
        self.data["restarts"].append(
            {
                "after_attempt": self.data["attempt"],
                "seconds": round(seconds, 3),
                "no_machines_s": round(no_machines_s, 3),
                "cause": after.cause,
            }
        )

    def ended(self, result: Attempt, started: float, ended: float) -> None:
        self.data["attempts"].append(
            {
                "attempt": self.data["attempt"],
                "started": round(started, 3),
                "ended": round(ended, 3),
                "exit_code": result.code,
                "cause": result.cause,
                "state": result.state,
            }
        )
        self.write()

    def write(self) -> None:
        if not self.workdir:
            return
        from input_pipeline import storage
        from mlperf.goodput import SUPERVISOR_FILE

        try:
            path = storage.join(storage.resolve(self.workdir), SUPERVISOR_FILE)
            storage.write_text(path, json.dumps(self.data, indent=1))
        except OSError as e:  # bookkeeping: never a reason to stop the job
            if not self._warned:
                self.say(f"warning: could not write {SUPERVISOR_FILE} in {self.workdir}: {e}")
                self._warned = True


class Supervisor:
    """Runs attempts until one ends for good; see the module docstring.

    `run_attempt(n)` runs attempt n and says how it ended; `recover(previous)` gets the
    machines ready again after a failed attempt (or before the first, with None) and
    returns how many of the seconds since `previous` ended passed without machines.
    """

    def __init__(
        self,
        prefix: str,
        workdir: str | None,
        max_restarts: int,
        backoff: Backoff,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ):
        self.prefix, self.max_restarts, self.backoff = prefix, max_restarts, backoff
        self.sleep, self.clock = sleep, clock
        self.record = SupervisorRecord(workdir, self.say)

    def say(self, line: str) -> None:
        print(f"{self.prefix}: {line}", file=sys.stderr, flush=True)

    def held_by_another_run(self) -> str | None:
        """The refusal line when a live run already holds the work directory (the same
        job started twice); None when it is free or cannot be read."""
        if not self.record.workdir:
            return None
        from input_pipeline import storage
        from mlperf import lease

        try:
            workdir = storage.resolve(self.record.workdir)
            holder = lease.held_by(workdir)
        except OSError:
            return None
        return lease.held_message(workdir, holder) if holder else None

    def run(
        self,
        run_attempt: Callable[[int], Attempt],
        recover: Callable[[Attempt | None, float], float],
    ) -> int:
        refusal = self.held_by_another_run()
        if refusal:  # before anything is started or written there
            print(f"multipod: error: {refusal}", file=sys.stderr, flush=True)
            return EXIT_WORKDIR_HELD
        previous: Attempt | None = None
        ended = self.clock()
        lost = no_machines = 0.0
        attempt = 0
        while True:
            no_machines = recover(previous, ended)
            started = self.clock()
            if previous is not None:
                lost, no_machines = started - ended, min(no_machines, started - ended)
                self.record.restarted(previous, lost, no_machines)
            attempt += 1
            self.record.starting(attempt)
            result = run_attempt(attempt)
            ended = self.clock()
            retry, meaning = classify(result.code)
            retry = retry if result.retry is None else result.retry
            result.cause = result.cause or meaning
            self.record.ended(result, started, ended)
            head = self._ended_line(attempt, result, ended - started, lost, no_machines)
            if result.code == EXIT_TARGET_REACHED or not retry:
                self.say(f"{head}; not restarted.")
                return result.code
            if attempt > self.max_restarts:
                used = f"{self.max_restarts} restart(s)"
                self.say(f"{head}; giving up after {used} (--max_restarts).")
                return result.code
            wait = self.backoff.next(ended - started)
            self.say(f"{head}; restart {attempt} of at most {self.max_restarts} in {wait:g} s.")
            self.sleep(wait)
            previous = result

    @staticmethod
    def _ended_line(
        attempt: int, result: Attempt, ran_s: float, lost_s: float, no_machines_s: float
    ) -> str:
        """How an attempt ended: cause, code, machines' state, time lost before it."""
        line = (
            f"attempt {attempt} ended after {_duration(ran_s)}: {result.cause} (exit {result.code})"
        )
        line += f"; {result.state}" if result.state else ""
        if attempt > 1:
            line += f"; {_duration(lost_s)} lost before it started"
            if no_machines_s > 0:
                line += f" ({_duration(no_machines_s)} without machines)"
        return line
