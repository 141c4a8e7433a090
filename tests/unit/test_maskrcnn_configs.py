"""Mask R-CNN configs: every variant validates on its mesh; mlperf_v07 holds the v0.7
TPU run's batch layout (global 256 = 128 data replicas x 2 images, each image's height
over 8 cores of `model`), and coco128 trains on one class with jitter."""

from __future__ import annotations

import pytest

from configs.maskrcnn import VARIANTS, get_config
from mlperf.validate import validate


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_validates(variant):
    c = get_config(variant)
    devices = 1024 if variant == "mlperf_v07" else 8  # 512 TPU-v3 chips = 1024 cores
    sizes = validate(c, devices)
    assert sizes["data"] * sizes["model"] == devices
    assert c.train.global_batch_size % sizes["data"] == 0


def test_mlperf_v07_matches_the_v07_tpu_run():
    c = get_config("mlperf_v07")
    sizes = validate(c, 1024)
    assert sizes == {"data": 128, "model": 8}
    assert c.train.global_batch_size // sizes["data"] == 2  # images per replica
    assert tuple(c.parallel.rules) == (("height", "model"),)
    assert (c.optimizer.learning_rate, c.optimizer.warmup_steps) == (0.26, 1905)
    assert tuple(c.optimizer.lr_drop_steps) == (6000, 8000)
    assert c.model.num_classes == 80  # buildable without the data (launch.inspect)
    assert (c.train.target, c.train.mask_target) == (0.377, 0.339)


def test_coco128_trains_one_class_with_flip_and_jitter():
    c = get_config("coco128")
    assert tuple(c.data.categories) == ("person",)
    lo, hi = c.data.scale_range
    assert lo < 1.0 < hi
    # Targets well above the untrained model's box mAP (0.00004) and mask mAP (0.0).
    assert 0.001 <= c.train.target < 0.01 and 0.0001 <= c.train.mask_target < 0.01
    assert not c.train.stop_at_target  # trains its steps and reports the mAPs reached


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown maskrcnn variant"):
        get_config("huge")
