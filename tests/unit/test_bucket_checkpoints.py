"""The checkpointer on objects (a real GCS-protocol server on 127.0.0.1): committed steps
by orbax's marker, the manifest, retention, resume onto another data size, and an object
missing from the newest checkpoint set aside as `<step>.corrupted` with a fallback to the
one before."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from conftest import small_bert_config

from input_pipeline import storage
from mlperf.checkpoint import MANIFEST, CheckpointConfig, Checkpointer, committed_steps
from mlperf.train_state import stored_state_codec
from mlperf.trainer import build_trainer

pytestmark = pytest.mark.xdist_group("bucket")

ODD = {"model.hidden_size": 30, "model.num_heads": 5, "model.mlp_dim": 45}


def _trainer(data: int, devices):
    config = small_bert_config(
        **ODD, **{"mesh.ici_shape": (data, 1), "parallel.weight_update_sharding": True}
    )
    return build_trainer(config, devices=devices[:data], prepare_data=False)


def _checkpointer(directory: str, trainer, keep: int = 2) -> Checkpointer:
    cfg = CheckpointConfig(directory=directory, keep=keep, keep_best=0)
    ckpt = Checkpointer(cfg, "loss")
    ckpt.codec = stored_state_codec(trainer.layout, trainer.tx, trainer.partitioner)
    return ckpt


def _leaves(state) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]


def test_checkpoints_in_a_bucket_commit_retain_reshard_and_fall_back(gcs, devices, capsys):
    directory = "gs://multipod-test/run/checkpoints"
    trainer = _trainer(8, devices)
    state = trainer.init_state()
    ckpt = _checkpointer(directory, trainer)
    for step in (1, 2, 3):
        ckpt.save(step, state, {"rng_key": [0, step]}, None)
        ckpt.wait()
    ckpt.close()
    # keep=2: the oldest is gone; the others are committed and listed in their manifest.
    assert committed_steps(directory) == [2, 3]
    listed = json.loads(storage.read_text(f"{directory}/3/{MANIFEST}"))["files"]
    assert "commit_success.txt" in listed and any(k.startswith("state/") for k in listed)

    # Another data size restores the same parameters into its own shardings (the
    # optimizer's flat views take that data size's padded shapes).
    other = _trainer(4, devices)
    restored = _checkpointer(directory, other).restore_latest(other.layout.abstract_train_state)
    assert restored.step == 3 and restored.path == f"{directory}/3"
    for got, want in zip(_leaves(restored.state["params"]), _leaves(state["params"]), strict=True):
        np.testing.assert_array_equal(got, want)

    # An object of the newest checkpoint lost: set aside, the one before restored.
    lost = max((k for k in listed if k.startswith("state/")), key=lambda k: listed[k])
    storage.remove(f"{directory}/3/{lost}")
    ckpt = _checkpointer(directory, trainer)
    restored = ckpt.restore_latest(trainer.layout.abstract_train_state)
    ckpt.close()
    out = capsys.readouterr().out
    assert restored.step == 2
    assert f"checkpoint {directory}/3 is incomplete or corrupted" in out
    assert f"file {lost} is missing" in out
    assert committed_steps(directory) == [2]
    assert storage.exists(f"{directory}/3.corrupted/{MANIFEST}")  # kept for inspection
