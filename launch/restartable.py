"""Whether a restart can help a run that ended with an exit code, for schedulers'
scripts (`launch/slurm_gpu.sbatch` requeues on it):

    python -m launch.restartable CODE

prints what the code means and exits 0 when the run should be started again (preempted,
a peer lost, the store unreachable, killed by a signal: `launch/supervisor.py`'s table),
1 when no restart can help (target reached or not, bad input, a bug), 2 when CODE is not
an integer."""

from __future__ import annotations

import sys

from launch.supervisor import classify


def main(argv: list[str]) -> int:
    """The decision for argv's one exit code (see the module docstring)."""
    if len(argv) != 1 or not argv[0].lstrip("-").isdigit():
        print(
            f"launch.restartable: give one exit code, e.g. 143; got {' '.join(argv) or 'none'}",
            file=sys.stderr,
        )
        return 2
    retry, meaning = classify(int(argv[0]))
    print(meaning)
    return 0 if retry else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
