"""Which code ran: the git commit of this checkout and whether its tracked files match it.

A run's result.json and each compiled TPU-table row record these, so that a table written
from them names the code that produced its numbers, not the tree that writes the table.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

# What result.json says when the code is not a git checkout (an installed wheel).
UNKNOWN = "unknown (not a git checkout)"

_ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.cache
def code_commit() -> tuple[str, bool | None]:
    """(commit, tree_clean) of the checkout this package runs from.

    `commit` is HEAD's 10-digit hash; `tree_clean` is False when tracked files differ
    from it (untracked files do not count, as with `git describe --dirty`). Outside a git
    checkout, or when the enclosing repository is another project's: (UNKNOWN, None).
    Cached: a process reports the state it first saw (the code it imported then).
    """
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != _ROOT:
        return UNKNOWN, None
    commit = _git("rev-parse", "--short=10", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    if commit is None or status is None:
        return UNKNOWN, None
    return commit, status == ""


def describe(commit: str, tree_clean: bool | None) -> str:
    """`commit` as a table names it: `abc1234567`, `abc1234567-dirty` or the unknown text."""
    return f"{commit}-dirty" if tree_clean is False else commit
