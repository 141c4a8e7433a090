"""Two-phase pretraining as config: phases, joined learning-rate schedule."""

from __future__ import annotations

import numpy as np
import pytest

from configs.bert import get_config
from mlperf.bert.task import BertTask
from mlperf.optimizer import PhaseSchedule, joined_schedule, phase_schedule
from mlperf.validate import ConfigError, validate


def test_phase_two_switches_at_a_sample_count():
    c = get_config("tiny")
    c.phase2.update(
        enabled=True,
        start_samples=64 * 30,
        seq_length=128,
        max_predictions=20,
        global_batch_size=32,
        learning_rate=1e-3,
        warmup_steps=5,
        steps=40,
    )
    phase1, phase2 = BertTask(c).phases()
    assert phase1.steps == 30 and phase1.data["seq_length"] == c.data.seq_length == 32
    assert phase2.global_batch_size == 32 and phase2.data == {
        "seq_length": 128,
        "max_predictions": 20,
    }


def test_joined_schedule_warms_up_and_decays_per_phase():
    sched = joined_schedule([PhaseSchedule(1e-2, 10, 100, 100), PhaseSchedule(1e-3, 5, 50, 50)])
    assert float(sched(0)) == 0.0
    np.testing.assert_allclose(float(sched(10)), 1e-2, rtol=1e-6)
    np.testing.assert_allclose(float(sched(55)), 1e-2 * (1 - 45 / 90), rtol=1e-5)
    assert float(sched(100)) == 0.0  # phase 2 restarts its warmup from zero
    np.testing.assert_allclose(float(sched(105)), 1e-3, rtol=1e-6)
    assert float(sched(150)) == 0.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"train.global_batch_size": 63},
            "train.global_batch_size=63 is not divisible by data-axis "
            "size 2 x train.microbatches 1",
        ),
        (
            {"train.microbatches": 3},
            "train.global_batch_size=64 is not divisible by data-axis size "
            "2 x train.microbatches 3 = 6",
        ),
        ({"mesh.ici_shape": (3, 4)}, "needs 12 devices but 8 are available"),
        ({"train.eval_batch_size": 255}, "train.eval_batch_size=255 is not divisible"),
        ({"model.eval_head_chunks": 3}, "model.eval_head_chunks=3 must be >= 1 and divide"),
        ({"model.train_head_vocab_slice": -1}, "model.train_head_vocab_slice=-1: give a whole"),
        ({"model.train_head_dtype": "float16"}, "model.train_head_dtype='float16': use float32"),
        ({"model.train_head_dtype": "bfloat16"}, "applies only to the sliced head"),
        ({"data.read_threads": -1}, "data.read_threads=-1: give a whole number"),
        (
            {"model.attention_cpu_block_bytes": -1},
            "model.attention_cpu_block_bytes=-1: give a whole number of bytes",
        ),
    ],
)
def test_bad_configs_fail_with_the_value_and_the_fix(overrides, message):
    c = get_config("tiny")
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(c, 8)


def test_step_drops_after_warmup():
    # Mask R-CNN's v0.7 schedule: warmup to 0.26, x0.1 at steps 6000 and 8000.
    sched = phase_schedule(PhaseSchedule(0.26, 1905, 9000, 9000, drop_steps=(6000, 8000)))
    values = [float(sched(s)) for s in (0, 1905, 5999, 6000, 7999, 8000, 8999)]
    np.testing.assert_allclose(values, [0, 0.26, 0.26, 0.026, 0.026, 0.0026, 0.0026], rtol=1e-5)
    with pytest.raises(ValueError, match="after the 100 warmup steps"):
        phase_schedule(PhaseSchedule(0.1, 100, 0, 500, drop_steps=(50,)))
