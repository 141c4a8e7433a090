"""A checkpoint of flat weight-update views (every leaf of a BERT-large-like model, leaf
shapes scaled down) written at data=8 resumes at data=4 and data=2 with the losses of
the uninterrupted run."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch

from mlperf.checkpoint import CheckpointConfig, Checkpointer
from mlperf.train_state import stored_state_codec
from mlperf.trainer import build_trainer
from parallel.weight_update import count_flat

pytestmark = pytest.mark.xdist_group("weight_update")

# hidden 30, 5 heads of 6, MLP 45: like BERT-large at data=2048, no dimension of any
# kernel or bias is divisible by the data axis of 8 (or 4), so they all take flat views.
ODD = {"model.hidden_size": 30, "model.num_heads": 5, "model.mlp_dim": 45}
BATCHES = [synthetic_bert_batch(16, seed=s) for s in range(4)]


def _trainer(data: int, devices):
    config = small_bert_config(
        **ODD, **{"mesh.ici_shape": (data, 1), "parallel.weight_update_sharding": True}
    )
    return build_trainer(config, devices=devices[:data], prepare_data=False)


def _steps(trainer, state, batches) -> tuple[object, list[float]]:
    phase = trainer.phases[0]
    compiled = trainer.lower_train_step(phase).compile()
    key = trainer.partitioner.replicate(lambda: jax.random.key(0))
    layout = trainer.partitioner.data_layout(phase.global_batch_size)
    losses = []
    for host_batch in batches:
        batch = trainer.partitioner.host_to_global(host_batch, layout)
        state, metrics = compiled(state, batch, key)
        losses.append(float(metrics["loss"]))
    return state, losses


def _checkpointer(directory, trainer) -> Checkpointer:
    ckpt = Checkpointer(CheckpointConfig(directory=str(directory), async_save=False), "loss")
    ckpt.codec = stored_state_codec(trainer.layout, trainer.tx, trainer.partitioner)
    return ckpt


@pytest.fixture(scope="module")
def written(devices, tmp_path_factory):
    """The uninterrupted run at data=8, and a checkpoint it wrote after 2 of 4 steps."""
    directory = tmp_path_factory.mktemp("ckpt")
    trainer = _trainer(8, devices)
    assert count_flat(trainer.layout.update_layouts) >= 20
    state, first = _steps(trainer, trainer.init_state(), BATCHES[:2])
    ckpt = _checkpointer(directory, trainer)
    ckpt.save(2, state, {"rng_key": [0, 0]}, None)
    ckpt.close()
    _, rest = _steps(trainer, state, BATCHES[2:])
    return directory, first + rest


@pytest.mark.parametrize("data", [4, 2])
def test_flat_view_checkpoint_resumes_at_another_data_size(written, devices, data):
    directory, reference = written
    trainer = _trainer(data, devices)
    ckpt = _checkpointer(directory, trainer)
    restored = ckpt.restore_latest(trainer.layout.abstract_train_state)
    ckpt.close()
    assert restored is not None and restored.step == 2
    for got, want in zip(
        jax.tree.leaves(restored.state),
        jax.tree.leaves(trainer.layout.abstract_train_state),
        strict=True,
    ):
        assert got.shape == want.shape and got.sharding == want.sharding
    _, losses = _steps(trainer, restored.state, BATCHES[2:])
    # float32 rounding: the gradient sums run over another number of replicas.
    np.testing.assert_allclose(losses, reference[2:], rtol=2e-5)
