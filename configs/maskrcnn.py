"""Mask R-CNN configs: `--config configs/maskrcnn.py:<variant>`.

Variants: tiny (procedural shapes with masks, embedded, CPU minutes), coco128 (the person
class of 128 real COCO images, `coco128_seg/` under data.data_dir, a fixed 32-image eval
split), mlperf_v07 (ResNet-50-FPN at 1344 px, global batch 256, SGD momentum 0.9, L2 1e-4,
COCO 2017 from a data dir the user supplies, backbone from torchvision's ImageNet ResNet-50
given with --config.init.backbone_checkpoint; targets box mAP 0.377 and mask mAP 0.339;
docs/official-inputs-vision.md).
"""

from ml_collections import ConfigDict

from configs.common import mesh_block, parallel_block, precision_block, train_block

VARIANTS = ("tiny", "coco128", "mlperf_v07")


def _base() -> ConfigDict:
    c = ConfigDict()
    c.benchmark = "maskrcnn"
    c.variant = ""
    c.seed = 0
    # Multilevel ROIAlign, mask targets and every row selection as one-hot/bilinear
    # einsums: no gather or scatter in the train step (the TPU choice of the paper).
    c.einsum_gather = True
    c.model = ConfigDict(
        dict(
            num_classes=0,  # 0: from the data's categories
            block="bottleneck",
            stage_sizes=(3, 4, 6, 3),
            width=64,
            bn_group_size=0,
            fpn_dim=256,
            fc_dim=1024,
            mask_convs=4,
            mask_roi_size=14,  # 28x28 masks
            anchor_scale=8.0,
            anchor_num_scales=1,  # anchor sizes per octave: scale * stride * 2**(i/n)
            aspect_ratios=(1.0, 2.0, 0.5),
            canonical_roi_size=224.0,
            rpn_batch_per_image=256,
            rpn_pos_iou=0.7,  # RPN matcher: positive at or above, negative below neg
            rpn_neg_iou=0.3,
            rpn_min_best_iou=0.0,  # a box's best anchors are positive if at least this
            rpn_pre_nms_train=2000,
            rpn_post_nms_train=1000,
            rpn_pre_nms_test=1000,
            rpn_post_nms_test=1000,
            rois_per_image=512,
            det_pre_nms=1000,
            max_detections=100,
            # Backbone fine-tuning: 0 trains it all; k >= 1 fixes the stem and the first
            # k-1 stages (mlperf_v07: 2 and frozen batch norm, as the reference).
            backbone_freeze_at=0,
            backbone_frozen_bn=False,
        )
    )
    # ImageNet backbone: a torchvision ResNet-50 state_dict (resnet50-*.pth); "" = random.
    c.init = ConfigDict(dict(backbone_checkpoint=""))
    c.data = ConfigDict(
        dict(
            source="coco",  # "shapes" (embedded procedural set) or "coco" (a COCO folder)
            data_dir="",
            annotations="annotations/instances_train2017.json",
            images_dir="train2017",
            eval_annotations="annotations/instances_val2017.json",
            eval_images_dir="val2017",
            eval_count=0,  # with no eval_annotations: images held out of `annotations`
            categories=(),  # keep only these category names; empty: all
            split_seed=0,
            shapes_images=512,  # the shapes set is generated at image_size pixels
            shapes_seed=0,
            image_size=1344,
            max_instances=100,
            mask_size=112,  # rasterised ground-truth mask crop per instance
            scale_range=(1.0, 1.0),  # training scale jitter factors (1, 1: none)
            cache_dir="",  # "" = ~/.cache/multipod
            max_eval_examples=0,
            input_workers=0,
        )
    )
    c.mesh = mesh_block()
    # rules: logical -> mesh overrides; (("height", "model"),) is SPATIAL_RULES: image
    # height (backbone, FPN, RPN) split over `model`.
    c.parallel = parallel_block(rules=())
    c.precision = precision_block()
    c.optimizer = ConfigDict(
        dict(
            name="sgd",
            momentum=0.9,
            learning_rate=0.02,
            l2_weight_decay=1e-4,  # added to the loss on kernels (the TF v0.7 recipe)
            warmup_steps=100,
            decay_steps=0,
            power=1.0,
            grad_clip_norm=0.0,
            # unused by sgd, kept for the shared optimizer builder's schema
            b1=0.9,
            b2=0.999,
            eps=1e-8,
            weight_decay=0.0,
        )
    )
    # MLPerf v0.7 targets: box mAP 0.377 and mask mAP 0.339
    c.train = train_block(target=0.377, mask_target=0.339)
    return c


def get_config(arg: str = "tiny") -> ConfigDict:
    """Returns the config for one variant."""
    if arg not in VARIANTS:
        raise ValueError(f"unknown maskrcnn variant {arg!r}; choose one of {VARIANTS}.")
    c = _base()
    c.variant = arg
    if arg in ("tiny", "coco128"):
        # A slim ResNet (one bottleneck per stage, width 16): CPU-sized.
        c.model.update(
            stage_sizes=(1, 1, 1, 1),
            width=16,
            fpn_dim=32,
            fc_dim=128,
            mask_convs=2,
            mask_roi_size=7,  # 14x14 masks
            anchor_scale=4.0,  # 16 px anchors at P2
            canonical_roi_size=64.0,  # ROI of 32 px -> level 3, 16 px -> level 2
            rpn_batch_per_image=64,
            rpn_pre_nms_train=200,
            rpn_post_nms_train=100,
            rpn_pre_nms_test=200,
            rpn_post_nms_test=100,
            rois_per_image=64,
            det_pre_nms=200,
            max_detections=20,
        )
        c.data.update(image_size=128, max_instances=8, mask_size=32, max_eval_examples=0)
        c.mesh.ici_shape = (8, 1)
        c.precision.compute_dtype = "float32"
        c.optimizer.update(learning_rate=0.04, warmup_steps=50, l2_weight_decay=1e-4)
    if arg == "tiny":
        # 64 px procedural shapes (10-32 px objects): P2..P6 are 16x16 .. 1x1.
        c.data.update(source="shapes", image_size=64, shapes_images=448, eval_count=64)
        c.train.update(
            global_batch_size=16,
            steps=400,
            eval_every_samples=16 * 50,
            eval_batch_size=64,
            log_every_steps=25,
            # Measured (500-step schedule): box/mask mAP 0.15/0.16 at step 100, 0.51/0.53
            # at step 200; untrained 0.001. See docs/benchmarks.md.
            target=0.45,
            mask_target=0.45,
        )
    elif arg == "coco128":
        # The `person` class only (254 instances in 61 of the 128 images; 96 train / 32
        # eval images): 71 classes on 96 images do not train from scratch. 128 px with
        # flip and scale jitter: ~133 epochs in 800 steps on CPU.
        c.data.update(
            source="coco",
            annotations="coco128_seg/annotations/instances_train2017.json",
            images_dir="coco128_seg/images",
            eval_annotations="",
            eval_images_dir="",
            eval_count=32,
            categories=("person",),
            max_instances=16,
            scale_range=(0.8, 1.25),
        )
        # Anchors and RPN matcher for its tiny people (median box 13 px, 37% under 8 px
        # at 128 px; `python -m launch.bench.anchor_coverage`, docs/design.md):
        # with 16 px anchors and positives at IoU 0.7, 77% of the boxes of 8 px or more
        # had no positive anchor, and 89% of the RPN's positives were anchors tied at a
        # tiny IoU around a box of a few pixels (the best-anchor rule). Two sizes per
        # octave from 12 px and positives at 0.5: 8% without a positive anchor; the
        # best-anchor rule only from IoU 0.3 turns the weak positives into negatives.
        c.model.update(
            anchor_scale=3.0,
            anchor_num_scales=2,
            rpn_pos_iou=0.5,
            rpn_min_best_iou=0.3,
        )
        # Adam as SSD's coco128 (from scratch, same data): SGD lr 0.06 over 400 steps
        # reached held-out box/mask mAP 0.0036/0.00065 (0.0047/0.0002 with these anchors).
        c.optimizer.update(
            name="adam", learning_rate=3e-3, warmup_steps=50, power=1.0, l2_weight_decay=0.0
        )
        c.train.update(
            global_batch_size=16,
            steps=800,
            eval_every_samples=16 * 100,
            eval_batch_size=32,
            log_every_steps=25,
            # Measured (docs/benchmarks.md): held-out person box/mask mAP 0.0063/0.0050
            # at step 600, 0.0042/0.0011 at 700, 0.0053/0.0022 at 800 (AP50 0.021/0.012)
            # against the untrained model's 0.0/0.0 (box AP50 0.00003). The targets sit
            # below the last evals: a weak detector from scratch on 96 images that fits
            # its training images (box/mask mAP 0.24/0.076 there) far better.
            target=0.003,
            mask_target=0.001,
            stop_at_target=False,
        )
    elif arg == "mlperf_v07":
        # Google's MLPerf TPU Mask R-CNN run script at global batch 256 (8-way input
        # partitioning): SGD momentum 0.9, lr 0.26, 1905 warmup steps, x0.1 drops at
        # steps 6000 and 8000; 9000 steps (~19.5 epochs).
        c.mesh.ici_shape = (-1, 8)
        c.parallel.rules = (("height", "model"),)
        c.optimizer.update(
            name="sgd",
            momentum=0.9,
            learning_rate=0.26,
            warmup_steps=1905,
            decay_steps=9000,
            lr_drop_steps=(6000, 8000),
            lr_drop_factor=0.1,
            l2_weight_decay=1e-4,
        )
        c.train.update(
            global_batch_size=256,
            steps=9000,
            eval_every_samples=118287,  # once an epoch
            eval_batch_size=256,
            target=0.377,
            mask_target=0.339,
            # 5 steps per host dispatch: the 616-leaf state's dispatch paid once per 5
            # steps; 5 stacked host batches of 1344 x 1344 images are 0.2 GiB
            # (docs/results/input-per-host.md).
            steps_per_dispatch=5,
        )
        c.data.update(data_dir="", image_size=1344, max_instances=100, mask_size=112)
        # COCO 2017's 80 classes: the prepared data's count wins; this lets launch.inspect
        # and the AOT planner build the model without the data.
        c.model.num_classes = 80
        # The reference (maskrcnn-benchmark, FREEZE_CONV_BODY_AT=2) fine-tunes from
        # ImageNet with the stem and C2 fixed and every batch norm frozen.
        c.model.update(backbone_freeze_at=2, backbone_frozen_bn=True)
    return c
