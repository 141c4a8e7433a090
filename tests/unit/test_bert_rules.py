"""MLPerf BERT rules by round: target defaults and the evaluation schedule in samples."""

from __future__ import annotations

import pytest

from configs.bert import get_config
from configs.transformer import get_config as transformer_config
from mlperf.bert import rules
from mlperf.bert.task import BertTask
from mlperf.loop import eval_schedule
from mlperf.transformer.task import TransformerTask


def test_round_targets():
    assert rules.round_target("0.7") == 0.712
    for later in ("1.0", "1.1", "2.0", "3.1"):
        assert rules.round_target(later) == 0.720
    with pytest.raises(ValueError, match="mlperf.round must be .* got 'v07'"):
        rules.round_target("v07")


def test_eval_schedules():
    # v0.7: "starting at 3M samples, then every 500K samples".
    assert rules.eval_schedule("0.7", 8192) == (3_000_000, 500_000)
    # v1.0+: FLOOR(0.05 * (230.23 * GBS + 3,000,000), 25,000): 244,302.2 -> 225,000.
    assert rules.eval_schedule("1.0", 8192) == (225_000, 225_000)
    # 0.05 * (230.23 * 448 + 3e6) = 155,157.2 -> 150,000; 0.05 * 3,230,230 = 161,511.5 -> 150,000.
    assert rules.eval_schedule("1.1", 448) == (150_000, 150_000)
    assert rules.eval_schedule("2.0", 1000) == (150_000, 150_000)
    # 0.05 * (230.23 * 65536 + 3e6) = 904,417.7 -> 900,000.
    assert rules.eval_schedule("3.0", 65536) == (900_000, 900_000)


def test_the_round_sets_the_default_target_and_an_explicit_one_wins():
    c = get_config("mlperf_v07")
    assert c.train.target == -1.0 and BertTask(c).target_value == 0.712
    c.mlperf.round = "1.0"
    assert BertTask(c).target_value == 0.720
    c.train.target = 0.75
    assert BertTask(c).target_value == 0.75
    assert BertTask(get_config("tiny")).target_value == 0.125
    c.train.target = 0.0  # a target of 0 is reached at the first eval
    assert BertTask(c).target_value == 0.0


def test_reference_variants_evaluate_on_the_rules_schedule():
    c = get_config("mlperf_v07")
    task = BertTask(c)
    assert c.train.eval_every_samples == -1
    assert eval_schedule(c, task.phases(), task) == (3_000_000, 500_000)
    c.mlperf.round = "1.0"
    task = BertTask(c)
    assert eval_schedule(c, task.phases(), task) == (225_000, 225_000)
    for variant in ("base", "large", "mlperf_v07"):
        data = get_config(variant).data
        assert data.format == "mlperf_tfrecord" and (data.seq_length, data.max_predictions) == (
            512,
            76,
        )


def test_the_rules_schedule_needs_a_task_that_defines_it():
    c = get_config("tiny")
    c.train.eval_every_samples = -1
    transformer = TransformerTask(transformer_config("tiny"))
    with pytest.raises(ValueError, match="eval_every_samples=-1 .* not defined for transformer"):
        eval_schedule(c, BertTask(c).phases(), task=transformer)
