"""Sequence parallelism (Megatron): `residual_length` -> `model` splits the rows of BERT's
residual stream (layer norms, dropout, residual adds) over the model axis. The same
training run, with different collectives."""

from __future__ import annotations

import numpy as np
from conftest import small_bert_config, synthetic_bert_batch, train_steps

from parallel.aot import hlo_op_stats
from parallel.rules import logical_to_spec, rules_from_config

SEQUENCE_PARALLEL = (("residual_length", "model"),)
BATCHES = [synthetic_bert_batch(16, seed=s % 2) for s in range(5)]


def test_the_rule_splits_only_the_residual_rows():
    rules = rules_from_config(SEQUENCE_PARALLEL)
    assert tuple(logical_to_spec(("batch", "residual_length", "embed"), rules)) == (
        "data",
        "model",
        None,
    )
    # Attention's projections keep whole rows and split heads.
    assert tuple(logical_to_spec(("batch", "length", "heads", "kv"), rules)) == (
        "data",
        None,
        "model",
        None,
    )
    # The default leaves the residual stream whole.
    assert tuple(logical_to_spec(("batch", "residual_length", "embed"))) == ("data", None, None)


def test_bert_trains_alike_with_sequence_parallel_rows(devices):
    """2 layers with dropout on a data=2 x model=4 mesh: the losses follow the tensor-
    parallel run (dropout's bits do not depend on the sharding), and the compiled step
    gathers the split rows back before each sublayer."""
    base = {"model.num_layers": 2, "model.dropout_rate": 0.1}
    tensor = train_steps(small_bert_config(**base), BATCHES, devices)
    sequence = train_steps(
        small_bert_config(**base, **{"parallel.rules": SEQUENCE_PARALLEL}), BATCHES, devices
    )
    assert tensor.losses[-1] < tensor.losses[0], "the reference run must learn"
    np.testing.assert_allclose(sequence.losses, tensor.losses, rtol=2e-4)
    ops_tensor = hlo_op_stats(tensor.compiled.as_text())["collectives"]
    ops_sequence = hlo_op_stats(sequence.compiled.as_text())["collectives"]
    # Split rows are gathered before each sublayer (measured: 59 all-gathers against 49).
    assert ops_sequence["all-gather"] > ops_tensor["all-gather"], (ops_sequence, ops_tensor)


def _sharding_constraints(config, devices) -> int:
    from mlperf.trainer import build_trainer

    trainer = build_trainer(config, devices=devices, prepare_data=False)
    return trainer.lower_train_step(trainer.phases[0]).as_text().count("sdy.sharding_constraint")


def test_the_default_program_leaves_the_residual_sums_unplaced(devices):
    """The sums inside a layer are constrained only when their rows are split: pinned
    replicated, they cost BERT-large 3% of its TPU step estimate (docs/design.md)."""
    layers = {"model.num_layers": 2}
    default = _sharding_constraints(small_bert_config(**layers), devices)
    split = _sharding_constraints(
        small_bert_config(**layers, **{"parallel.rules": SEQUENCE_PARALLEL}), devices
    )
    # Two sums per layer, each constrained in the forward pass and its transpose.
    assert split - default == 2 * 2 * 2, (split, default)
