"""Every host's output in the work directory: WORKDIR/logs/host_<i>.log.

launch.train copies what it prints (stdout and stderr, tracebacks included) into its
host's log from the moment the run holds its work directory (mlperf/lease.py) to its
exit; each attempt appends, after a header line naming the host, pid and time. A work
directory in a bucket gets a local file (mlperf/staged_files.py's staging folder) that
is uploaded every UPLOAD_EVERY_S seconds and at exit, so a host that is lost takes at
most that much of its log with it; a resumed attempt first downloads the bucket's copy
and goes on from it. XLA's own C++ log lines (written to the file descriptor, not
through Python) stay on the terminal only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import threading
import time
from typing import IO, Any

from mlperf.staged_files import StagedWorkdir

UPLOAD_EVERY_S = 60.0
_open: list[HostLog] = []


class _Tee:
    """A text stream that writes to the original stream and to the log file."""

    def __init__(self, stream: Any, log: HostLog):
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        self._log.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...
        return getattr(self._stream, name)


class HostLog:
    """The log of one host (process) of a run; see the module docstring."""

    def __init__(self, workdir: str, index: int):
        self.rel = f"logs/host_{index}.log"
        self.staged = StagedWorkdir(workdir)
        self.path = self.staged.path(self.rel)
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._stop = threading.Event()
        self._streams = (sys.stdout, sys.stderr)
        try:
            if self.staged.remote:
                self.staged.pull(self.rel)  # go on from the bucket's copy
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
        except OSError as e:  # a log is never a reason to stop a run
            print(f"WARNING: no host log in {self.staged.url(self.rel)}: {e}", flush=True)
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        self.write(f"==== launch.train on {socket.gethostname()}, pid {os.getpid()}, {stamp}\n")
        sys.stdout, sys.stderr = _Tee(sys.stdout, self), _Tee(sys.stderr, self)
        if self.staged.remote:
            threading.Thread(target=self._upload_loop, daemon=True, name="host-log").start()
        atexit.register(self.close)
        _open.append(self)

    def write(self, text: str) -> None:
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.write(text)
                if "\n" in text:
                    self._file.flush()
            except OSError:  # a full disk: stop copying, keep training
                self._file = None

    def upload(self) -> None:
        """Flushes the log and, for a bucket, uploads it (a failure is one warning)."""
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.flush()
        self.staged.push(self.rel)

    def _upload_loop(self) -> None:
        while not self._stop.wait(UPLOAD_EVERY_S):
            self.upload()

    def close(self) -> None:
        """Restores the streams, closes the file and uploads it a last time."""
        if self._stop.is_set():
            return
        self._stop.set()
        sys.stdout, sys.stderr = self._streams
        self.upload()
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None
        with contextlib.suppress(ValueError):
            _open.remove(self)


def start(workdir: str, index: int) -> HostLog:
    """Copies this process's output into WORKDIR/logs/host_<index>.log from now on."""
    return HostLog(workdir, index)


def close_all() -> None:
    """Closes (and uploads) every open host log: for exits that skip atexit (os._exit)."""
    for log in list(_open):
        log.close()
