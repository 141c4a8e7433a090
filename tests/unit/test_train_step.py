"""The sharded train step: equivalence to one device, gradient accumulation, weight-update
sharding, FSDP, and the einsum (no gather/scatter) path."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch, train_steps

from mlperf.inspection import inspect_config
from mlperf.trainer import build_trainer
from parallel.aot import hlo_op_stats


def run_steps(config, devices, batches):
    """Trains on `batches` and returns (losses, final params as numpy)."""
    run = train_steps(config, batches, devices)
    return run.losses, run.params()


BATCHES = [synthetic_bert_batch(16, seed=s) for s in (0, 1, 0, 1)]


@pytest.fixture(scope="module")
def single_device_run(devices):
    config = small_bert_config(**{"mesh.ici_shape": (1, 1)})
    return run_steps(config, devices[:1], BATCHES)


def _assert_params_close(a, b, rtol, atol):
    for (path, x), y in zip(
        jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True
    ):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))


def test_2x4_mesh_matches_one_device(devices, single_device_run):
    losses_1, params_1 = single_device_run
    losses_8, params_8 = run_steps(small_bert_config(), devices, BATCHES)
    assert losses_1[2] < losses_1[0], "training on a batch again should lower its loss"
    np.testing.assert_allclose(losses_8, losses_1, rtol=2e-5)
    _assert_params_close(params_8, params_1, rtol=1e-4, atol=1e-5)


def test_gradient_accumulation_equals_one_big_batch(devices, single_device_run):
    losses_1, params_1 = single_device_run
    config = small_bert_config(**{"train.microbatches": 4})
    losses_k, params_k = run_steps(config, devices, BATCHES)
    np.testing.assert_allclose(losses_k, losses_1, rtol=2e-5)
    _assert_params_close(params_k, params_1, rtol=1e-4, atol=1e-5)


def test_fsdp_shards_params_and_matches(devices, single_device_run):
    losses_1, _ = single_device_run
    config = small_bert_config(**{"parallel.fsdp": True})
    losses_f, _ = run_steps(config, devices, BATCHES)
    np.testing.assert_allclose(losses_f, losses_1, rtol=2e-5)
    report = inspect_config(
        small_bert_config(**{"parallel.fsdp": True, "mesh.ici_shape": (8, 1)}), devices
    )
    assert report["bytes_per_device"]["params"] < report["bytes_total"]["params"] / 4


@pytest.fixture(scope="module")
def wus_report(devices):
    return inspect_config(small_bert_config(**{"mesh.ici_shape": (8, 1)}), devices)


def test_wus_optimizer_state_is_split_over_the_data_axis(wus_report):
    per_device = wus_report["bytes_per_device"]["opt_state"]
    total = wus_report["bytes_total"]["opt_state"]
    # Only LAMB's step counters (a few replicated scalars) are not divided by 8.
    assert total / 8 <= per_device <= total / 8 + 64
    # Parameters themselves stay replicated over data (ZeRO-1, not FSDP).
    assert wus_report["bytes_per_device"]["params"] == wus_report["bytes_total"]["params"]


def test_wus_step_reduce_scatters_gradients_and_all_gathers_params(wus_report):
    assert wus_report["collectives"]["reduce-scatter"] > 0
    assert wus_report["collectives"]["all-gather"] > 0


def test_without_wus_gradients_are_all_reduced(devices):
    config = small_bert_config(
        **{"mesh.ici_shape": (8, 1), "parallel.weight_update_sharding": False}
    )
    report = inspect_config(config, devices)
    assert report["collectives"]["reduce-scatter"] == 0
    assert report["bytes_per_device"]["opt_state"] == report["bytes_total"]["opt_state"]


def test_one_replica_step_sums_no_gradients(devices, single_device_run):
    """With one data replica the gradient sum is the gradient: the step has no collective
    (XLA:CPU would run a one-device all-reduce as a copy of every gradient), and it
    trains; `test_2x4_mesh_matches_one_device` checks its values against a 2x4 mesh."""
    config = small_bert_config(**{"mesh.ici_shape": (1, 1)})
    report = inspect_config(config, devices[:1])
    assert sum(report["collectives"].values()) == 0, report["collectives"]
    losses, _ = single_device_run
    assert losses[-1] < losses[0]


def _forward(config, devices, batch):
    trainer = build_trainer(config, devices=devices, prepare_data=False)
    state = trainer.init_state()
    fn = trainer.partitioner.jit(lambda p, b: trainer.layout.model(p)(b))
    layout = trainer.partitioner.data_layout(batch["input_ids"].shape[0])
    global_batch = trainer.partitioner.host_to_global(batch, layout)
    hlo = fn.lower(state["params"], global_batch).compile().as_text()
    return jax.device_get(fn(state["params"], global_batch)), hlo


def test_einsum_path_has_no_gather_or_scatter_and_matches_gather_path(devices):
    batch = synthetic_bert_batch(16)
    (mlm_e, nsp_e), _ = _forward(small_bert_config(einsum_gather=True), devices, batch)
    (mlm_g, nsp_g), hlo_g = _forward(small_bert_config(einsum_gather=False), devices, batch)
    np.testing.assert_allclose(mlm_e, mlm_g, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nsp_e, nsp_g, rtol=1e-5, atol=1e-5)
    assert hlo_op_stats(hlo_g)["gather_scatter"] > 0  # the check can see gathers at all
    report = inspect_config(small_bert_config(einsum_gather=True), devices)
    assert report["gather_scatter"] == 0  # the whole train step, forward and backward


def test_bf16_policy_runs_matmuls_in_bf16_with_fp32_state(devices):
    config = small_bert_config(**{"precision.compute_dtype": "bfloat16"})
    trainer = build_trainer(config, devices=devices, prepare_data=False)
    # The program as written (the CPU compiler later widens bf16 dots it cannot run
    # natively; TPU keeps them): the model's matmuls take bf16 operands.
    text = trainer.lower_train_step(trainer.phases[0]).as_text()
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    bf16_dots = [line for line in dots if "xbf16>" in line.split(":")[-1].split("->")[0]]
    assert len(dots) > 10 and len(bf16_dots) >= 0.8 * len(dots), (len(bf16_dots), len(dots))
    state = trainer.layout.abstract_train_state
    assert {x.dtype for x in jax.tree.leaves(state["params"])} == {np.dtype("float32")}
    opt_dtypes = {x.dtype for x in jax.tree.leaves(state["opt_state"])}
    assert opt_dtypes <= {np.dtype("float32"), np.dtype("int32")}


ALLREDUCE_BATCHES = [synthetic_bert_batch(16, seed=s) for s in range(20)]
ALLREDUCE_BASE = {"mesh.ici_shape": (4, 2), "parallel.grad_bucket_bytes": 16 << 10}


@pytest.fixture(scope="module")
def xla_allreduce_losses(devices):
    """The 20-step losses with XLA's own gradient all-reduce: every algorithm's reference,
    trained once for the module."""
    return run_steps(small_bert_config(**ALLREDUCE_BASE), devices, ALLREDUCE_BATCHES)[0]


@pytest.mark.parametrize("algorithm", ["linear_pipeline", "ring", "tree", "bidirectional_exchange"])
def test_custom_gradient_all_reduce_trains_like_xla(devices, algorithm, xla_allreduce_losses):
    config = small_bert_config(**ALLREDUCE_BASE, **{"parallel.grad_allreduce": algorithm})
    got, _ = run_steps(config, devices, ALLREDUCE_BATCHES)
    np.testing.assert_allclose(got, xla_allreduce_losses, rtol=1e-4)


def test_linear_pipeline_reduces_gradients_with_permutes_not_all_reduce(devices):
    config = small_bert_config(
        **{
            "mesh.ici_shape": (8, 1),
            "parallel.grad_allreduce": "linear_pipeline",
            "parallel.weight_update_sharding": False,
        }
    )
    trainer = build_trainer(config, devices=devices, prepare_data=False)
    stats = hlo_op_stats(trainer.lower_train_step(trainer.phases[0]).compile().as_text())
    assert stats["collectives"]["collective-permute"] > 0
    # Only the loss and metric scalars are still summed by all-reduce, never a gradient.
    assert stats["collective_bytes"]["all-reduce"] <= 4 * 16 * stats["collectives"]["all-reduce"]
