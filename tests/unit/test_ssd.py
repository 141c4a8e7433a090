"""SSD pieces: default boxes, box encoding round trip, matching, hard negative mining, loss."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlperf.ssd.boxes import (
    AnchorConfig,
    BoxEncoder,
    cxcywh_to_xyxy,
    decode_offsets,
    default_boxes,
)
from mlperf.ssd.loss import hard_negative_mask, ssd_loss_per_image
from mlperf.ssd.model import extra_layer_strides


def test_ssd300_has_8732_default_boxes_with_reference_coordinates():
    cfg = AnchorConfig()
    boxes = default_boxes(cfg)
    assert boxes.shape == (8732, 4) == (cfg.num_boxes, 4)
    assert cfg.boxes_per_cell() == (4, 6, 6, 6, 4, 4)
    # First cell of the 38x38 level: centre 0.5 / (300 / 8), sizes 21/300, sqrt(21*45)/300,
    # then the aspect-2 pair.
    c = 0.5 / 37.5
    s1, s2 = 21 / 300, math.sqrt(21 * 45) / 300
    r = math.sqrt(2)
    np.testing.assert_allclose(
        boxes[:4],
        [[c, c, s1, s1], [c, c, s2, s2], [c, c, s1 * r, s1 / r], [c, c, s1 / r, s1 * r]],
        rtol=1e-6,
    )
    # The single 1x1 cell of the last level: centred, sizes clipped to 1.
    np.testing.assert_allclose(boxes[-4:, :2], 0.5)
    np.testing.assert_allclose(boxes[-4, 2:], [261 / 300] * 2, rtol=1e-6)
    assert boxes[-2:, 2:].max() == 1.0
    assert boxes.min() >= 0 and boxes.max() <= 1
    # Level sizes: 38^2*4 + 19^2*6 + 10^2*6 + 5^2*6 + 3^2*4 + 1*4.
    assert [38 * 38 * 4, 19 * 19 * 6, 100 * 6, 25 * 6, 9 * 4, 4] == [
        f * f * n for f, n in zip(cfg.feature_sizes, cfg.boxes_per_cell(), strict=True)
    ]


def test_extra_layers_follow_the_reference_sizes():
    assert extra_layer_strides((38, 19, 10, 5, 3, 1)) == ["s2", "s2", "s2", "valid", "valid"]
    assert extra_layer_strides((16, 8, 4, 2, 1)) == ["s2", "s2", "valid", "s2"]
    with pytest.raises(ValueError, match="feature_sizes"):
        extra_layer_strides((38, 7))


def test_encode_decode_round_trip_and_matching():
    enc = BoxEncoder(AnchorConfig())
    gt = np.array([[0.1, 0.1, 0.4, 0.5], [0.5, 0.55, 0.9, 0.95], [0.02, 0.7, 0.06, 0.76]])
    labels = np.array([3, 7, 1])
    offsets, out_labels = enc.encode(gt, labels)
    assert offsets.shape == (8732, 4) and out_labels.shape == (8732,)
    # Every object keeps at least one default box (even the tiny third one).
    assert set(np.unique(out_labels)) == {0, 1, 3, 7}
    decoded = np.asarray(decode_offsets(jnp.asarray(offsets), jnp.asarray(enc.anchors)))
    for g, lab in zip(gt, labels, strict=True):
        rows = decoded[out_labels == lab]
        np.testing.assert_allclose(rows, np.broadcast_to(g, rows.shape), atol=1e-5)
    # Background rows decode to their own default boxes (zero offsets).
    np.testing.assert_allclose(offsets[out_labels == 0], 0.0, atol=1e-6)
    np.testing.assert_allclose(
        decoded[out_labels == 0], cxcywh_to_xyxy(enc.anchors)[out_labels == 0], atol=1e-6
    )
    empty_offsets, empty_labels = enc.encode(np.zeros((0, 4)), np.zeros(0, np.int32))
    assert not empty_labels.any() and not empty_offsets.any()


def test_hard_negative_mining_keeps_three_negatives_per_positive():
    rng = np.random.default_rng(0)
    loss = jnp.asarray(rng.uniform(size=(3, 50)), jnp.float32)
    positives = np.zeros((3, 50), bool)
    positives[0, :2] = True
    positives[1, [5, 9, 11, 20]] = True
    positives[2, :20] = True  # 3 x 20 > 30 negatives available
    neg = np.asarray(hard_negative_mask(loss, jnp.asarray(positives)))
    assert neg.sum(1).tolist() == [6, 12, 30]
    assert not (neg & positives).any()
    # They are the hardest ones.
    for i in range(2):
        bg = np.where(~positives[i])[0]
        hardest = bg[np.argsort(-np.asarray(loss)[i, bg])[: neg[i].sum()]]
        assert set(np.where(neg[i])[0]) == set(hardest)


def test_ssd_loss_normalises_per_image_and_ignores_empty_images():
    rng = np.random.default_rng(1)
    a, c = 40, 5
    pred_off = jnp.asarray(rng.normal(size=(2, a, 4)), jnp.float32)
    logits = jnp.asarray(rng.normal(size=(2, a, c)), jnp.float32)
    tgt_off = jnp.asarray(rng.normal(size=(2, a, 4)), jnp.float32)
    labels = np.zeros((2, a), np.int32)
    labels[0, :4] = [1, 2, 3, 4]
    out = ssd_loss_per_image(pred_off, logits, tgt_off, jnp.asarray(labels))
    assert float(out["total"][1]) == 0.0 and float(out["pos"][0]) == 4.0
    # Reference for image 0 in NumPy.
    d = np.abs(np.asarray(pred_off[0, :4] - tgt_off[0, :4]))
    box = np.sum(np.where(d < 1, 0.5 * d * d, d - 0.5))
    logp = np.asarray(jax.nn.log_softmax(logits[0]))
    xent = -logp[np.arange(a), labels[0]]
    neg = np.argsort(-np.where(labels[0] > 0, -np.inf, xent))[:12]
    cls = xent[:4].sum() + xent[neg].sum()
    np.testing.assert_allclose(float(out["total"][0]), (box + cls) / 4, rtol=1e-5)
    grads = jax.grad(
        lambda p: ssd_loss_per_image(p, logits, tgt_off, jnp.asarray(labels))["total"].sum()
    )(pred_off)
    assert np.all(np.isfinite(grads)) and np.any(grads != 0)


def test_mlperf_step_decay_is_one_phase_with_drops_at_epochs_64_and_80():
    from configs.ssd import get_config
    from mlperf.ssd.task import SsdTask

    config = get_config("mlperf_v07")
    task = SsdTask(config)
    # One phase: the drops are in the schedule, so the train step compiles once.
    (phase,) = task.phases()
    assert phase.steps == config.train.steps == 2434
    # Epochs 64 and 80 of 117,266 images at GBS 4096: ceil(64 * 28.63) and ceil(80 * 28.63).
    drops = task.lr_drop_steps()
    assert (
        drops
        == (math.ceil(64 * 117266 / 4096), math.ceil(80 * 117266 / 4096))
        == (
            1833,
            2291,
        )
    )
    lr = task.schedule()
    base = config.optimizer.learning_rate
    np.testing.assert_allclose(lr(375), base / 2, rtol=1e-6)  # half-way through warmup
    for step, want in [(750, base), (1832, base), (1833, base * 0.1), (2290, base * 0.1)]:
        np.testing.assert_allclose(lr(step), want, rtol=1e-6, err_msg=f"step {step}")
    np.testing.assert_allclose(lr(2291), base * 0.01, rtol=1e-6)
    np.testing.assert_allclose(lr(2433), base * 0.01, rtol=1e-6)

    # A different global batch moves the drops; steps and epochs together are an error.
    config.train.global_batch_size = 2048
    config.train.steps = 5000
    assert SsdTask(config).lr_drop_steps() == (3665, 4581)
    config.optimizer.lr_drop_steps = (100,)
    with pytest.raises(ValueError, match="not both"):
        SsdTask(config).lr_drop_steps()


def test_tiny_schedule_is_one_phase_with_linear_warmup_and_decay():
    from configs.ssd import get_config
    from mlperf.ssd.task import SsdTask

    config = get_config("tiny")
    task = SsdTask(config)
    (phase,) = task.phases()
    assert phase.steps == 300 and task.lr_drop_steps() == ()
    lr = task.schedule()
    np.testing.assert_allclose(lr(20), 3e-3, rtol=1e-6)
    np.testing.assert_allclose(lr(160), 3e-3 * 140 / 280, rtol=1e-5)
