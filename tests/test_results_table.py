"""launch.results_table: the README's results table is written from result.json files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mlperf.results_table import (
    END_MARKER,
    START_MARKER,
    ResultsTableError,
    load_results,
    markdown_table,
    replace_between_markers,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    table = markdown_table(results, commit="abc1234", machine="2-core CPU container")
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == 2
    bert, maskrcnn = rows  # sorted by directory name
    assert "`bert:tiny`" in bert and "**no** (0.1)" in bert and "| - |" in bert
    assert "`maskrcnn:tiny`" in maskrcnn and "yes (0.539 / 0.509)" in maskrcnn
    assert "3,200 (step 200)" in maskrcnn and "49 s" in maskrcnn and "61 s + 30 s" in maskrcnn
    assert "data 8 x model 1" in maskrcnn
    assert "abc1234" in table and "2-core CPU container" in table


def test_cli_rewrites_only_the_block_between_the_markers(runs):
    readme = runs / "README.md"
    readme.write_text(f"# title\n\nbefore\n{START_MARKER}\nold table\n{END_MARKER}\nafter\n")
    cmd = [sys.executable, "-m", "launch.results_table", f"--readme={readme}"]
    cmd += [f"--results={runs}/quality/*", "--commit=abc1234", "--machine=test host"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    assert "2 runs written" in out.stdout
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n" + START_MARKER + "\n")
    assert text.endswith(END_MARKER + "\nafter\n")
    assert "old table" not in text and "`maskrcnn:tiny`" in text and "abc1234" in text
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


def test_the_readme_holds_one_generated_table():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert text.count(START_MARKER) == 1 and text.count(END_MARKER) == 1
    block = text[text.index(START_MARKER) : text.index(END_MARKER)]
    assert "written by `make results-table`" in block
    assert "| run | mesh | target |" in block
