"""Padded distributed eval equals single-device, unpadded eval."""

from __future__ import annotations

import jax
import numpy as np
from conftest import small_bert_config, synthetic_bert_batch

from input_pipeline.grain_pipeline import padded_eval_batches
from input_pipeline.pretraining_examples import feature_spec
from mlperf.evaluate import Evaluator
from mlperf.trainer import build_trainer

NUM_EXAMPLES = 40  # not a multiple of the global eval batch (16): 8 padding rows
EVAL_BATCH = 16


def _examples():
    batch = synthetic_bert_batch(NUM_EXAMPLES, seed=7)
    return [{k: v[i] for k, v in batch.items()} for i in range(NUM_EXAMPLES)]


def _evaluate(config, devices):
    trainer = build_trainer(config, devices=devices, prepare_data=False)
    state = trainer.init_state()  # same seed -> same parameters on any mesh
    dtypes = {k: dt for k, (_, dt) in feature_spec(16, 4).items()}
    layout = trainer.partitioner.data_layout(EVAL_BATCH)
    batches = padded_eval_batches(
        _examples(), NUM_EXAMPLES, EVAL_BATCH, layout.shard_index, layout.shard_count, dtypes
    )
    evaluator = Evaluator(trainer.task, trainer.layout, trainer.partitioner, batches, EVAL_BATCH)
    return evaluator.run_pass(state["params"]), evaluator.evaluate(state["params"]), trainer, state


def test_padded_eval_on_8_devices_equals_one_device(devices):
    sums_8, metrics_8, _, _ = _evaluate(small_bert_config(), devices)
    sums_1, metrics_1, trainer, state = _evaluate(
        small_bert_config(**{"mesh.ici_shape": (1, 1)}), devices[:1]
    )
    assert int(sums_8["examples"]) == NUM_EXAMPLES  # padding rows never count
    for name in ("mlm_correct", "mlm_count", "nsp_correct", "examples"):
        assert int(sums_8[name]) == int(sums_1[name]), name
    assert metrics_8["mlm_accuracy"] == metrics_1["mlm_accuracy"]
    np.testing.assert_allclose(metrics_8["mlm_loss"], metrics_1["mlm_loss"], rtol=1e-5)

    # The same metric computed directly on the 40 unpadded examples.
    batch = synthetic_bert_batch(NUM_EXAMPLES, seed=7)
    mlm_logits, _ = jax.jit(lambda p, b: trainer.layout.model(p)(b))(state["params"], batch)
    weights = batch["masked_lm_weights"]
    correct = (np.argmax(np.asarray(mlm_logits), -1) == batch["masked_lm_ids"]) * weights
    assert int(sums_1["mlm_count"]) == int(weights.sum())
    assert metrics_1["mlm_accuracy"] == int(correct.sum()) / int(weights.sum())
