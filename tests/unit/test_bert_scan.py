"""BERT's scanned layer stack (`model.scan_layers`) and per-layer rematerialisation.

The scanned form holds the same layers as the unrolled loop, stacked on a leading
`stack` axis: given the same parameters (stacked) it computes the same outputs,
gradients and training steps, and its program does not grow with depth.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch
from flax import nnx
from jax.sharding import PartitionSpec as P
from scan_helpers import params_of, stack, unstack, with_params

from mlperf.bert.hf_export import to_hf_state_dict
from mlperf.bert.model import BertConfig, BertForPreTraining
from mlperf.trainer import build_trainer
from mlperf.validate import ConfigError, validate

LAYERS = 3
CFG = BertConfig(
    vocab_size=64, hidden_size=32, num_layers=LAYERS, num_heads=4, mlp_dim=64, max_position=16
)


def _batch() -> dict:
    b = synthetic_bert_batch(2, seq=16, preds=4, vocab=64, seed=0)
    return {k: jnp.asarray(b[k]) for k in ("input_ids", "segment_ids", "input_mask")} | {
        "masked_lm_positions": jnp.asarray(b["masked_lm_positions"])
    }


@pytest.fixture(scope="module")
def loop_and_scan():
    loop = BertForPreTraining(CFG, rngs=nnx.Rngs(0))
    scan = BertForPreTraining(dataclasses.replace(CFG, scan_layers=True), rngs=nnx.Rngs(1))
    params = params_of(loop)
    with_params(scan, {**params, "layers": stack(params["layers"])})
    return loop, scan


def test_stacked_parameters_have_a_leading_stack_axis():
    scan = BertForPreTraining(dataclasses.replace(CFG, scan_layers=True), rngs=nnx.Rngs(0))
    kernel = scan.layers.mlp.wi.kernel
    assert kernel.shape == (LAYERS, 32, 64)
    assert kernel.get_metadata()["out_sharding"] == ("stack", "embed", "mlp")
    # Each layer is initialised from its own key: no two layers start equal.
    k = np.asarray(kernel[...])
    assert not np.allclose(k[0], k[1]) and not np.allclose(k[1], k[2])


@pytest.mark.parametrize("train", [False, True], ids=["eval", "dropout"])
def test_scan_equals_the_loop_given_the_same_parameters(loop_and_scan, train):
    loop, scan = loop_and_scan
    rng = jax.random.key(3) if train else None
    for ours, theirs in zip(scan(_batch(), rng), loop(_batch(), rng), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "remat,policy,unroll",
    [
        (False, "nothing", 1),
        (True, "nothing", 1),
        (True, "dots_no_batch", 1),
        (True, "dots", 1),
        (False, "nothing", 0),
    ],
    ids=["plain", "remat", "remat-dots_no_batch", "remat-dots", "whole-stack-unrolled"],
)
def test_scan_gradients_equal_the_loop_gradients(loop_and_scan, remat, policy, unroll):
    """Every remat policy recomputes what it does not keep (dropout masks included, from
    the same keys): the gradients are the unrematerialised loop's. So does the stack
    unrolled whole (`scan_unroll=0`, mlperf_v07's form)."""
    loop, scan = loop_and_scan
    cfg = dataclasses.replace(
        CFG, scan_layers=True, remat=remat, remat_policy=policy, scan_unroll=unroll
    )
    scan = with_params(BertForPreTraining(cfg, rngs=nnx.Rngs(2)), params_of(scan))

    def loss(model):
        mlm, nsp = model(_batch(), jax.random.key(5))
        return jnp.sum(mlm**2) + jnp.sum(nsp**2)

    g_loop = nnx.to_pure_dict(nnx.grad(loss)(loop))
    g_scan = nnx.to_pure_dict(nnx.grad(loss)(scan))
    expected = {**g_loop, "layers": stack(g_loop["layers"])}
    flat_expected = dict(jax.tree_util.tree_leaves_with_path(expected))
    for path, got in jax.tree_util.tree_leaves_with_path(g_scan):
        np.testing.assert_allclose(got, flat_expected[path], rtol=1e-4, atol=1e-6)


def test_hf_export_reads_the_stacked_form(loop_and_scan):
    loop, scan = loop_and_scan
    ours = to_hf_state_dict(jax.device_get(params_of(scan)), LAYERS)
    reference = to_hf_state_dict(jax.device_get(params_of(loop)), LAYERS)
    assert ours.keys() == reference.keys()
    assert "bert.encoder.layer.2.output.dense.weight" in ours
    for name, value in reference.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


def _stablehlo_ops(config) -> int:
    trainer = build_trainer(config, prepare_data=False)
    text = trainer.lower_train_step(trainer.phases[0]).as_text()
    return sum(1 for line in text.splitlines() if " = " in line)


def test_scanned_program_does_not_grow_with_depth():
    """The reason for the scan: the step's program is one layer's, whatever the depth
    (the unrolled loop's grows by a layer's worth of ops per layer)."""
    ops = {
        (scan, n): _stablehlo_ops(
            small_bert_config(**{"model.num_layers": n, "model.scan_layers": scan})
        )
        for scan in (False, True)
        for n in (2, 4)
    }
    # Measured: loop 6,385 -> 10,521 ops for 2 -> 4 layers; scan 4,863 -> 4,874 (the
    # stack size changes a few reshapes of the weight-update views, not the layer).
    per_layer_loop = (ops[(False, 4)] - ops[(False, 2)]) / 2
    assert per_layer_loop > 1000, ops
    assert abs(ops[(True, 4)] - ops[(True, 2)]) < 0.05 * per_layer_loop, ops


def test_scan_unroll_zero_unrolls_the_whole_stack_into_straight_line_code():
    """mlperf_v07's form: stacked parameters, no loop in the step (so no stacked buffers
    of each layer's residuals); one layer per iteration keeps a loop."""
    texts = {}
    for unroll in (1, 0):
        config = small_bert_config(
            **{"model.num_layers": 4, "model.scan_layers": True, "model.scan_unroll": unroll}
        )
        trainer = build_trainer(config, prepare_data=False)
        texts[unroll] = trainer.lower_train_step(trainer.phases[0]).as_text()
    assert "stablehlo.while" in texts[1]
    assert "stablehlo.while" not in texts[0]


def test_a_negative_scan_unroll_is_refused_before_anything_is_built():
    with pytest.raises(ConfigError, match=r"model.scan_unroll=-1: .*0 unrolls the whole stack"):
        validate(small_bert_config(**{"model.scan_unroll": -1}), 8)


def test_weight_update_sharding_never_shards_the_stack_axis():
    """WUS / FSDP put `data` on a parameter dimension; never on the stack, which the scan
    slices one layer at a time (24 layers would otherwise divide by data=8)."""
    config = small_bert_config(
        **{"model.num_layers": 4, "model.scan_layers": True, "mesh.ici_shape": (4, 2)}
    )
    config.parallel.update(weight_update_sharding=True, fsdp=True)
    trainer = build_trainer(config, prepare_data=False)
    specs = jax.tree.map(lambda s: s.spec, trainer.layout.state_shardings["params"]["layers"])
    kernel = specs["mlp"]["wi"]["kernel"]  # [4 (stack), 32 (embed), 64 (mlp)]
    assert kernel == P(None, "data", "model"), kernel
    for spec in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)):
        assert len(spec) == 0 or spec[0] is None, spec


def test_a_scanned_trainer_trains_like_the_loop_trainer():
    """Same initial parameters (stacked), dropout on, WUS on the 2x4 mesh: the same
    losses and parameters after three steps."""
    overrides = {"model.num_layers": 2, "model.dropout_rate": 0.1}
    runs = {}
    start = None
    for scan in (True, False):
        config = small_bert_config(**overrides, **{"model.scan_layers": scan})
        config.parallel.weight_update_sharding = True
        trainer = build_trainer(config, prepare_data=False)
        phase = trainer.phases[0]
        step = trainer.lower_train_step(phase).compile()
        state = trainer.init_state()
        if scan:
            start = jax.device_get(state["params"])
        else:
            loop_params = {**start, "layers": unstack(start["layers"], 2)}
            state["params"] = jax.device_put(loop_params, trainer.layout.state_shardings["params"])
        key = trainer.partitioner.replicate(lambda: jax.random.key(0))
        layout = trainer.partitioner.data_layout(phase.global_batch_size)
        losses = []
        for seed in range(3):
            batch = synthetic_bert_batch(16, seq=16, preds=4, vocab=96, seed=seed)
            state, metrics = step(state, trainer.partitioner.host_to_global(batch, layout), key)
            losses.append(float(metrics["loss"]))
        runs[scan] = losses, jax.device_get(state["params"])
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-5)
    assert runs[True][0][0] != runs[True][0][2]  # it trained
    scanned, looped = runs[True][1], runs[False][1]
    np.testing.assert_allclose(
        scanned["layers"]["mlp"]["wo"]["kernel"][1],
        looped["layers"][1]["mlp"]["wo"]["kernel"],
        rtol=1e-4,
        atol=1e-6,
    )
