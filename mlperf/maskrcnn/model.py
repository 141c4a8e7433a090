"""Mask R-CNN (ResNet + FPN P2-P6, RPN, box head, mask head) with static shapes throughout.

Training: RPN losses on sampled anchors; proposals by per-level top-k and on-device NMS;
`rois_per_image` ROIs sampled with a fixed foreground fraction (foreground first, so the
mask branch runs on a static slice of them); multilevel ROIAlign by einsum; box and mask
losses. Inference: proposals, box head, per-class NMS to `max_detections`, masks of the
detections. `einsum` switches every gather-like step (ROIAlign, row selection, mask
targets) between one-hot/bilinear-weight einsums and gathers.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mlperf.layers.resnet import ResNet, ResNetConfig
from mlperf.maskrcnn import boxes as box_lib
from mlperf.maskrcnn import losses, sampling
from mlperf.maskrcnn.heads import BoxHead, Fpn, MaskHead, RpnHead
from mlperf.maskrcnn.nms import generate_proposals, select_detections
from mlperf.maskrcnn.roi_align import roi_align_einsum, roi_align_gather


@dataclasses.dataclass(frozen=True)
class MaskRcnnConfig:
    """Model shape and the fixed sizes of every sampling and selection stage."""

    num_classes: int
    image_size: tuple[int, int]
    backbone: ResNetConfig = ResNetConfig(block="bottleneck", stage_sizes=(3, 4, 6, 3))
    anchors: box_lib.AnchorConfig = box_lib.AnchorConfig()
    fpn_dim: int = 256
    fc_dim: int = 1024
    mask_convs: int = 4
    box_roi_size: int = 7
    mask_roi_size: int = 14  # mask logits are 2x this (28x28)
    sampling_ratio: int = 2
    canonical_roi_size: float = 224.0  # ROI of this size maps to level 4
    rpn_batch_per_image: int = 256
    rpn_fg_fraction: float = 0.5
    rpn_pos_iou: float = 0.7
    rpn_neg_iou: float = 0.3
    rpn_min_best_iou: float = 0.0  # the best-anchor-per-box positive needs this IoU
    rpn_pre_nms_train: int = 2000
    rpn_post_nms_train: int = 1000
    rpn_pre_nms_test: int = 1000
    rpn_post_nms_test: int = 1000
    rpn_nms_iou: float = 0.7
    rois_per_image: int = 512
    fg_fraction: float = 0.25
    fg_iou: float = 0.5
    det_pre_nms: int = 1000
    max_detections: int = 100
    det_nms_iou: float = 0.5
    det_score_threshold: float = 0.05
    einsum: bool = True
    dtype: jnp.dtype = jnp.float32

    @property
    def mask_size(self) -> int:
        return 2 * self.mask_roi_size

    @property
    def num_fg_rois(self) -> int:
        return int(round(self.rois_per_image * self.fg_fraction))


class MaskRcnn(nnx.Module):
    """The network; `losses` trains it, `detect` runs inference."""

    def __init__(self, cfg: MaskRcnnConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.backbone = ResNet(dataclasses.replace(cfg.backbone, dtype=cfg.dtype), rngs=rngs)
        d = cfg.fpn_dim
        self.fpn = Fpn(self.backbone.out_channels, d, rngs=rngs, dtype=cfg.dtype)
        self.rpn = RpnHead(d, cfg.anchors.anchors_per_location, rngs=rngs, dtype=cfg.dtype)
        self.box_head = BoxHead(
            cfg.box_roi_size, d, cfg.fc_dim, cfg.num_classes, rngs=rngs, dtype=cfg.dtype
        )
        self.mask_head = MaskHead(
            d, cfg.num_classes, rngs=rngs, num_convs=cfg.mask_convs, dtype=cfg.dtype
        )

    # ---- shared pieces -------------------------------------------------------------------
    def _anchors(self) -> list[jax.Array]:
        return [
            jnp.asarray(a) for a in box_lib.level_anchors(self.cfg.image_size, self.cfg.anchors)
        ]

    def _pyramid(self, images: jax.Array, train: bool):
        feats = self.fpn(self.backbone(images, train))
        rpn = [self.rpn(p) for p in feats]
        return feats, [s for s, _ in rpn], [d for _, d in rpn]

    def _crop(self, feats: list[jax.Array], boxes: jax.Array, size: int) -> jax.Array:
        """ROIAlign over P2..P5 (P6 feeds only the RPN)."""
        fn = roi_align_einsum if self.cfg.einsum else roi_align_gather
        levels = feats[:4]
        return fn(
            levels,
            boxes,
            self.cfg.anchors.min_level,
            size,
            self.cfg.sampling_ratio,
            self.cfg.canonical_roi_size,
        )

    def _proposals(self, scores, deltas, train: bool):
        c = self.cfg
        return generate_proposals(
            [jax.lax.stop_gradient(s) for s in scores],
            [jax.lax.stop_gradient(d) for d in deltas],
            self._anchors(),
            c.image_size,
            pre_nms_topk=c.rpn_pre_nms_train if train else c.rpn_pre_nms_test,
            post_nms_topk=c.rpn_post_nms_train if train else c.rpn_post_nms_test,
            iou_threshold=c.rpn_nms_iou,
            einsum=c.einsum,
        )

    # ---- training ------------------------------------------------------------------------
    def losses(
        self, batch: dict[str, jax.Array], rng: jax.Array, num_images: jax.Array | int
    ) -> dict[str, jax.Array]:
        """All losses and a few diagnostics for one batch (train-mode batch norm), each a
        sum over these rows divided by a normaliser of the `num_images` global images."""
        c = self.cfg
        num_images = jnp.asarray(num_images, jnp.float32)
        k_rpn, k_roi = jax.random.split(rng)
        gt_boxes = batch["gt_boxes"].astype(jnp.float32)
        gt_classes = batch["gt_classes"].astype(jnp.int32)
        gt_valid = gt_classes > 0
        feats, scores, deltas = self._pyramid(batch["image"], train=True)

        anchors = jnp.asarray(box_lib.all_anchors(c.image_size, c.anchors))
        rpn_t = sampling.rpn_targets(
            k_rpn,
            anchors,
            gt_boxes,
            gt_valid,
            num=c.rpn_batch_per_image,
            fraction=c.rpn_fg_fraction,
            pos_iou=c.rpn_pos_iou,
            neg_iou=c.rpn_neg_iou,
            min_best_iou=c.rpn_min_best_iou,
        )
        rpn_obj, rpn_box = losses.rpn_losses(
            jnp.concatenate(scores, 1),
            jnp.concatenate(deltas, 1),
            rpn_t,
            num_images * c.rpn_batch_per_image,
        )

        proposals, prop_valid = self._proposals(scores, deltas, train=True)
        rois = sampling.sample_rois(
            k_roi,
            proposals,
            prop_valid,
            gt_boxes,
            gt_classes,
            gt_valid,
            num=c.rois_per_image,
            fg_fraction=c.fg_fraction,
            fg_iou=c.fg_iou,
            einsum=c.einsum,
        )
        logits, box_deltas = self.box_head(self._crop(feats, rois["rois"], c.box_roi_size))
        cls_loss, box_loss, accuracy = losses.box_head_losses(
            logits,
            box_deltas,
            rois["classes"],
            rois["box_targets"],
            rois["fg"],
            rois["valid"],
            num_images * c.rois_per_image,
        )

        # Foreground ROIs come first: the mask branch takes a static slice of them.
        nf = c.num_fg_rois
        fg_rois = rois["rois"][:, :nf]
        mask_logits = self.mask_head(self._crop(feats, fg_rois, c.mask_roi_size))
        targets = sampling.mask_targets(
            fg_rois, rois["matched"][:, :nf], gt_boxes, batch["gt_masks"], c.mask_size
        )
        m_loss = losses.mask_loss(
            mask_logits, rois["classes"][:, :nf], targets, rois["fg"][:, :nf], num_images * nf
        )
        return {
            "rpn_score_loss": rpn_obj,
            "rpn_box_loss": rpn_box,
            "class_loss": cls_loss,
            "box_loss": box_loss,
            "mask_loss": m_loss,
            "roi_accuracy": accuracy,
            "fg_fraction": jnp.sum(rois["fg"]) / (num_images * c.rois_per_image),
        }

    # ---- inference -----------------------------------------------------------------------
    def detect(self, images: jax.Array) -> dict[str, jax.Array]:
        """Fixed-size detections: boxes [B, D, 4] (padded-image pixels), scores, classes
        (1..K, 0 = empty slot), valid, and mask probabilities [B, D, 28, 28]."""
        c = self.cfg
        feats, scores, deltas = self._pyramid(images, train=False)
        proposals, prop_valid = self._proposals(scores, deltas, train=False)
        logits, box_deltas = self.box_head(self._crop(feats, proposals, c.box_roi_size))
        probs = jax.nn.softmax(logits, axis=-1)[..., 1:]
        anchors = jnp.broadcast_to(proposals[:, :, None, :], box_deltas[..., 1:, :].shape)
        class_boxes = box_lib.clip_boxes(
            box_lib.decode(box_deltas[..., 1:, :], anchors, box_lib.BOX_HEAD_WEIGHTS),
            *c.image_size,
        )
        det = select_detections(
            probs,
            class_boxes,
            prop_valid,
            pre_nms_topk=c.det_pre_nms,
            max_detections=c.max_detections,
            iou_threshold=c.det_nms_iou,
            score_threshold=c.det_score_threshold,
            einsum=c.einsum,
        )
        mask_logits = self.mask_head(self._crop(feats, det["boxes"], c.mask_roi_size))
        onehot = jax.nn.one_hot(det["classes"], c.num_classes + 1, dtype=mask_logits.dtype)
        masks = jax.nn.sigmoid(jnp.einsum("bdk,bdhwk->bdhw", onehot, mask_logits))
        return {**det, "masks": masks}


def count_params(model: nnx.Module) -> int:
    """Number of trainable parameters."""
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
