"""The Transformer's scanned layer stacks (`model.scan_layers`).

Each stack's layers stacked on a leading `stack` axis: given the same parameters
(stacked) the model computes the same logits, gradients, decoding steps and training
steps as the unrolled loop, exports the same PyTorch state_dict, and its train state has
as many leaves at any depth as a one-layer model's (what a step's dispatch handles).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import train_steps
from flax import nnx
from scan_helpers import params_of, stack, with_params

from configs.transformer import get_config
from mlperf.trainer import build_trainer
from mlperf.transformer.model import Transformer, TransformerConfig
from mlperf.transformer.torch_export import to_torch_state_dict

pytestmark = pytest.mark.xdist_group("transformer")

LAYERS = 3
CFG = TransformerConfig(vocab_size=64, emb_dim=32, num_heads=4, num_layers=LAYERS, mlp_dim=64)


def _stacked(params: dict) -> dict:
    return {**params, "encoder": stack(params["encoder"]), "decoder": stack(params["decoder"])}


def _batch(rows: int = 2, length: int = 8) -> dict:
    rng = np.random.default_rng(0)
    segments = np.ones((rows, length), np.int32)
    segments[1, 5:] = 0  # a padded tail
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length))
    tokens = rng.integers(3, 64, (rows, length)).astype(np.int32) * (segments > 0)
    return {
        "inputs": jnp.asarray(tokens),
        "inputs_segmentation": jnp.asarray(segments),
        "inputs_position": jnp.asarray(positions),
        "targets": jnp.asarray(tokens[:, ::-1].copy() * (segments > 0)),
        "targets_segmentation": jnp.asarray(segments),
        "targets_position": jnp.asarray(positions),
    }


@pytest.fixture(scope="module")
def loop_and_scan():
    loop = Transformer(CFG, rngs=nnx.Rngs(0))
    scan = Transformer(dataclasses.replace(CFG, scan_layers=True), rngs=nnx.Rngs(1))
    with_params(scan, _stacked(params_of(loop)))
    return loop, scan


def test_stacked_parameters_have_a_leading_stack_axis():
    scan = Transformer(dataclasses.replace(CFG, scan_layers=True), rngs=nnx.Rngs(0))
    kernel = scan.decoder.mlp.wi.kernel
    assert kernel.shape == (LAYERS, 32, 64)
    assert kernel.get_metadata()["out_sharding"][0] == "stack"
    k = np.asarray(kernel[...])  # each layer from its own key
    assert not np.allclose(k[0], k[1]) and not np.allclose(k[1], k[2])


@pytest.mark.parametrize(
    "train,unroll", [(False, 1), (True, 1), (True, 0)], ids=["eval", "dropout", "unrolled"]
)
def test_scan_equals_the_loop_given_the_same_parameters(loop_and_scan, train, unroll):
    """Also unrolled whole (`scan_unroll=0`, mlperf_v07's form): no loop in the program."""
    loop, scan = loop_and_scan
    if unroll != 1:
        cfg = dataclasses.replace(CFG, scan_layers=True, scan_unroll=unroll)
        scan = with_params(Transformer(cfg, rngs=nnx.Rngs(2)), params_of(scan))
    rng = jax.random.key(3) if train else None
    np.testing.assert_allclose(scan(_batch(), rng), loop(_batch(), rng), rtol=1e-5, atol=1e-5)

    def loops(model) -> int:  # the CPU attention core's own block loops count in both
        return jax.jit(lambda b: model(b, rng)).lower(_batch()).as_text().count("stablehlo.while")

    assert (loops(scan) == loops(loop)) == (unroll == 0)


def test_scan_gradients_equal_the_loop_gradients(loop_and_scan):
    loop, scan = loop_and_scan

    def loss(model):
        return jnp.sum(model(_batch(), jax.random.key(5)) ** 2)

    g_loop = nnx.to_pure_dict(nnx.grad(loss)(loop))
    expected = dict(jax.tree_util.tree_leaves_with_path(_stacked(g_loop)))
    got = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(nnx.grad(loss)(scan)))
    assert len(got) == len(expected)
    for path, value in got:
        np.testing.assert_allclose(value, expected[path], rtol=1e-4, atol=1e-5)


def test_decoding_steps_equal_the_loops(loop_and_scan):
    """Beam search's step function: a scanned decoder runs its layers one by one from
    the stacked parameters, with one cache per layer as the loop's."""
    loop, scan = loop_and_scan
    b = _batch()
    outs = []
    for model in (loop, scan):
        encoded = model.encode(b["inputs"], b["inputs_segmentation"], b["inputs_position"])
        cross = model.cross_cache(encoded)
        own = model.self_cache(2, 4)
        tokens = jnp.zeros((2,), jnp.int32)
        steps = []
        for index in range(3):
            logits, own = model.decode_step(tokens, own, cross, index, b["inputs_segmentation"])
            tokens = jnp.argmax(logits, -1).astype(jnp.int32)
            steps.append(logits)
        assert len(own) == LAYERS
        outs.append(np.stack(steps))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_torch_export_reads_the_stacked_form(loop_and_scan):
    loop, scan = loop_and_scan
    ours = to_torch_state_dict(jax.device_get(params_of(scan)), LAYERS)
    reference = to_torch_state_dict(jax.device_get(params_of(loop)), LAYERS)
    assert ours.keys() == reference.keys()
    assert "core.decoder.layers.2.multihead_attn.in_proj_weight" in ours
    for name, value in reference.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


def _config(**model):
    c = get_config("tiny")
    c.model.update(emb_dim=32, num_heads=4, mlp_dim=64, dropout_rate=0.1, **model)
    c.data.update(vocab_size=100, max_length=8)
    c.optimizer.update(learning_rate=1e-2, warmup_steps=2)
    c.train.update(global_batch_size=8, steps=10, eval_batch_size=8)
    return c


def _leaves(config) -> int:
    trainer = build_trainer(config, prepare_data=False)
    return len(jax.tree.leaves(trainer.layout.abstract_train_state))


def test_the_train_states_leaves_do_not_grow_with_depth():
    """The reason for the scan on a pod host: a step's dispatch handles every leaf of the
    train state on every local device, and the scanned state has a one-layer model's
    leaf count at any depth."""
    one = _leaves(_config(num_layers=1))
    loop6 = _leaves(_config(num_layers=6))
    scan6 = _leaves(_config(num_layers=6, scan_layers=True))
    assert scan6 == one and loop6 > 4 * scan6, (one, loop6, scan6)


@pytest.mark.slow
def test_a_scanned_trainer_trains_like_the_loop_trainer(devices):
    """Same initial parameters (stacked), dropout on, the 2x4 mesh: the same losses and
    parameters after three steps."""
    rng = np.random.default_rng(0)
    segments = np.ones((8, 8), np.int32)
    positions = np.broadcast_to(np.arange(8, dtype=np.int32), (8, 8)).copy()
    batches = []
    for _ in range(3):
        tokens = rng.integers(3, 100, (8, 8)).astype(np.int32)
        batches.append(
            {
                "inputs": tokens,
                "inputs_segmentation": segments,
                "inputs_position": positions,
                "targets": tokens[:, ::-1].copy(),
                "targets_segmentation": segments,
                "targets_position": positions,
            }
        )
    loop = train_steps(_config(num_layers=2), batches, devices)
    start = jax.device_get(build_trainer(_config(num_layers=2), prepare_data=False).init_state())
    scan_cfg = _config(num_layers=2, scan_layers=True)
    trainer = build_trainer(scan_cfg, prepare_data=False)
    state = trainer.init_state()
    params = _stacked(start["params"])
    state["params"] = jax.device_put(params, trainer.layout.state_shardings["params"])
    compiled = trainer.lower_train_step(trainer.phases[0]).compile()
    key = trainer.partitioner.replicate(lambda: jax.random.key(0))
    layout = trainer.partitioner.data_layout(8)
    losses = []
    for host_batch in batches:
        state, metrics = compiled(
            state, trainer.partitioner.host_to_global(host_batch, layout), key
        )
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses, loop.losses, rtol=1e-5)
    assert losses[0] != losses[2]  # it trained
    expected = _stacked(jax.device_get(loop.state["params"]))
    got = jax.device_get(state["params"])
    for (path, value), (_, ref) in zip(
        jax.tree_util.tree_leaves_with_path(got),
        jax.tree_util.tree_leaves_with_path(expected),
        strict=True,
    ):
        np.testing.assert_allclose(value, ref, rtol=1e-4, atol=1e-5, err_msg=str(path))
