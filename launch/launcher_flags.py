"""Flags that the launchers share (`launch.tpu`, `launch.gke`, `launch.local`), defined
once: absl refuses a flag name that two modules define, and a program (or a test
process) may import several launchers. A default that differs per launcher is None
here and filled in by `value_or`."""

from __future__ import annotations

from typing import TypeVar

from absl import flags

T = TypeVar("T")

NAME = flags.DEFINE_string(
    "name", None, "launch.tpu: the TPU VM (or queued resource); launch.gke: the JobSet."
)
NUM_SLICES = flags.DEFINE_integer(
    "num_slices",
    1,
    "Slices; launch.tpu: > 1 uses a queued resource with nodes NAME-0 .. NAME-{K-1}; "
    "launch.gke: one replicatedJob each.",
    lower_bound=1,
)
DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Print the commands (gcloud) or the manifest (kubectl); run nothing."
)
MAX_RESTARTS = flags.DEFINE_integer(
    "max_restarts",
    None,
    "Restarts before giving up: launch.tpu supervise (default 20), launch.local --supervise "
    "(3); launch.gke: the JobSet's failurePolicy.maxRestarts (10).",
    lower_bound=0,
)
BACKOFF_S = flags.DEFINE_float(
    "backoff_s",
    None,
    "Wait before the first restart, doubled after each (launch.tpu supervise: 60 s; "
    "launch.local --supervise: 1 s).",
    lower_bound=0.0,
)
MAX_BACKOFF_S = flags.DEFINE_float(
    "max_backoff_s",
    None,
    "Longest wait between restarts (launch.tpu supervise: 1800 s; launch.local: 60 s).",
    lower_bound=0.0,
)


def value_or(holder: flags.FlagHolder, default: T) -> T:
    """The flag's value, or this launcher's default when it was not given."""
    return default if holder.value is None else holder.value
