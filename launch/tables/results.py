"""The README's results table, written from the quality runs' result.json files.

`launch.results_table` is the command; this module holds the parts it and its tests use:
read result.json files, format one markdown table with the date, commit and machine of
the runs, and put it between two marker lines of a markdown file. The commit is the one
each result.json records (the code that ran), never the tree that writes the table: runs
from several commits, from a tree with uncommitted changes or with no recorded commit
make no table unless asked to, and then the table says so in bold. No jax: it runs in a
second.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
from collections.abc import Sequence
from typing import Any

from mlperf.provenance import describe

START_MARKER = "<!-- results-table:start (written by `make results-table`; do not edit) -->"
END_MARKER = "<!-- results-table:end -->"

# Metrics that a benchmark must reach besides its `target_metric` (Mask R-CNN's mask mAP).
_SECOND_TARGETS = {"maskrcnn": "mask_ap"}
# Row order: as `make quality` runs them, tiny variants first.
_ORDER = ("bert", "transformer", "ssd", "maskrcnn")


class ResultsTableError(ValueError):
    """Bad input for the table: no results, a broken result.json, missing markers."""


def load_results(paths: Sequence[str]) -> list[dict[str, Any]]:
    """result.json of each path (a run's workdir, a result.json, or a glob of either).

    Each result gets `_date` (UTC date of the file's last write, i.e. of the run's end).
    """
    files: list[str] = []
    for pattern in paths:
        for path in sorted(glob.glob(pattern)) or [pattern]:
            candidate = os.path.join(path, "result.json") if os.path.isdir(path) else path
            # Other files a glob of a quality folder matches (quality.json) are not runs.
            if os.path.basename(candidate) == "result.json" and os.path.isfile(candidate):
                files.append(candidate)
    if not files:
        raise ResultsTableError(
            f"no result.json under {', '.join(paths)}: run `make quality` first "
            "(it writes one per run)."
        )
    results = []
    for file in files:
        try:
            with open(file) as f:
                result = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ResultsTableError(f"{file}: not a readable result.json ({e}).") from e
        for key in ("benchmark", "variant", "reached_target", "target_metric", "target"):
            if key not in result:
                raise ResultsTableError(f"{file}: result.json has no {key!r}.")
        mtime = os.path.getmtime(file)
        result["_date"] = datetime.datetime.fromtimestamp(mtime, datetime.UTC).date().isoformat()
        results.append(result)
    return results


def _mesh(result: dict[str, Any]) -> str:
    mesh = result.get("mesh")
    if isinstance(mesh, dict):
        return " x ".join(f"{k} {v}" for k, v in mesh.items())
    return str(mesh) if mesh is not None else "-"


def _value(result: dict[str, Any], metric: str) -> str:
    value = (result.get("eval") or {}).get(metric)
    return f"{value:.4g}" if isinstance(value, int | float) else "-"


def _row(result: dict[str, Any]) -> str:
    name = f"`{result['benchmark']}:{result['variant']}`"
    metric = result["target_metric"]
    target = f"{metric} >= {result['target']}"
    final = _value(result, metric)
    second = _SECOND_TARGETS.get(result["benchmark"])
    if second:
        target += f" and {second} >= its target"
        final += f" / {_value(result, second)}"
    reached = "yes" if result["reached_target"] else "**no**"
    ttt = result.get("time_to_target_s")
    ttt_text = f"{ttt:.0f} s" if result["reached_target"] and ttt is not None else "-"
    samples = result.get("samples_to_target")
    steps = result.get("steps_to_target")
    to_target = f"{samples:,} (step {steps})" if samples is not None else "-"
    run_time = result.get("run_time_s")
    init_time = result.get("init_time_s")
    times = (
        f"{run_time:.0f} s + {init_time:.0f} s"
        if run_time is not None and init_time is not None
        else "-"
    )
    return (
        f"| {name} | {_mesh(result)} | {target} | {reached} ({final}) | {ttt_text} | "
        f"{to_target} | {times} | {result['_date']} |"
    )


def _commit_of(result: dict[str, Any]) -> str:
    """The run's commit as result.json records it (`-dirty` when its tree was not clean)."""
    if "commit" not in result:
        return "not recorded"
    return describe(result["commit"], result.get("tree_clean"))


def provenance(results: Sequence[dict[str, Any]], allow_mixed: bool = False) -> str:
    """The table's commit line: `Commit `abc1234567`` when every run ran one clean commit.

    Otherwise (several commits, a dirty tree, a result.json with no commit or an unknown
    one) a ResultsTableError, or with `allow_mixed` a bold line naming each commit and
    how many runs ran it.
    """
    commits: dict[str, int] = {}
    for result in results:
        commits[_commit_of(result)] = commits.get(_commit_of(result), 0) + 1
    clean = all(r.get("tree_clean") is True for r in results)
    if len(commits) == 1 and clean:
        return f"Commit `{next(iter(commits))}`"
    listing = ", ".join(f"`{c}` ({n} run{'s' if n > 1 else ''})" for c, n in commits.items())
    if not allow_mixed:
        raise ResultsTableError(
            f"the runs are not from one clean commit ({listing}): rerun `make quality` "
            "on a committed tree, or pass --allow_mixed to write a table marked as such."
        )
    return f"**NOT ONE CLEAN COMMIT: {listing}**"


def markdown_table(
    results: Sequence[dict[str, Any]], machine: str, allow_mixed: bool = False
) -> str:
    """The table with a line saying what made it (the runs' commit, machine, command)."""
    lines = [
        f"{provenance(results, allow_mixed)}, {machine}; written by `make results-table` from the "
        "result.json of each `make quality` run (time to target counts from MLPerf's "
        "`run_start`; run + init is the loop's run time and the compile / data preparation "
        "before it).",
        "",
        "| run | mesh | target | reached (final) | time to target | samples to target "
        "| run + init | date (UTC) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def order(result: dict[str, Any]) -> tuple:
        benchmark = result["benchmark"]
        rank = _ORDER.index(benchmark) if benchmark in _ORDER else len(_ORDER)
        return rank, benchmark, result["variant"] != "tiny", result["variant"]

    lines += [_row(r) for r in sorted(results, key=order)]
    return "\n".join(lines)


def replace_between_markers(
    text: str, table: str, start_marker: str = START_MARKER, end_marker: str = END_MARKER
) -> str:
    """`text` with everything between the two marker lines replaced by `table`."""
    start = text.find(start_marker)
    end = text.find(end_marker)
    if start < 0 or end < 0 or end < start:
        raise ResultsTableError(
            f"the file has no {start_marker!r} ... {end_marker!r} block to replace; "
            "add the two marker lines where the table goes."
        )
    head = text[: start + len(start_marker)]
    return f"{head}\n{table}\n{text[end:]}"
