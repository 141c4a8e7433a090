"""End-to-end runs through mlperf.train.run: two-phase pretraining switches sequence length
mid-run. (bert:tiny to its target with a compliant log: tests/system/test_bucket_runs.py.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

from configs.bert import get_config
from mlperf.train import run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]


def _text_corpus(path, docs=60, seed=0):
    rng = np.random.default_rng(seed)
    words = (
        "the lobster sea claw red blue ocean species large small eggs larvae summer "
        "crab shell water night day grow young adult rock mud food king"
    ).split()
    with open(path, "w") as f:
        for _ in range(docs):
            for _ in range(int(rng.integers(3, 8))):
                f.write(" ".join(rng.choice(words, int(rng.integers(5, 14)))) + " .\n")
            f.write("\n")
    return str(path)


def test_two_phase_run_switches_sequence_length(tmp_path):
    c = get_config("tiny")
    corpus = _text_corpus(tmp_path / "corpus.txt")
    c.data.update(
        corpus="files",
        train_files=(corpus,),
        eval_fraction=0.2,
        vocab_size=128,
        cache_dir=str(tmp_path / "cache"),
        seq_length=16,
        max_predictions=3,
        max_eval_examples=32,
    )
    c.model.update(hidden_size=32, num_layers=1, num_heads=4, mlp_dim=64, max_position=32)
    c.train.update(
        global_batch_size=16,
        eval_batch_size=16,
        steps=10,
        log_every_steps=5,
        eval_every_samples=16 * 5,
        target=2.0,
    )  # unreachable: run every step
    c.phase2.update(
        enabled=True,
        start_samples=16 * 10,
        seq_length=32,
        max_predictions=5,
        global_batch_size=8,
        learning_rate=1e-3,
        warmup_steps=1,
        steps=6,
    )
    result = run(c, str(tmp_path / "work"))
    assert result["steps"] == 16
    assert result["samples"] == 16 * 10 + 8 * 6
    assert not result["reached_target"] and result["status"] == "aborted"
    log = (tmp_path / "work" / "mllog.txt").read_text()
    assert log.count('"key": "eval_accuracy"') >= 3
    assert os.path.exists(tmp_path / "work" / "result.json")
