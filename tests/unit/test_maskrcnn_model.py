"""The Mask R-CNN train step in the generic loop's machinery: gather/scatter-free with
einsum_gather, and spatial partitioning (height over `model`) equals the unpartitioned
model."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from configs.maskrcnn import get_config
from mlperf.trainer import build_trainer
from parallel.aot import hlo_op_stats

pytestmark = pytest.mark.xdist_group("maskrcnn_model")


def small_config(**overrides):
    """The tiny config shrunk further: compiles in tens of seconds."""
    c = get_config("tiny")
    c.model.update(
        num_classes=3,
        width=8,
        fpn_dim=16,
        fc_dim=32,
        mask_convs=1,
        mask_roi_size=4,
        rpn_batch_per_image=32,
        rpn_pre_nms_train=64,
        rpn_post_nms_train=32,
        rpn_pre_nms_test=64,
        rpn_post_nms_test=32,
        rois_per_image=16,
        det_pre_nms=32,
        max_detections=8,
    )
    c.data.update(image_size=64, max_instances=4, mask_size=8)
    c.train.update(global_batch_size=8, eval_batch_size=8, steps=2)
    c.optimizer.update(warmup_steps=1)
    for key, value in overrides.items():
        node = c
        *parents, leaf = key.split(".")
        for name in parents:
            node = node[name]
        node[leaf] = value
    return c


def synthetic_batch(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random images with two boxed instances each and half-filled masks."""
    rng = np.random.default_rng(seed)
    boxes = np.zeros((n, 4, 4), np.float32)
    xy = rng.uniform(0, 30, (n, 2, 2))
    boxes[:, :2] = np.concatenate([xy, xy + rng.uniform(10, 30, (n, 2, 2))], -1)
    classes = np.zeros((n, 4), np.int32)
    classes[:, :2] = rng.integers(1, 4, (n, 2))
    masks = np.zeros((n, 4, 8, 8), np.uint8)
    masks[:, :2, :, :5] = 1
    return {
        "image": rng.integers(0, 256, (n, 64, 64, 3), np.uint8),  # normalised on the device
        "image_hw": np.full((n, 2), 64, np.int32),
        "gt_boxes": boxes,
        "gt_classes": classes,
        "gt_masks": masks,
    }


def _one_step(config):
    trainer = build_trainer(config, prepare_data=False)
    phase = trainer.phases[0]
    compiled = trainer.lower_train_step(phase).compile()
    layout = trainer.partitioner.data_layout(phase.global_batch_size)
    host = synthetic_batch(phase.global_batch_size)
    rows = host if layout.shard_count == 1 else {k: v[layout.host_slice] for k, v in host.items()}
    batch = trainer.partitioner.host_to_global(rows, layout)
    key = trainer.partitioner.replicate(lambda: jax.random.key(0))
    state, metrics = compiled(trainer.init_state(), batch, key)
    return jax.device_get(metrics), jax.device_get(state["params"])


def test_train_step_has_no_gather_or_scatter():
    trainer = build_trainer(small_config(), prepare_data=False)
    lowered = trainer.lower_train_step(trainer.phases[0])
    # Before backend passes: CPU's compiler rewrites the max-pool gradient's
    # select-and-scatter into a scatter; TPUs run select-and-scatter natively.
    stats = hlo_op_stats(lowered.as_text(dialect="hlo"))
    assert stats["gather_scatter"] == 0


def test_gather_path_has_gathers():
    trainer = build_trainer(small_config(einsum_gather=False), prepare_data=False)
    stats = hlo_op_stats(trainer.lower_train_step(trainer.phases[0]).as_text(dialect="hlo"))
    assert stats["gather_scatter"] > 0


@pytest.mark.slow  # two full train-step compiles (CI: make test-ci-slow)
def test_spatial_partitioning_equals_unpartitioned():
    base = small_config(**{"mesh.ici_shape": (2, 4)})
    spatial = small_config(**{"mesh.ici_shape": (2, 4), "parallel.rules": (("height", "model"),)})
    m0, p0 = _one_step(base)
    m1, p1 = _one_step(spatial)
    assert np.isfinite(m0["loss"]) and m0["loss"] > 0
    for name in ("loss", "rpn_score_loss", "class_loss", "mask_loss", "grad_norm"):
        np.testing.assert_allclose(m1[name], m0[name], rtol=2e-4, atol=1e-5, err_msg=name)
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
