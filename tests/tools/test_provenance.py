"""mlperf.provenance: result.json names the commit of the code that ran and whether the
tracked files matched it."""

from __future__ import annotations

import subprocess

from mlperf import provenance
from mlperf.reporting import RunResult


def test_code_commit_is_this_checkouts_head_and_its_state():
    commit, clean = provenance.code_commit()
    head = subprocess.run(
        ["git", "rev-parse", "--short=10", "HEAD"],
        cwd=provenance._ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert commit == head and isinstance(clean, bool)
    assert provenance.describe(commit, False) == f"{commit}-dirty"
    assert provenance.describe(commit, True) == commit


def test_outside_a_checkout_the_commit_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setattr(provenance, "_ROOT", tmp_path)
    provenance.code_commit.cache_clear()
    try:
        assert provenance.code_commit() == (provenance.UNKNOWN, None)
    finally:
        provenance.code_commit.cache_clear()


def test_run_result_records_the_commit():
    fields = dict.fromkeys(
        ("benchmark", "variant", "target_metric", "status", "params_fingerprint", "mllog"), "x"
    )
    numbers = dict.fromkeys(
        ("steps", "samples", "target", "run_time_s", "init_time_s", "train_loss"), 0
    )
    result = RunResult(
        **fields,
        **numbers,
        reached_target=True,
        eval={},
        mesh={"data": 1},
        devices=1,
        platform="cpu",
        processes=1,
        params=1,
    )
    assert (result["commit"], result["tree_clean"]) == provenance.code_commit()
