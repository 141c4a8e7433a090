"""`model.last_layer_head_positions_only`: BERT's last encoder layer made only at [CLS] and
the masked-LM positions gives the full layer's head outputs, losses and gradients (layers
unrolled or scanned, with remat, gathers or one-hot einsums), trains alike on a 4 x 2
mesh, and its analytic FLOPs drop by exactly the rows it leaves out."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch, train_steps
from flax import nnx

from mlperf.bert.model import BertConfig, BertForPreTraining

FLAG = "last_layer_head_positions_only"


def _model_outputs(cfg: BertConfig, batch: dict[str, np.ndarray]):
    """(masked-LM cross-entropy, NSP logits, gradients of their sum) of a model built
    from seed 0, so both settings of the flag share the parameters."""
    model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}

    def loss(params):
        xent, _, nsp_logits = nnx.merge(graphdef, params).train_heads(batch)
        total = jnp.sum(xent * batch["masked_lm_weights"]) + jnp.sum(nsp_logits**2)
        return total, (xent, nsp_logits)

    (_, (xent, nsp)), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return np.asarray(xent), np.asarray(nsp), jax.tree.map(np.asarray, grads)


@pytest.mark.parametrize(
    "layout",
    [
        dict(scan_layers=False, einsum_gather=False),
        dict(scan_layers=True, einsum_gather=True),
        dict(scan_layers=True, remat=True, remat_policy="dots"),
    ],
    ids=["unrolled-gather", "scanned-einsum", "scanned-remat"],
)
def test_the_heads_and_gradients_are_the_full_layers(layout):
    cfg = BertConfig(
        vocab_size=96,
        hidden_size=32,
        num_layers=3,
        num_heads=4,
        mlp_dim=64,
        max_position=16,
        dropout_rate=0.0,
        **layout,
    )
    batch = synthetic_bert_batch(8, seq=16, preds=4, seed=3)
    full = _model_outputs(cfg, batch)
    pruned = _model_outputs(dataclasses.replace(cfg, **{FLAG: True}), batch)
    np.testing.assert_allclose(pruned[0], full[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pruned[1], full[1], rtol=1e-5, atol=1e-6)
    leaves_full, tree_full = jax.tree.flatten(full[2])
    leaves_pruned, tree_pruned = jax.tree.flatten(pruned[2])
    assert tree_full == tree_pruned, "the flag must not change the parameter tree"
    for a, b in zip(leaves_pruned, leaves_full, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # The last layer's query projection does get gradient: its rows were used.
    assert any(np.abs(g).max() > 0 for g in leaves_pruned)


BATCHES = [synthetic_bert_batch(16, seed=s % 2) for s in range(6)]


def test_bert_trains_alike_on_a_mesh(devices):
    """The train step inside the 4 x 2 data-parallel shard_map, two layers, with the flag
    follows the full-layer run; the gather of the rows compiles under SPMD."""
    base = {"mesh.ici_shape": (4, 2), "model.num_layers": 2}
    full = train_steps(small_bert_config(**base), BATCHES, devices)
    pruned = train_steps(small_bert_config(**base, **{f"model.{FLAG}": True}), BATCHES, devices)
    assert full.losses[-1] < full.losses[1], "the reference run must learn (same batch)"
    np.testing.assert_allclose(pruned.losses, full.losses, rtol=1e-4)


def test_flops_count_only_the_rows_made():
    """The last layer loses (seq - preds - 1) rows of everything but keys and values."""
    from mlperf.tasks import get_task

    config = small_bert_config(**{"model.num_layers": 2})
    pruned_config = small_bert_config(**{"model.num_layers": 2, f"model.{FLAG}": True})
    task, pruned_task = get_task(config), get_task(pruned_config)
    phase = task.phases()[0]
    d, f, seq, preds = 32, 64, 16, 4
    per_row = 2 * (4 * d * d + 2 * d * f) + 2 * 2 * seq * d - 2 * 2 * d * d
    saved = task.flops_per_example(phase) - pruned_task.flops_per_example(phase)
    assert saved == pytest.approx(3.0 * (seq - preds - 1) * per_row)
