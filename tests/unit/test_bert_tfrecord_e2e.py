"""A tiny BERT run on the reference-format TFRecord fixture: it trains, evaluates the whole
eval file, and writes an MLPerf log the 0.7.0 compliance checker accepts (bar the target)."""

from __future__ import annotations

import pytest
from conftest import REPO, compliance_check

from configs.bert import get_config
from mlperf.train import run

pytestmark = [pytest.mark.xdist_group("e2e")]


def test_tiny_tfrecord_run_writes_a_compliant_log(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the config's fixture folder is relative to the project root
    c = get_config("tiny_tfrecord")
    c.data.cache_dir = str(tmp_path / "cache")
    c.checkpoint.enabled = False
    result = run(c, str(tmp_path / "run"))
    assert result["steps"] == 12 and result["target"] == 0.712
    assert result["eval"]["eval_examples"] == 24  # the whole eval file
    log = (tmp_path / "run" / "mllog.txt").read_text()
    assert log.count('"key": "eval_accuracy"') == 2  # at 96 and 192 samples
    assert log.index('"key": "init_stop"') < log.index('"key": "run_start"')
    output, failures = compliance_check(tmp_path / "run" / "mllog.txt")
    assert failures == [
        "WARNING -  Failed checks for eval_accuracy : v['value'] >= 0.712 and v['value'] < 1.0"
    ], output
