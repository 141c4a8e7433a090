"""An inter-process file lock, so processes on one machine build each cached artifact once."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Holds an exclusive fcntl lock on path (created if missing) for the with-block.

    fcntl locks are released by the kernel when a process dies, so a crashed builder never
    leaves a stale lock behind.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
