"""launch.results_table: the README's results table is written from result.json files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from launch.tables.results import (
    END_MARKER,
    START_MARKER,
    ResultsTableError,
    load_results,
    markdown_table,
    replace_between_markers,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _result(benchmark, variant, reached, metric, value, **extra):
    """The keys mlperf.train writes into result.json that the table reads."""
    return {
        "benchmark": benchmark,
        "variant": variant,
        "reached_target": reached,
        "target_metric": metric,
        "target": 0.45 if benchmark == "maskrcnn" else 0.125,
        "time_to_target_s": 48.6 if reached else None,
        "samples_to_target": 3200 if reached else None,
        "steps_to_target": 200 if reached else None,
        "run_time_s": 61.2,
        "init_time_s": 30.4,
        "eval": {metric: value, **extra},
        "mesh": {"data": 8, "model": 1},
        "devices": 8,
        "platform": "cpu",
        "commit": "abc1234567",
        "tree_clean": True,
    }


@pytest.fixture
def runs(tmp_path):
    for name, result in {
        "maskrcnn_tiny": _result("maskrcnn", "tiny", True, "box_ap", 0.539, mask_ap=0.509),
        "bert_tiny": _result("bert", "tiny", False, "mlm_accuracy", 0.1),
    }.items():
        os.makedirs(tmp_path / "quality" / name)
        with open(tmp_path / "quality" / name / "result.json", "w") as f:
            json.dump(result, f)
    # launch.quality's summary sits beside the runs: not a run of its own.
    (tmp_path / "quality" / "quality.json").write_text("[]")
    return tmp_path


def test_table_has_one_row_per_run_with_its_numbers(runs):
    results = load_results([str(runs / "quality" / "*")])
    table = markdown_table(results, machine="2-core CPU container")
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == 2
    bert, maskrcnn = rows  # sorted by directory name
    assert "`bert:tiny`" in bert and "**no** (0.1)" in bert and "| - |" in bert
    assert "`maskrcnn:tiny`" in maskrcnn and "yes (0.539 / 0.509)" in maskrcnn
    assert "3,200 (step 200)" in maskrcnn and "49 s" in maskrcnn and "61 s + 30 s" in maskrcnn
    assert "data 8 x model 1" in maskrcnn
    # The commit is the one the runs recorded, not the tree that writes the table.
    assert table.startswith("Commit `abc1234567`, 2-core CPU container;")


def _write(runs, name, **changes):
    path = runs / "quality" / name / "result.json"
    result = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    path.write_text(json.dumps(result))


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"commit": "def4567890"}, "`abc1234567` (1 run), `def4567890` (1 run)"),
        ({"tree_clean": False}, "`abc1234567` (1 run), `abc1234567-dirty` (1 run)"),
        ({"commit": None}, "`abc1234567` (1 run), `not recorded` (1 run)"),
        ({"commit": "unknown (not a git checkout)", "tree_clean": None}, "), `unknown (not"),
    ],
)
def test_runs_not_from_one_clean_commit_are_refused_or_marked(runs, changes, named):
    _write(runs, "maskrcnn_tiny", **changes)
    results = load_results([str(runs / "quality" / "*")])
    with pytest.raises(ResultsTableError, match="not from one clean commit") as error:
        markdown_table(results, machine="host")
    assert named in str(error.value) and "\n" not in str(error.value)
    marked = markdown_table(results, machine="host", allow_mixed=True)
    assert marked.startswith("**NOT ONE CLEAN COMMIT: ") and named in marked.splitlines()[0]


def test_cli_rewrites_only_the_block_between_the_markers(runs):
    readme = runs / "README.md"
    readme.write_text(f"# title\n\nbefore\n{START_MARKER}\nold table\n{END_MARKER}\nafter\n")
    cmd = [sys.executable, "-m", "launch.results_table", f"--readme={readme}"]
    cmd += [f"--results={runs}/quality/*", "--machine=test host"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    assert "2 runs written" in out.stdout
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n" + START_MARKER + "\n")
    assert text.endswith(END_MARKER + "\nafter\n")
    assert "old table" not in text and "`maskrcnn:tiny`" in text and "abc1234567" in text
    # Run twice: the same file (the block is replaced, not appended to).
    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    assert readme.read_text() == text


def test_missing_results_or_markers_are_one_line_errors(runs, tmp_path):
    with pytest.raises(ResultsTableError, match="run `make quality` first"):
        load_results([str(tmp_path / "nothing" / "*")])
    with pytest.raises(ResultsTableError, match="marker"):
        replace_between_markers("# no markers\n", "table")
    cmd = [sys.executable, "-m", "launch.results_table", f"--results={tmp_path}/none/*"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("results_table: no result.json")
    _write(runs, "bert_tiny", tree_clean=False)
    cmd = [sys.executable, "-m", "launch.results_table", f"--results={runs}/quality/*"]
    out = subprocess.run(cmd + ["--print_only"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("results_table: the runs are not")


def test_the_readme_holds_one_generated_table():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert text.count(START_MARKER) == 1 and text.count(END_MARKER) == 1
    block = text[text.index(START_MARKER) : text.index(END_MARKER)]
    assert "written by `make results-table`" in block
    assert "| run | mesh | target |" in block
