"""Mask R-CNN as a Task: losses, fixed-size detections for in-loop COCO eval (bbox and
segm, pycocotools on the hosts in a background thread), two quality targets."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from input_pipeline import maskrcnn_data
from input_pipeline.coco_builder import CocoData, CocoFolder, prepare_coco
from input_pipeline.coco_source import cache_dir, coco_folder
from input_pipeline.grain_pipeline import padded_eval_batches
from mlperf.coco_eval import CocoEvaluator
from mlperf.config_error import ConfigError
from mlperf.layers.conv import IMAGE_AXES
from mlperf.layers.pixels import normalise_images
from mlperf.layers.resnet import ResNetConfig
from mlperf.layers.resnet_import import check_backbone_checkpoint, load_torchvision_resnet
from mlperf.maskrcnn.boxes import AnchorConfig
from mlperf.maskrcnn.model import MaskRcnn, MaskRcnnConfig
from mlperf.maskrcnn.postprocess import coco_results
from mlperf.mllog import keys
from mlperf.pretrained import PretrainedModules
from mlperf.task import Phase, Task, from_config, single_phase
from parallel.precision import policy_from_config

BOX_AP = "box_ap"
MASK_AP = "mask_ap"


@dataclasses.dataclass(frozen=True)
class MaskRcnnData:
    """What MaskRcnnTask.prepare builds: the COCO-format splits and the COCO evaluator
    that finalize_eval scores against (the eval split's ground truth)."""

    coco: CocoData
    evaluator: CocoEvaluator


class MaskRcnnTask(Task[MaskRcnnData]):
    """MLPerf Mask R-CNN: box mAP and mask mAP targets on COCO-format data."""

    benchmark = "maskrcnn"
    target_metric = BOX_AP
    async_finalize = True  # COCOeval runs in a background thread

    def __init__(self, config, data: MaskRcnnData | None = None):
        super().__init__(config, data)
        self.mask_target = float(config.train.mask_target)
        check_backbone_checkpoint(config)

    # ---- data ----------------------------------------------------------------------------
    def input_params(self) -> maskrcnn_data.MaskRcnnInput:
        """Example shapes and augmentation ranges from the config's data block."""
        d = self.config.data
        return maskrcnn_data.MaskRcnnInput(
            d.image_size, d.max_instances, d.mask_size, tuple(d.get("scale_range", (1.0, 1.0)))
        )

    def coco_folder(self) -> CocoFolder:
        """The COCO-format source the config names (input_pipeline/coco_source.py)."""
        return coco_folder(self.config.data, self.config.data.image_size)

    def prepare(self, shard_index: int, shard_count: int) -> MaskRcnnData:
        """Builds (or loads) the data set and the eval ground truth before compiling."""
        del shard_index, shard_count  # every host reads the same prepared set
        self._backbone()  # a wrong backbone file fails before the data is built
        data = prepare_coco(self.coco_folder(), os.path.join(cache_dir(self.config.data), "tfds"))
        return MaskRcnnData(data, CocoEvaluator(data.eval_gt_path, data.label_to_category))

    def train_data(self, phase: Phase, host_batch_size: int, shard_index: int, shard_count: int):
        return maskrcnn_data.train_loader(
            self.data.coco.train,
            self.input_params(),
            host_batch_size,
            seed=self.config.seed,
            shard_index=shard_index,
            shard_count=shard_count,
            worker_count=self.config.data.get("input_workers", 0),
        )

    def num_eval_examples(self) -> int:
        n = len(self.data.coco.eval)
        limit = self.config.data.get("max_eval_examples", 0)
        return min(n, limit) if limit else n

    def eval_data(self, global_batch_size: int, shard_index: int, shard_count: int):
        return self.eval_batches(
            self.data.coco.eval,
            global_batch_size,
            shard_index,
            shard_count,
            count=self.num_eval_examples(),
        )

    def eval_batches(
        self,
        records: Sequence[Any],
        global_batch_size: int,
        shard_index: int,
        shard_count: int,
        count: int = 0,
    ):
        """Padded eval batches (resize and pad, no augmentation) of the first `count`
        (0: all) builder records: the eval split, or the training split to score what a
        run learnt."""
        p = self.input_params()
        dtypes = {k: d for k, (_, d) in maskrcnn_data.example_spec(p, train=False).items()}
        return padded_eval_batches(
            maskrcnn_data.EvalExamples(records, p),
            count or len(records),
            global_batch_size,
            shard_index,
            shard_count,
            dtypes,
        )

    def ground_truth_of(self, records: Sequence[Any]) -> dict[str, Any]:
        """COCO ground truth (kept categories only) of these records' images, from the
        source annotations: what `score_against` needs to score a split other than eval."""
        from input_pipeline.coco_records import eval_ground_truth, load_coco_json

        return eval_ground_truth(
            load_coco_json(self.coco_folder().annotations),
            [{"image_id": int(r["image_id"])} for r in records],
            self.data.coco.label_to_category,
        )

    def scored_against(self, gt_path: str) -> MaskRcnnTask:
        """This task with `finalize_eval` scoring against the COCO ground-truth file
        gt_path (the eval split's by default)."""
        evaluator = CocoEvaluator(gt_path, self.data.coco.label_to_category)
        return self.with_data(dataclasses.replace(self.data, evaluator=evaluator))

    def input_axes(self) -> dict[str, tuple[str | None, ...]]:
        """The image is split like the first convolution's input: under spatial
        partitioning each device receives only its rows of pixels."""
        return {"image": IMAGE_AXES[1:]}

    def example_spec(self, phase: Phase) -> dict[str, tuple[tuple[int, ...], str]]:
        return maskrcnn_data.example_spec(self.input_params(), train=True)

    # ---- phases and model ----------------------------------------------------------------
    def make_phases(self) -> list[Phase]:
        return [single_phase(self.config, {"image_size": self.config.data.image_size})]

    def num_classes(self) -> int:
        """Foreground classes: from the prepared data, else the config (inspect, AOT)."""
        if self.has_data:
            return self.data.coco.num_classes - 1
        if self.config.model.num_classes <= 0:
            raise ConfigError("model.num_classes must be set when the data is not prepared.")
        return self.config.model.num_classes

    def model_config(self) -> MaskRcnnConfig:
        m = self.config.model
        size = self.config.data.image_size
        return from_config(
            MaskRcnnConfig,
            m,
            num_classes=self.num_classes(),
            image_size=(size, size),
            backbone=self.backbone_config(),
            # P2..P6 (the model's FPN levels); sizes and shapes from the model block.
            anchors=from_config(
                AnchorConfig, m, {"num_scales": "anchor_num_scales"}, min_level=2, max_level=6
            ),
            einsum=self.config.einsum_gather,
            dtype=policy_from_config(
                self.config.precision.compute_dtype, self.config.precision.param_dtype
            ).compute_dtype,
        )

    def backbone_config(self) -> ResNetConfig:
        """The ResNet (C2..C5) with the reference's fine-tuning choices (mlperf_v07: stem
        and C2 fixed, frozen batch norm)."""
        return from_config(
            ResNetConfig,
            self.config.model,
            {"freeze_at": "backbone_freeze_at", "frozen_bn": "backbone_frozen_bn"},
        )

    def build_model(self, rngs: nnx.Rngs) -> MaskRcnn:
        return MaskRcnn(self.model_config(), rngs=rngs)

    def _backbone(self) -> dict[str, Any] | None:
        """The ImageNet ResNet-50 of `init.backbone_checkpoint` (a torchvision .pth) as
        the backbone's params, or None without one."""
        path = self.config.get("init", {}).get("backbone_checkpoint", "")
        if not path:
            return None
        return load_torchvision_resnet(path, self.backbone_config())

    def pretrained(self, param_shapes) -> PretrainedModules | None:
        """The backbone from `init.backbone_checkpoint`; the heads start random."""
        backbone = self._backbone()
        if backbone is None:
            return None
        path = self.config.init.backbone_checkpoint
        return PretrainedModules({"backbone": backbone}, param_shapes, f"ResNet-50 backbone {path}")

    # ---- loss ----------------------------------------------------------------------------
    def denominators(self, batch) -> dict[str, jax.Array]:
        return {"images": jnp.asarray(batch["image"].shape[0], jnp.float32)}

    def loss(self, model: MaskRcnn, batch, denominators, rng):
        rng = jax.random.key(0) if rng is None else rng
        batch = {**batch, "image": normalise_images(batch["image"], batch.get("image_hw"))}
        parts = model.losses(batch, rng, denominators["images"])
        total = sum(v for k, v in parts.items() if k.endswith("_loss"))
        wd = self.config.optimizer.get("l2_weight_decay", 0.0)
        if wd:
            # L2 on conv/dense kernels (not biases or norms), as the TF v0.7 code adds it
            # to the loss; scaled by this replica's share of the batch so the replica sum
            # counts it once.
            kernels = [
                v[...]
                for path, v in nnx.iter_graph(model)
                if isinstance(v, nnx.Param) and path and path[-1] == "kernel"
            ]
            l2 = 0.5 * sum(jnp.sum(jnp.square(k.astype(jnp.float32))) for k in kernels)
            share = batch["image"].shape[0] / denominators["images"]
            parts["l2_loss"] = wd * l2 * share
            total = total + parts["l2_loss"]
        return total, parts

    # ---- eval ----------------------------------------------------------------------------
    def eval_sums(self, model: MaskRcnn, batch) -> dict[str, jax.Array]:
        """Device sums: only the example count; the metrics are host-side COCOeval."""
        return {"examples": jnp.sum(batch["mask"]).astype(jnp.int32)}

    def eval_outputs(self, model: MaskRcnn, batch) -> dict[str, jax.Array]:
        det = model.detect(normalise_images(batch["image"], batch.get("image_hw")))
        return {
            "boxes": det["boxes"],
            "scores": det["scores"],
            "classes": det["classes"],
            "valid": det["valid"],
            "masks": det["masks"].astype(jnp.float16),
        }

    def host_eval_stats(self, outputs, batches) -> dict[str, np.ndarray]:
        """This host's rows, concatenated (the same shapes on every host: every host runs
        the same number of padded batches); padding rows have valid all False."""
        cat = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
        real = np.concatenate([b["mask"] for b in batches]) > 0
        cat["valid"] = cat["valid"] & real[:, None]
        cat["image_id"] = np.concatenate([b["image_id"] for b in batches])
        cat["scale"] = np.concatenate([b["scale"] for b in batches])
        return cat

    def finalize_eval(self, sums: dict[str, Any]) -> dict[str, float]:
        def flat(name):
            x = np.asarray(sums[name])
            return x.reshape(-1, *x.shape[2:])

        box_res, seg_res = coco_results(
            self.data.evaluator,
            flat("image_id"),
            flat("scale"),
            flat("boxes"),
            flat("scores"),
            flat("classes"),
            flat("valid"),
            flat("masks"),
        )
        box = self.data.evaluator.evaluate(box_res, "bbox")
        seg = self.data.evaluator.evaluate(seg_res, "segm")
        return {
            BOX_AP: box["AP"],
            MASK_AP: seg["AP"],
            "box_ap50": box["AP50"],
            "mask_ap50": seg["AP50"],
            "detections": len(box_res),
            "eval_examples": int(sums["examples"]),
        }

    def target_reached(self, metrics: dict[str, float]) -> bool:
        """Both targets: box mAP and mask mAP."""
        return metrics[BOX_AP] >= self.target_value and metrics[MASK_AP] >= self.mask_target

    # ---- reporting -----------------------------------------------------------------------
    def mllog_hparams(self) -> dict[str, Any]:
        c = self.config
        o = c.optimizer
        return {
            keys.OPT_BASE_LR: o.learning_rate,
            "opt_learning_rate_warmup_steps": o.warmup_steps,
            "opt_learning_rate_warmup_factor": 0.0,
            "opt_weight_decay": o.get("l2_weight_decay", 0.0),
            "min_image_size": c.data.image_size,
            "max_image_size": c.data.image_size,
            "num_image_candidates": c.model.rpn_post_nms_train,
        }

    def flops_per_example(self, phase: Phase) -> float:
        """Coarse analytic training FLOPs per image (3x forward): backbone scaled from
        ResNet-50's 4.1 GMACs at 224x224 by area, width and depth, FPN convs, heads.
        launch.inspect reports the compiler's exact count."""
        m = self.model_config()
        size = m.image_size[0] * m.image_size[1]
        cfg = m.backbone
        # Backbone: ~ 4.1 GFLOPs MACs for ResNet-50 at 224^2 scaled by area and width^2.
        backbone = 4.1e9 * (size / 224**2) * (cfg.width / 64) ** 2 * sum(cfg.stage_sizes) / 16
        fpn = sum(2 * 9 * m.fpn_dim**2 * size / 4**lvl for lvl in range(1, 6))
        box = 2 * m.rois_per_image * (m.box_roi_size**2 * m.fpn_dim * m.fc_dim + m.fc_dim**2)
        mask = 2 * m.num_fg_rois * m.mask_convs * 9 * m.fpn_dim**2 * m.mask_roi_size**2
        return 3.0 * (2 * backbone + fpn + box + mask)
