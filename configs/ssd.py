"""SSD (ResNet-34) configs: `--config configs/ssd.py:<variant>`.

Variants: tiny (the embedded procedural shapes set at 128x128 with a slim backbone,
CPU, minutes), coco128 (the person class of `coco128_seg/` under data.data_dir, a fixed
96/32 split of its image ids, from scratch), mlperf_v07 (Google's MLPerf v0.7 JAX run:
SSD300, global batch 4096, 4-way spatial partitioning, target 0.23 mAP on COCO 2017 from a
folder the user supplies with --config.data.data_dir, starting from torchvision's ImageNet
ResNet-34 given with --config.init.backbone_checkpoint; docs/official-inputs-vision.md).
"""

from ml_collections import ConfigDict

from configs.common import (
    checkpoint_block,
    mesh_block,
    parallel_block,
    precision_block,
    train_block,
)

VARIANTS = ("tiny", "coco128", "mlperf_v07")
SPATIAL_RULES = (("height", "model"),)  # parallel/rules.py SPATIAL_RULES, as config pairs


def _base() -> ConfigDict:
    c = ConfigDict()
    c.benchmark = "ssd"
    c.variant = ""
    c.seed = 0
    c.model = ConfigDict(
        dict(
            num_classes=0,  # with background; 0 = from the data
            image_size=300,
            feature_sizes=(38, 19, 10, 5, 3, 1),
            steps=(8, 16, 32, 64, 100, 300),
            scales=(21, 45, 99, 153, 207, 261, 315),
            aspect_ratios=((2,), (2, 3), (2, 3), (2, 3), (2,), (2,)),
            backbone_width=64,  # 64 = ResNet-34
            feature_channels=(256, 512, 512, 256, 256, 256),
            extra_mid_channels=(256, 256, 128, 128, 128),
            bn_group_size=0,  # examples per batch-norm group ("bn span"); 0 = global batch
            bn_momentum=0.9,
            # Image height of activations over the `model` mesh axis; the variant sets
            # mesh.ici_shape=(-1, k) and parallel.rules to match (checked by the task).
            spatial_partitions=1,
            # Backbone fine-tuning: 0 trains it all (the SSD reference); k >= 1 fixes the
            # stem and the first k-1 stages. frozen_bn: fixed batch-norm statistics.
            backbone_freeze_at=0,
            backbone_frozen_bn=False,
        )
    )
    # ImageNet backbone: a torchvision ResNet-34 state_dict (resnet34-*.pth); "" = random.
    c.init = ConfigDict(dict(backbone_checkpoint=""))
    c.data = ConfigDict(
        dict(
            source="shapes",  # "shapes" (embedded, generated) or "coco" (a COCO folder)
            data_dir="",  # relative COCO paths are resolved against this
            annotations="",
            images_dir="",
            eval_annotations="",  # empty: hold out eval_count images of `annotations`
            eval_images_dir="",
            eval_count=64,
            split_seed=0,
            categories=(),  # keep only these category names; empty: all
            shapes_images=1024,
            shapes_image_size=128,
            shapes_seed=0,
            train_examples=0,  # for epoch-based decay before the data is read
            max_eval_examples=0,
            cache_dir="",  # "" = ~/.cache/multipod
            input_workers=0,
            colour_distort=False,  # SSD photometric distortion in training
        )
    )
    c.mesh = mesh_block()
    c.parallel = parallel_block(rules=())
    c.precision = precision_block()
    c.optimizer = ConfigDict(
        dict(
            name="sgd",
            learning_rate=1e-2,
            momentum=0.9,
            b1=0.9,
            b2=0.999,
            eps=1e-8,
            weight_decay=0.0,  # decoupled decay of adamw/lamb/lars; SGD uses l2_weight_decay
            l2_weight_decay=5e-4,  # L2 on conv kernels in the loss (the MLPerf SSD recipe)
            warmup_steps=0,
            warmup_factor=0.0,  # reported; the warmup ramps linearly from 0
            # Step drops (x lr_drop_factor) at these global steps, or at these epochs of
            # data.train_examples; one phase, so the train step compiles once.
            lr_drop_steps=(),
            lr_drop_epochs=(),
            lr_drop_factor=0.1,
            decay_steps=0,
            power=0.0,  # polynomial decay when there are no drops; 0: constant
            grad_clip_norm=0.0,
        )
    )
    c.eval = ConfigDict(
        dict(pre_nms_top_k=200, max_detections=200, nms_iou_threshold=0.5, score_threshold=0.05)
    )
    c.checkpoint = checkpoint_block()
    c.train = train_block(global_batch_size=32, eval_batch_size=64, target=0.23)
    return c


def _slim(c: ConfigDict) -> None:
    """A 128-pixel SSD: five levels (16, 8, 4, 2, 1), width-8 ResNet-34, thin heads."""
    c.model.update(
        image_size=128,
        feature_sizes=(16, 8, 4, 2, 1),
        steps=(8, 16, 32, 64, 128),
        scales=(13, 26, 47, 69, 91, 113),
        aspect_ratios=((2,), (2, 3), (2, 3), (2,), (2,)),
        backbone_width=8,
        feature_channels=(32, 64, 64, 32, 32),
        extra_mid_channels=(32, 32, 16, 16),
    )
    c.precision.compute_dtype = "float32"  # CPU


def get_config(arg: str = "tiny") -> ConfigDict:
    """Returns the config for one variant."""
    if arg not in VARIANTS:
        raise ValueError(f"unknown ssd variant {arg!r}; choose one of {VARIANTS}.")
    c = _base()
    c.variant = arg
    if arg == "tiny":
        _slim(c)
        c.model.num_classes = 4  # 3 shapes + background (set, so inspect needs no data)
        c.data.update(source="shapes", shapes_images=1024, shapes_image_size=128, eval_count=64)
        c.optimizer.update(
            name="adam", learning_rate=3e-3, warmup_steps=20, power=1.0, l2_weight_decay=0.0
        )
        c.eval.update(pre_nms_top_k=100, max_detections=50)
        # Measured (8 fake devices, 2-core CPU container): mAP 0.004 / 0.044 /
        # 0.110 / 0.220 / 0.267 / 0.308 at steps 50..300; untrained ~0.0005.
        c.train.update(
            global_batch_size=32,
            steps=300,
            eval_every_samples=32 * 50,
            eval_batch_size=64,
            log_every_steps=10,
            target=0.25,
        )
    elif arg == "coco128":
        _slim(c)
        c.data.update(
            source="coco",
            annotations="coco128_seg/annotations/instances_train2017.json",
            images_dir="coco128_seg/images",
            eval_count=32,
            split_seed=0,
            categories=("person",),
        )
        c.model.num_classes = 2  # person + background
        # From scratch on 96 images: colour distortion on top of the IoU crop and flip,
        # a 50-step warmup, then linear decay over 800 steps (~270 epochs).
        c.data.colour_distort = True
        c.optimizer.update(
            name="adam", learning_rate=3e-3, warmup_steps=50, power=1.0, l2_weight_decay=0.0
        )
        c.eval.update(pre_nms_top_k=100, max_detections=50)
        # Measured (2-core CPU container; docs/benchmarks.md), held-out person mAP at
        # steps 100..800: 0.0012 / 0.0027 / 0.0048 / 0.0161 / 0.0167 / 0.0175 / 0.0170 /
        # 0.0171 (AP50 0.030 at 800); the untrained model (same eval, step 0) scores
        # 0.00009 (AP50 0.0003). Target 0.01: >100x the untrained mAP, reached from step
        # 400 on (the plateau is 0.016-0.018), so the run stops there.
        c.train.update(
            global_batch_size=32,
            steps=800,
            eval_every_samples=32 * 100,
            eval_batch_size=32,
            log_every_steps=10,
            target=0.01,
        )
    elif arg == "mlperf_v07":
        # Google's MLPerf v0.7 JAX SSD run (2048 TPU-v3 chips): SSD300 on ResNet-34, GBS
        # 4096, batch-norm span 16, 4-way spatial partitioning (height over `model`).
        c.data.update(
            source="coco",
            annotations="annotations/instances_train2017.json",
            images_dir="train2017",
            eval_annotations="annotations/instances_val2017.json",
            eval_images_dir="val2017",
            train_examples=117266,
        )
        c.model.update(num_classes=81, bn_group_size=16, spatial_partitions=4)
        c.mesh.ici_shape = (-1, 4)
        c.parallel.rules = SPATIAL_RULES
        c.optimizer.update(
            name="sgd",
            momentum=0.9,
            learning_rate=16.0,  # the MLPerf reference's base learning rate
            warmup_steps=750,
            warmup_factor=0.0002048,
            lr_drop_epochs=(64, 80),  # steps 1833 and 2291 at GBS 4096
            lr_drop_factor=0.1,
            l2_weight_decay=5e-4,
            power=0.0,
        )
        c.train.update(
            global_batch_size=4096,
            steps=2434,  # 85 epochs of 117,266 images
            eval_every_samples=117266 * 5,
            eval_batch_size=4096,
            target=0.23,
            # 10 steps per host dispatch (one per progress line): the 440-leaf state's
            # dispatch paid once per 10 steps (docs/results/input-per-host.md).
            steps_per_dispatch=10,
        )
    return c
