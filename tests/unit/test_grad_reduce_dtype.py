"""Gradient reduction precision (`parallel.grad_reduce_dtype`): the sum over `data` runs in
bfloat16 or float16 (with a loss scale) on the wire, and training follows the float32 run."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch, train_steps

from mlperf.trainer import build_trainer
from parallel.data_parallel import GradReduction

# Two batches in turn: the loss of each falls as it is seen again.
BATCHES = [synthetic_bert_batch(16, seed=s % 2) for s in range(12)]
MESH = {"mesh.ici_shape": (4, 2)}


def _losses(devices, **overrides):
    return np.asarray(train_steps(small_bert_config(**MESH, **overrides), BATCHES, devices).losses)


@pytest.fixture(scope="module")
def fp32_losses(devices):
    return _losses(devices)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_reduction_trains_like_float32(devices, fp32_losses, dtype):
    losses = _losses(devices, **{"parallel.grad_reduce_dtype": dtype})
    assert fp32_losses[-1] < fp32_losses[1], "the reference run must learn (same batch)"
    # Rounding the summed gradients moves the curve a little, never its course.
    np.testing.assert_allclose(losses, fp32_losses, rtol=1e-2)
    assert not np.array_equal(losses, fp32_losses), "the reduction dtype had no effect"


@pytest.mark.parametrize(("dtype", "hlo_type"), [("bfloat16", "bf16"), ("float16", "f16")])
def test_tpu_program_reduce_scatters_gradients_in_the_chosen_dtype(dtype, hlo_type):
    """The program handed to the TPU compiler (v3:2x2, data=4 x model=2): every gradient
    reduce-scatter takes the narrow type. (On CPU devices the same config rounds to the
    narrow type and sums in float32: XLA:CPU cannot compile narrow collectives here.)"""
    from parallel.topology import get_topology

    config = small_bert_config(**MESH, **{"parallel.grad_reduce_dtype": dtype})
    trainer = build_trainer(config, devices=get_topology("v3:2x2").devices, prepare_data=False)
    hlo = trainer.lower_train_step(trainer.phases[0]).as_text(dialect="hlo")
    scatters = [line for line in hlo.splitlines() if " reduce-scatter(" in line]
    assert len(scatters) > 5, "weight-update sharding reduce-scatters the gradients"
    narrow = [line for line in scatters if line.split("=")[1].strip().startswith(f"{hlo_type}[")]
    assert len(narrow) == len(scatters), scatters[:3]


def test_bad_reduction_settings_name_the_key():
    with pytest.raises(ValueError, match="grad_reduce_dtype='int8'.*float32, bfloat16, float16"):
        GradReduction(dtype="int8")
    with pytest.raises(ValueError, match="grad_loss_scale=0"):
        GradReduction(dtype="float16", loss_scale=0)
