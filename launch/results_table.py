"""Write the README's results table from the quality runs' result.json files.

    python -m launch.results_table [--results '/tmp/multipod/quality/*'] [--readme README.md]
        [--machine "2-core CPU container, 8 fake CPU devices"] [--print_only] [--allow_mixed]

Replaces the block between the README's results-table markers with one row per run
(target, reached, time and samples to target, run and init time, date), headed by the
commit the runs' result.json files record and the machine. Runs from several commits or
from a tree with uncommitted changes are refused (--allow_mixed: written, with a bold
line naming each commit). `make results-table` runs it on the `make quality` work
directories.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from launch.tables.results import (
    ResultsTableError,
    load_results,
    markdown_table,
    replace_between_markers,
)

_RESULTS = flags.DEFINE_list(
    "results",
    ["/tmp/multipod/quality/*", "/tmp/multipod/quality-real/*"],
    "Run work directories or result.json files (globs allowed); missing ones are skipped.",
)
_README = flags.DEFINE_string("readme", "README.md", "Markdown file with the table markers.")
_MACHINE = flags.DEFINE_string(
    "machine", "", "What the runs ran on (default: this host's cores and the runs' devices)."
)
_ALLOW_MIXED = flags.DEFINE_bool(
    "allow_mixed",
    False,
    "Write the table even when the runs are not from one clean commit (marked in bold).",
)
_PRINT_ONLY = flags.DEFINE_bool("print_only", False, "Print the table; do not write the file.")


def default_machine(results: list[dict]) -> str:
    """`N-core CPU host, D fake cpu devices` from this host and the runs' device counts."""
    devices = sorted({f"{r.get('devices', '?')} {r.get('platform', '?')}" for r in results})
    return f"{os.cpu_count()}-core host, {' / '.join(devices)} devices"


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        results = load_results(_RESULTS.value)
        table = markdown_table(
            results,
            machine=_MACHINE.value or default_machine(results),
            allow_mixed=_ALLOW_MIXED.value,
        )
        if _PRINT_ONLY.value:
            print(table)
            return
        with open(_README.value) as f:
            text = f.read()
        text = replace_between_markers(text, table)
    except (ResultsTableError, OSError) as e:
        sys.exit(f"results_table: {e}")
    with open(_README.value, "w") as f:
        f.write(text)
    print(f"results_table: {len(results)} runs written into {_README.value}")


if __name__ == "__main__":
    app.run(main)
