"""The generic loop starts Mask R-CNN from a torchvision ResNet-50 file and keeps the
reference's frozen parts (stem, C2, every batch norm) fixed through a train step."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from configs.maskrcnn import get_config
from mlperf.checkpoint.torch_file import TorchFileError
from mlperf.trainer import build_trainer

R50 = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "fixtures", "torchvision", "resnet50_w4.pth"
)

pytestmark = pytest.mark.xdist_group("maskrcnn_model")


def _config(checkpoint: str = R50):
    """The tiny config with a full-depth, width-4 ResNet-50 and a small head; AdamW with
    decoupled weight decay, which would move any weight the step did not protect."""
    c = get_config("tiny")
    c.model.update(
        num_classes=3,
        stage_sizes=(3, 4, 6, 3),
        width=4,
        fpn_dim=8,
        fc_dim=16,
        mask_convs=1,
        mask_roi_size=4,
        rpn_batch_per_image=16,
        rpn_pre_nms_train=32,
        rpn_post_nms_train=16,
        rpn_pre_nms_test=32,
        rpn_post_nms_test=16,
        rois_per_image=8,
        det_pre_nms=16,
        max_detections=4,
        backbone_freeze_at=2,
        backbone_frozen_bn=True,
    )
    c.data.update(image_size=64, max_instances=2, mask_size=8)
    c.train.update(global_batch_size=8, eval_batch_size=8, steps=2)
    c.optimizer.update(name="adamw", learning_rate=1e-2, weight_decay=0.1, warmup_steps=0)
    c.optimizer.l2_weight_decay = 0.0
    c.init.backbone_checkpoint = checkpoint
    return c


def _batch(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    boxes = np.zeros((n, 2, 4), np.float32)
    boxes[:, 0] = (8, 8, 40, 48)
    classes = np.zeros((n, 2), np.int32)
    classes[:, 0] = rng.integers(1, 4, n)
    masks = np.zeros((n, 2, 8, 8), np.uint8)
    masks[:, 0, :, :5] = 1
    return {
        "image": rng.integers(0, 256, (n, 64, 64, 3), np.uint8),  # normalised on the device
        "image_hw": np.full((n, 2), 64, np.int32),
        "gt_boxes": boxes,
        "gt_classes": classes,
        "gt_masks": masks,
    }


@pytest.mark.slow  # ~30 s: compiles a Mask R-CNN train step with a full-depth ResNet-50
def test_pretrained_backbone_loads_and_frozen_parts_stay_fixed():
    from mlperf.layers.resnet_import import load_torchvision_resnet

    trainer = build_trainer(_config(), prepare_data=False)
    expected = load_torchvision_resnet(R50, trainer.task.backbone_config())
    state = trainer.init_state()
    before = jax.device_get(state["params"])
    np.testing.assert_array_equal(
        before["backbone"]["stages"][3][2]["conv3"]["conv"]["kernel"],
        expected["stages"][3][2]["conv3"]["conv"]["kernel"],
    )
    phase = trainer.phases[0]
    layout = trainer.partitioner.data_layout(phase.global_batch_size)
    batch = trainer.partitioner.host_to_global(_batch(phase.global_batch_size), layout)
    key = trainer.partitioner.replicate(lambda: jax.random.key(0))
    state, _ = trainer.lower_train_step(phase).compile()(state, batch, key)
    after = jax.device_get(state["params"])["backbone"]
    b = before["backbone"]
    # Frozen: the stem and C2 entirely, and every batch norm's statistics and affine.
    for path in (("stem",), ("stages", 0), ("stages", 2, 1, "conv2", "bn")):
        old, new = b, after
        for k in path:
            old, new = old[k], new[k]
        jax.tree.map(np.testing.assert_array_equal, old, new)
    # Trained: a later stage's convolution.
    moved = after["stages"][2][1]["conv2"]["conv"]["kernel"]
    assert not np.array_equal(moved, b["stages"][2][1]["conv2"]["conv"]["kernel"])


def test_wrong_depth_file_fails_before_the_state_is_built(tmp_path):
    r34 = os.path.join(os.path.dirname(R50), "resnet34_w4.pth")
    trainer = build_trainer(_config(r34), prepare_data=False)
    with pytest.raises(TorchFileError, match="holds ResNet-34"):
        trainer.init_state()


def test_missing_checkpoint_is_one_clear_line(tmp_path):
    from mlperf.maskrcnn.task import MaskRcnnTask

    with pytest.raises(FileNotFoundError, match="init.backbone_checkpoint=.*resnet50"):
        MaskRcnnTask(_config(str(tmp_path / "nope.pth")))
