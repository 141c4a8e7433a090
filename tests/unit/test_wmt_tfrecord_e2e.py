"""A tiny Transformer run on the reference-format WMT TFRecord fixture: it trains on the
packed shards, decodes the dev file with the subword vocabulary and logs the reference's
BLEU (eval.bleu=mlperf_v07) in result.json and the MLPerf log."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from configs.transformer import get_config
from mlperf.train import run

pytestmark = [pytest.mark.xdist_group("e2e")]


def test_tiny_tfrecord_run_logs_the_reference_bleu(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the config's fixture folder is relative to the project root
    c = get_config("tiny_tfrecord")
    c.data.cache_dir = str(tmp_path / "cache")
    c.checkpoint.enabled = False
    c.train.update(steps=8, eval_every_samples=32 * 4)
    result = run(c, str(tmp_path / "run"))
    assert result["steps"] == 8
    ev = result["eval"]
    assert ev["eval_examples"] == 24  # the whole dev file
    assert 0.0 <= ev["bleu"] <= 100.0 and ev["bleu_fraction"] == pytest.approx(ev["bleu"] / 100)
    assert ev["bleu_ref_len"] > 24  # the decoded references, tokenised by the reference's rules
    log = (tmp_path / "run" / "mllog.txt").read_text()
    accuracies = [
        json.loads(line.split(":::MLLOG ", 1)[1])["value"]
        for line in log.splitlines()
        if '"key": "eval_accuracy"' in line
    ]
    assert len(accuracies) == 2 and accuracies[-1] == pytest.approx(ev["bleu_fraction"])
