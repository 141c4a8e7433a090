"""One run per work directory: a lease that the running run renews and that expires.

A run takes the lease before it touches its work directory and renews it every
`TTL_S / 4` seconds while it lives; a second run started on the same work directory (a
command typed twice, a restart while an old process lingers) is refused with one line
naming the holder: its host, pid and start time. A holder killed with SIGKILL stops
renewing, so its lease expires `TTL_S` after the last renewal; on the holder's own host
a dead pid frees the lease at once.

The lease is a series of small JSON files, WORKDIR/lease/<n>.json, each created with the
store's atomic create (`storage.create_exclusive`: a local hard link, an object upload
with generation precondition 0), so of two runs that find lease n expired only one
creates n + 1. The newest file is the lease; its holder rewrites it to renew it and marks
it released at the end. A holder that finds a newer file than its own has lost the
lease (it was presumed dead, e.g. cut off from the bucket for longer than TTL_S) and
stops at once, before writing anything else, so two runs never write the same work
directory.

In a multi-process run, process 0 holds the lease for all of them and tells the others
through jax.distributed's key-value store whether the run may go on.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

from input_pipeline import storage

FOLDER = "lease"
# A killed holder's lease expires this long after its last renewal (seconds). Renewals
# come every TTL_S / 4, so a holder has to miss several in a row to lose it.
TTL_S = float(os.environ.get("MULTIPOD_LEASE_TTL_S", "120"))
# How long a run waits for a held work directory before it gives up (launch.train
# --workdir_wait_s sets it); 0: refuse at once.
WAIT_S = 0.0
# The exit code of a holder that lost its lease (launch.cli.EXIT_WORKDIR_HELD).
EXIT_LEASE_LOST = 3
# Called with the work directory once every process knows the run holds it (launch.train
# starts each host's log there: nothing may write into a work directory before that).
ON_ACQUIRED: list[Callable[[str], None]] = []

_KEY = "multipod/lease/{}"
_uses = itertools.count()
# The leases this process holds, by work directory: a process that runs again on the same
# work directory (an in-process caller after an exception) replaces its own lease.
_HELD_HERE: dict[str, WorkdirLease] = {}


class WorkdirHeldError(RuntimeError):
    """Another live run holds the work directory; the message names it."""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_start(pid: int) -> str:
    """The start time of `pid` in clock ticks since boot ('' when unknown or gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


@dataclasses.dataclass
class Holder:
    """Who holds a lease, since when, and when it last said it was alive (wall time)."""

    host: str
    pid: int
    started: float
    renewed: float
    ttl_s: float = TTL_S
    released: bool = False
    boot_id: str = ""
    pid_start: str = ""

    @classmethod
    def me(cls, ttl_s: float) -> Holder:
        now = time.time()
        pid = os.getpid()
        return cls(socket.gethostname(), pid, now, now, ttl_s, False, _boot_id(), _pid_start(pid))

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Holder:
        saved = json.loads(data)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in names})

    def on_this_machine(self) -> bool:
        return self.host == socket.gethostname() and self.boot_id == _boot_id()

    def is_this_process(self) -> bool:
        return self.on_this_machine() and self.pid == os.getpid()

    def dead_here(self) -> bool:
        """True when the holder ran on this machine and its process is gone (or its pid
        now belongs to another process)."""
        if not self.on_this_machine():
            return False
        now_start = _pid_start(self.pid)
        return not now_start or (bool(self.pid_start) and now_start != self.pid_start)

    def live(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return not self.released and now < self.renewed + self.ttl_s and not self.dead_here()

    def describe(self, now: float | None = None) -> str:
        """`host H, pid P, started <UTC time> (renewed N s ago, expires in M s)`."""
        now = time.time() if now is None else now
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        left = self.renewed + self.ttl_s - now
        return (
            f"host {self.host}, pid {self.pid}, started {started} (lease renewed "
            f"{max(now - self.renewed, 0):.0f} s ago, expires in {max(left, 0):.0f} s)"
        )


def _folder(workdir: str) -> str:
    return storage.join(workdir, FOLDER)


def _path(workdir: str, seq: int) -> str:
    return storage.join(_folder(workdir), f"{seq:08d}.json")


def _sequence(workdir: str) -> list[int]:
    names = storage.listdir(_folder(workdir))
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def _read(workdir: str, seq: int) -> Holder | None:
    """The holder in lease file `seq`; None when it is gone or unreadable."""
    try:
        return Holder.from_json(storage.read_bytes(_path(workdir, seq)))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def current(workdir: str) -> tuple[int, Holder | None] | None:
    """(n, holder) of the newest lease file, or None when the work directory has none."""
    seqs = _sequence(workdir)
    if not seqs:
        return None
    return seqs[-1], _read(workdir, seqs[-1])


def held_by(workdir: str) -> Holder | None:
    """The live holder of the work directory's lease, or None when it is free."""
    found = current(workdir)
    if found is None or found[1] is None:
        return None
    return found[1] if found[1].live() else None


def held_message(workdir: str, holder: Holder) -> str:
    return (
        f"the work directory {workdir} is in use by another run: {holder.describe()}. "
        "Stop that run or wait for it to end (a killed run's lease expires "
        f"{holder.ttl_s:.0f} s after its last renewal), or give another --workdir."
    )


class WorkdirLease:
    """The lease of one run on its work directory, renewed by a daemon thread."""

    def __init__(
        self,
        workdir: str,
        seq: int,
        holder: Holder,
        on_lost: Callable[[str, Holder], None] | None = None,
    ):
        self.workdir, self.seq, self.holder = workdir, seq, holder
        self.on_lost = on_lost or _lease_lost  # ends the process (tests pass their own)
        self.released = False
        self._lock = threading.Lock()  # a renewal never overwrites the release
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._renew_loop, daemon=True, name="lease")
        self._thread.start()
        atexit.register(self.release)  # a run that ends in an exception frees it too
        _HELD_HERE[workdir] = self

    @classmethod
    def acquire(
        cls,
        workdir: str,
        wait_s: float = 0.0,
        ttl_s: float | None = None,
        on_lost: Callable[[str, Holder], None] | None = None,
    ) -> WorkdirLease:
        """Takes the work directory's lease; waits up to `wait_s` for a live holder to
        end, then raises WorkdirHeldError naming it."""
        ttl_s = TTL_S if ttl_s is None else ttl_s
        deadline = time.monotonic() + wait_s
        said = False
        while True:
            found = current(workdir)
            holder = found[1] if found else None
            if holder is not None and holder.is_this_process() and workdir in _HELD_HERE:
                _HELD_HERE.pop(workdir).forget()
            if holder is not None and holder.live() and not holder.is_this_process():
                if time.monotonic() >= deadline:
                    raise WorkdirHeldError(held_message(workdir, holder))
                if not said:
                    print(f"waiting up to {wait_s:.0f} s for {workdir}: {holder.describe()}")
                    said = True
                time.sleep(min(5.0, max(deadline - time.monotonic(), 0.1)))
                continue
            seq = found[0] + 1 if found else 1
            me = Holder.me(ttl_s)
            if storage.create_exclusive(_path(workdir, seq), me.to_json()):
                for old in _sequence(workdir):
                    if old < seq:
                        with contextlib.suppress(OSError):
                            storage.remove(_path(workdir, old))
                return cls(workdir, seq, me, on_lost)
            # Another run created lease n + 1 first: look again.

    def lost_to(self) -> Holder | None:
        """The holder of a newer lease than ours, if another run took it over."""
        newer = [s for s in _sequence(self.workdir) if s > self.seq]
        if not newer:
            return None
        return _read(self.workdir, newer[-1]) or Holder("unknown", 0, 0.0, 0.0)

    def _still_there(self) -> bool:
        """False when our lease file is gone (the work directory was deleted): nothing
        to renew or release, and nothing to recreate."""
        return self.seq in _sequence(self.workdir)

    def renew(self) -> None:
        """Says we are alive; stops the process at once if another run took the lease."""
        with self._lock:
            if self.released:
                return
            taker = self.lost_to()
            if taker is None and not self._still_there():
                self._stop.set()
                self.released = True
                return
            if taker is None:
                self.holder.renewed = time.time()
                storage.write_bytes(_path(self.workdir, self.seq), self.holder.to_json())
                return
            self._stop.set()
            self.released = True  # not ours any more: nothing to release
        self.on_lost(self.workdir, taker)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.holder.ttl_s / 4):
            try:
                self.renew()
                self._warned = False
            except OSError as e:  # the store is unreachable: try again at the next turn
                if not self._warned:
                    print(f"WARNING: could not renew the lease on {self.workdir}: {e}", flush=True)
                    self._warned = True

    def forget(self) -> None:
        """Stops renewing without writing anything (this process takes a new lease)."""
        self._stop.set()
        with self._lock:
            self.released = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.release)

    def release(self) -> None:
        """Marks the lease released (unless another run has taken it over meanwhile)."""
        self._stop.set()
        with contextlib.suppress(Exception):
            atexit.unregister(self.release)
        if _HELD_HERE.get(self.workdir) is self:
            del _HELD_HERE[self.workdir]
        with self._lock:
            if self.released:
                return
            self.released = True
            try:
                if self.lost_to() is None and self._still_there():
                    self.holder.released = True
                    storage.write_bytes(_path(self.workdir, self.seq), self.holder.to_json())
            except OSError as e:  # it expires by itself
                print(f"WARNING: could not release the lease on {self.workdir}: {e}", flush=True)


class _Follower:
    """What the other processes of a multi-process run hold: nothing to release."""

    released = False

    def release(self) -> None:
        self.released = True


def _lease_lost(workdir: str, taker: Holder) -> None:
    print(
        f"multipod: error: another run took over the work directory {workdir} "
        f"({taker.describe()}): this run was presumed dead (no lease renewal for "
        f"{taker.ttl_s:.0f} s); stopping at once so that two runs never write it.",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(EXIT_LEASE_LOST)


def hold_workdir(workdir: str, wait_s: float | None = None) -> WorkdirLease | _Follower:
    """The run's lease on `workdir`, agreed by every process: process 0 takes it and the
    others learn the outcome; a held work directory raises WorkdirHeldError on all."""
    import jax

    wait_s = WAIT_S if wait_s is None else wait_s
    if jax.process_count() == 1:
        lease = WorkdirLease.acquire(workdir, wait_s)
        _acquired(workdir)
        return lease
    from jax._src import distributed

    client = distributed.global_state.client
    key = _KEY.format(next(_uses))
    if jax.process_index() == 0:
        try:
            lease = WorkdirLease.acquire(workdir, wait_s)
        except WorkdirHeldError as e:
            client.key_value_set(key, f"held {e}")
            raise
        except Exception as e:  # the store failed: the others stop too, not wait
            transient = isinstance(e, storage.StorageError) and e.transient
            kind = "transient" if transient else "error"
            client.key_value_set(key, f"{kind} {type(e).__name__}: {e}")
            raise
        client.key_value_set(key, "ok")
        _acquired(workdir)
        return lease
    answer = client.blocking_key_value_get(key, int((wait_s + 600) * 1000))
    if answer.startswith("held "):
        raise WorkdirHeldError(answer[len("held ") :])
    kind, _, why = answer.partition(" ")
    if kind in ("error", "transient"):
        raise storage.StorageError(
            f"process 0 could not take the lease on {workdir}: {why}",
            transient=kind == "transient",
        )
    _acquired(workdir)
    return _Follower()


def _acquired(workdir: str) -> None:
    for callback in ON_ACQUIRED:
        callback(workdir)


def wait_until_free(workdir: str, timeout_s: float, say: Callable[[str], None]) -> bool:
    """Waits until no live run holds `workdir` (a supervisor before a restart); True when
    free, False after `timeout_s`. A store that cannot be read counts as free (the run's
    own check decides)."""
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            holder = held_by(workdir)
        except OSError:
            return True
        if holder is None:
            return True
        if time.monotonic() >= deadline:
            return False
        if not said:
            say(f"waiting for the run that holds {workdir} to end: {holder.describe()}")
            said = True
        time.sleep(min(5.0, max(deadline - time.monotonic(), 0.1)))
