"""The trainer drives the final eval from `Task.final_eval_sets`; the eval batch and the
microbatches travel in the task's plans; validate checks the task's phases; the
detectors' model dataclasses are built from their config blocks."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import small_bert_config, synthetic_bert_batch

from configs import bert, maskrcnn, ssd
from input_pipeline.grain_pipeline import padded_eval_batches
from input_pipeline.pretraining_examples import feature_spec
from mlperf.bert.task import BertTask
from mlperf.maskrcnn.task import MaskRcnnTask
from mlperf.ssd.task import SsdTask
from mlperf.task import EvalPlan
from mlperf.trainer import build_trainer
from mlperf.validate import ConfigError, validate


def _synthetic_set(config, examples: int) -> BertTask:
    """A BERT task whose eval set is `examples` synthetic examples."""

    class SyntheticSet(BertTask):
        def eval_data(self, global_batch_size, shard_index, shard_count):
            batch = synthetic_bert_batch(examples, seed=examples)
            rows = [{k: v[i] for k, v in batch.items()} for i in range(examples)]
            dtypes = {k: dt for k, (_, dt) in feature_spec(16, 4).items()}
            return padded_eval_batches(
                rows, examples, global_batch_size, shard_index, shard_count, dtypes
            )

    return SyntheticSet(config)


class _WithFinalSets(BertTask):
    def final_eval_sets(self):
        return {"small": lambda: _synthetic_set(self.config, 24), "large": self._large}

    def _large(self):
        return _synthetic_set(self.config, 40)


def test_the_trainer_evaluates_every_final_set_of_the_task(devices):
    config = small_bert_config(**{"train.eval_batch_size": 16})
    trainer = build_trainer(config, devices=devices, prepare_data=False)
    params = trainer.init_state()["params"]
    assert trainer.final_eval(params) == {}  # BERT names no final sets

    with_sets = dataclasses.replace(trainer, task=_WithFinalSets(config))
    results = with_sets.final_eval(params)
    assert list(results) == ["small", "large"]
    for name, examples in (("small", 24), ("large", 40)):
        assert results[name]["eval_s"] > 0
        task = _synthetic_set(config, examples)
        direct = trainer.evaluator(trainer.eval_data(task)).evaluate(params)
        assert {k: v for k, v in results[name].items() if k != "eval_s"} == direct
    assert results["small"]["eval_examples"] != results["large"]["eval_examples"]


def test_eval_batch_and_microbatches_come_from_the_task():
    c = bert.get_config("tiny")
    c.train.update(eval_batch_size=48, microbatches=2)
    c.phase2.update(enabled=True, start_samples=64 * 3, steps=4, global_batch_size=32)
    task = BertTask(c)
    assert task.eval_plan() == EvalPlan(global_batch_size=48)
    assert [(p.microbatches, p.source) for p in task.phases()] == [(2, "train"), (2, "phase2")]


def test_validate_checks_the_tasks_phases():
    c = bert.get_config("tiny")
    c.phase2.update(enabled=True, start_samples=64 * 3, steps=4, global_batch_size=35)
    with pytest.raises(ConfigError, match="phase2.global_batch_size=35 is not divisible"):
        validate(c, 8)
    c.phase2.steps = 0
    with pytest.raises(ConfigError, match="phase2.enabled needs phase2.start_samples > 0"):
        validate(c, 8)


def test_detector_model_configs_are_read_from_the_model_block():
    c = maskrcnn.get_config("coco128")
    c.model.update(num_classes=3, backbone_freeze_at=2, backbone_frozen_bn=True)
    m = MaskRcnnTask(c).model_config()
    assert (m.backbone.freeze_at, m.backbone.frozen_bn, m.backbone.width) == (2, True, 16)
    assert (m.anchors.num_scales, m.anchors.anchor_scale, m.anchors.min_level) == (2, 3.0, 2)
    assert (m.rpn_pos_iou, m.rpn_min_best_iou, m.fpn_dim) == (0.5, 0.3, 32)
    assert isinstance(m.anchors.aspect_ratios, tuple)

    c = ssd.get_config("tiny")
    c.model.update(backbone_freeze_at=3, bn_momentum=0.8)
    s = SsdTask(c).model_config()
    assert (s.backbone_freeze_at, s.bn_momentum, s.num_classes) == (3, 0.8, 4)
    assert s.feature_channels == tuple(c.model.feature_channels)
