"""`parallel.grad_path`: the explicit shard_map reduction and the annotation-only one
(XLA's partitioner places the reduction) train the same model the same way."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch, train_steps

from mlperf.validate import ConfigError, check_names

# Two batches in turn: the loss of each falls as it is seen again (dropout is off).
BATCHES = [synthetic_bert_batch(16, seed=s % 2) for s in range(8)]


def _run(devices, path: str, **overrides):
    config = small_bert_config(
        **{"mesh.ici_shape": (4, 2), "parallel.grad_path": path, **overrides}
    )
    return train_steps(config, BATCHES, devices)


def test_annotation_path_trains_like_shard_map(devices):
    """Same losses and parameters with gradient accumulation (the global microbatch split
    takes each replica's own rows, as the shard_map path does; one microbatch is the
    same program without the loop, compiled by the test below)."""
    manual = _run(devices, "shard_map", **{"train.microbatches": 2})
    annotated = _run(devices, "annotations", **{"train.microbatches": 2})
    assert manual.losses[-1] < manual.losses[1], "the reference run must learn"
    # Sums are taken in another order: equal to float32 rounding, not bitwise.
    np.testing.assert_allclose(annotated.losses, manual.losses, rtol=2e-5)
    for a, b in zip(
        jax.tree.leaves(annotated.state["params"]),
        jax.tree.leaves(manual.state["params"]),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_annotation_path_leaves_the_reduction_to_xla(devices):
    """The annotation-only program has no shard_map region (no manual computation) and,
    on XLA:CPU, no reduce-scatter: the partitioner all-reduces the gradients and slices
    the weight-update shards, where the explicit path reduce-scatters them."""
    from mlperf.trainer import build_trainer

    def step(path):
        config = small_bert_config(**{"mesh.ici_shape": (4, 2), "parallel.grad_path": path})
        trainer = build_trainer(config, devices=devices, prepare_data=False)
        lowered = trainer.lower_train_step(trainer.phases[0])
        return lowered.as_text(), lowered.compile().as_text()

    manual_lowered, manual_compiled = step("shard_map")
    auto_lowered, auto_compiled = step("annotations")
    assert "manual_computation" in manual_lowered
    assert "manual_computation" not in auto_lowered
    assert manual_compiled.count(" reduce-scatter(") > 5
    assert auto_compiled.count(" reduce-scatter(") == 0
    assert auto_compiled.count(" all-reduce(") > 5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"parallel.grad_path": "auto"}, "grad_path='auto' is unknown; use one of shard_map"),
        (
            {"parallel.grad_path": "annotations", "parallel.grad_reduce_dtype": "bfloat16"},
            "grad_reduce_dtype='bfloat16' need parallel.grad_path=shard_map",
        ),
        (
            {"parallel.grad_path": "annotations", "parallel.grad_allreduce": "ring"},
            "grad_allreduce='ring'",
        ),
    ],
)
def test_bad_grad_path_is_a_config_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_names(small_bert_config(**overrides))
