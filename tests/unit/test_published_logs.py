"""Per-step times and steps to target from MLPerf result logs (block_start/block_stop)."""

from __future__ import annotations

import os

import pytest
from conftest import REPO

from launch import report
from mlperf.planning import published_logs

FIXTURE = os.path.join(REPO, "tests", "fixtures", "mlperf_v07_transformer_result.txt")


def ev(key: str, t: float = 0, value=None, **metadata) -> dict:
    """One MLLOG event as report.read_mllog gives it."""
    return {"key": key, "time_ms": t, "value": value, "metadata": metadata}


def test_v07_epoch_blocks_give_the_step_time_and_steps_to_target():
    """The hand-written v0.7-style Transformer log: 4 one-epoch blocks of 566,340 samples
    at global batch 2048 (276.5 steps each), 3.34-3.41 s per block, target after epoch 4."""
    events = report.read_mllog(FIXTURE)
    times = published_logs.block_step_times(events)
    assert times == pytest.approx([ms / 1000 / (566340 / 2048) for ms in (3410, 3350, 3340, 3360)])
    summary = published_logs.step_summary(events)
    assert summary["step_s"] == pytest.approx(3.355 / (566340 / 2048))  # 12.1 ms
    assert summary["blocks"] == 4
    assert summary["steps_to_target"] == pytest.approx(4 * 566340 / 2048)  # 1,106 steps


def test_bert_v07_epochs_are_steps_whatever_train_samples_says():
    """Google's v0.7 BERT logs number epochs in steps (blocks of 62) and log the run's
    whole sample budget as train_samples: two 62-step blocks of 1.05 s give 16.9 ms
    per step and 124 steps, not train_samples x 62 samples per block."""

    events = [
        ev("submission_benchmark", value="bert"),
        ev("global_batch_size", value=8192),
        ev("train_samples", value=4587520),
        ev("block_start", 0, first_epoch_num=0, epoch_count=62),
        ev("block_stop", 1050, first_epoch_num=0, epoch_count=62),
        ev("block_start", 1100, first_epoch_num=62, epoch_count=62),
        ev("block_stop", 2150, first_epoch_num=62, epoch_count=62),
    ]
    summary = published_logs.step_summary(events)
    assert summary["step_s"] == pytest.approx(1.05 / 62)
    assert summary["steps_to_target"] == pytest.approx(124)


def test_steps_to_target_stop_at_the_evaluation_that_reached_it():
    """Google's v0.7 SSD logs evaluate behind training: the epoch-80 result that stops the
    run arrives while epoch 110 trains, and blocks go on after run_stop. Steps to target
    are 80 epochs of 118,287 samples at batch 4096 (2,310 steps), not the 120 epochs the
    blocks reach (3,465)."""

    events = [ev("global_batch_size", value=4096), ev("train_samples", value=118287)]
    t = 0
    for epoch in range(1, 121):
        events += [ev("block_start", t, first_epoch_num=epoch, epoch_count=1)]
        events += [ev("block_stop", t + 100, first_epoch_num=epoch, epoch_count=1)]
        t += 110
        if epoch > 30 and epoch % 5 == 0:  # the result of the evaluation 30 epochs back
            events.append(ev("eval_accuracy", t, 0.20 + (epoch - 30) / 1000, epoch_num=epoch - 30))
        if epoch == 110:
            events.append(ev("run_stop", t, status="success"))
    assert published_logs.steps_to_target(events) == pytest.approx(80 * 118287 / 4096)
    no_evals = [e for e in events if e["key"] != "eval_accuracy"]
    assert published_logs.steps_to_target(no_evals) == pytest.approx(110 * 118287 / 4096)


def test_samples_count_blocks_and_a_log_without_a_batch_size():
    events = [
        {"key": "global_batch_size", "value": 8192, "time_ms": 0},
        ev("block_start", 1000, samples_count=0),
        ev("block_stop", 1000 + 10 * 17, samples_count=10 * 8192),  # 10 steps of 17 ms
        ev("block_start", 2000, samples_count=10 * 8192),
        ev("block_stop", 2000 + 5 * 19, samples_count=15 * 8192),
        ev("run_stop", 3000, samples_count=560 * 8192, status="success"),
    ]
    assert published_logs.block_step_times(events) == pytest.approx([0.017, 0.019])
    assert published_logs.steps_to_target(events) == 560
    with pytest.raises(ValueError, match="no global_batch_size"):
        published_logs.block_step_times(events[1:])


def test_report_prints_each_published_files_step_time():
    text = report.report([], [FIXTURE])
    assert "12.13 ms/step over 4 blocks, 1106 steps to target" in text
