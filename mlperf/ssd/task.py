"""SSD (ResNet-34) as a Task: anchor-encoded training, on-device NMS, COCO mAP on the hosts.

Eval: `eval_outputs` runs the model, decodes boxes and does batched NMS on the mesh
(batch-sharded); `host_eval_stats` turns this host's rows into a fixed-size detections
array; `finalize_eval` (async, a background thread) runs pycocotools COCOeval on the
detections of every shard and returns the box mAP.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from input_pipeline.coco_builder import CocoData, CocoFolder, prepare_coco
from input_pipeline.coco_source import cache_dir, coco_folder
from mlperf.coco_eval import CocoEvaluator
from mlperf.config_error import ConfigError
from mlperf.layers.conv import IMAGE_AXES
from mlperf.layers.pixels import normalise_images
from mlperf.layers.resnet_import import check_backbone_checkpoint, load_torchvision_resnet
from mlperf.pretrained import PretrainedModules
from mlperf.ssd import data as ssd_data
from mlperf.ssd.boxes import (
    AnchorConfig,
    BoxEncoder,
    decode_offsets,
    default_boxes,
    to_pixel_xywh,
)
from mlperf.ssd.loss import ssd_loss_per_image
from mlperf.ssd.model import Ssd, SsdConfig, backbone_config
from mlperf.ssd.nms import batched_nms
from mlperf.task import Phase, Task, from_config, single_phase
from parallel.precision import policy_from_config


def anchor_config(m) -> AnchorConfig:
    """AnchorConfig from config.model (ratios per level as tuples: the config is hashed)."""
    return from_config(AnchorConfig, m, aspect_ratios=tuple(tuple(r) for r in m.aspect_ratios))


def check_spatial_partitioning(config) -> None:
    """model.spatial_partitions=k needs a model axis of k and height mapped onto it."""
    k = config.model.spatial_partitions
    if k <= 1:
        return
    rules = {name: axis for name, axis in config.parallel.get("rules", ())}
    model_size = dict(zip(config.mesh.axes, config.mesh.ici_shape, strict=True)).get("model")
    if rules.get("height") != "model" or model_size != k:
        raise ConfigError(
            f"model.spatial_partitions={k} needs --config.mesh.ici_shape='(-1,{k})' and "
            '--config.parallel.rules=\'(("height","model"),)\' (got mesh '
            f"{tuple(config.mesh.ici_shape)}, rules {tuple(config.parallel.get('rules', ()))})."
        )


@dataclasses.dataclass(frozen=True)
class SsdData:
    """What SsdTask.prepare builds: the COCO-format splits and their COCO evaluator."""

    coco: CocoData
    evaluator: CocoEvaluator


class SsdTask(Task[SsdData]):
    """MLPerf SSD: box mAP on COCO-format data."""

    benchmark = "ssd"
    target_metric = "mAP"
    async_finalize = True  # COCOeval runs in a background thread while training continues

    def __init__(self, config, data: SsdData | None = None):
        super().__init__(config, data)
        check_spatial_partitioning(config)
        check_backbone_checkpoint(config)
        self.anchors = anchor_config(config.model)
        self.encoder = BoxEncoder(self.anchors)

    # ---- data ------------------------------------------------------------------------
    def coco_folder(self) -> CocoFolder:
        """The configured data set as a COCO folder (input_pipeline/coco_source.py)."""
        return coco_folder(self.config.data, self.config.data.shapes_image_size)

    def prepare(self, shard_index: int, shard_count: int) -> SsdData:
        """Builds (or loads) the data set and the COCO evaluator."""
        del shard_index, shard_count  # every host reads the same random-access splits
        self._backbone()  # a wrong backbone file fails before the data is built
        data = prepare_coco(self.coco_folder(), os.path.join(cache_dir(self.config.data), "tfds"))
        classes = self.config.model.num_classes
        if classes and classes != data.num_classes:
            raise ConfigError(
                f"model.num_classes={classes} but the data has {data.num_classes} "
                "classes (with background); set it to 0 to take the data's."
            )
        return SsdData(data, CocoEvaluator(data.eval_gt_path, data.label_to_category))

    def train_data(self, phase: Phase, host_batch_size: int, shard_index: int, shard_count: int):
        return ssd_data.train_loader(
            self.data.coco.train,
            host_batch_size,
            self.config.seed,
            shard_index,
            shard_count,
            self.anchors.image_size,
            self.encoder,
            worker_count=self.config.data.get("input_workers", 0),
            colour=self.config.data.get("colour_distort", False),
        )

    def eval_data(self, global_batch_size: int, shard_index: int, shard_count: int):
        return ssd_data.eval_batches(
            self.data.coco.eval,
            self.anchors.image_size,
            global_batch_size,
            shard_index,
            shard_count,
            self.config.data.max_eval_examples,
        )

    def input_axes(self) -> dict[str, tuple[str | None, ...]]:
        """The image is split like the first convolution's input: under spatial
        partitioning each device receives only its rows of pixels."""
        return {"image": IMAGE_AXES[1:]}

    def example_spec(self, phase: Phase) -> dict[str, tuple[tuple[int, ...], str]]:
        s, a = self.anchors.image_size, self.anchors.num_boxes
        return {
            "image": ((s, s, 3), "uint8"),  # normalised on the device
            "boxes": ((a, 4), "float32"),
            "labels": ((a,), "int32"),
        }

    def num_eval_examples(self) -> int:
        n = len(self.data.coco.eval)
        cap = self.config.data.max_eval_examples
        return min(n, cap) if cap > 0 else n

    # ---- schedule ----------------------------------------------------------------------
    def lr_drop_steps(self) -> tuple[int, ...]:
        """Global steps of the x`lr_drop_factor` drops: `optimizer.lr_drop_steps`, or
        `optimizer.lr_drop_epochs` converted with data.train_examples / global batch
        (MLPerf v0.7: epochs 64 and 80). Drops at or past the last step are dropped."""
        c, o = self.config, self.config.optimizer
        steps = tuple(int(s) for s in o.lr_drop_steps)
        if o.lr_drop_epochs:
            if steps:
                raise ConfigError(
                    "set optimizer.lr_drop_steps or optimizer.lr_drop_epochs, not both "
                    f"(got {steps} and {tuple(o.lr_drop_epochs)})."
                )
            if c.data.train_examples <= 0:
                raise ConfigError(
                    "optimizer.lr_drop_epochs needs data.train_examples > 0 (the training "
                    "set size) to turn epochs into steps."
                )
            per_epoch = c.data.train_examples / c.train.global_batch_size
            steps = tuple(math.ceil(e * per_epoch) for e in o.lr_drop_epochs)
        return tuple(s for s in steps if 0 < s < c.train.steps)

    def make_phases(self) -> list[Phase]:
        """One phase: the step drops live in the schedule, so the train step compiles once."""
        return [single_phase(self.config, {})]

    # ---- model -------------------------------------------------------------------------
    def model_config(self) -> SsdConfig:
        m = self.config.model
        classes = m.num_classes or (self.data.coco.num_classes if self.has_data else 0)
        if not classes:
            raise ConfigError("model.num_classes is 0 and no data is prepared to take it from.")
        return self._model_shape(classes)

    def _model_shape(self, num_classes: int) -> SsdConfig:
        return from_config(
            SsdConfig,
            self.config.model,
            num_classes=num_classes,
            anchors=self.anchors,
            dtype=policy_from_config(
                self.config.precision.compute_dtype, self.config.precision.param_dtype
            ).compute_dtype,
        )

    def build_model(self, rngs: nnx.Rngs) -> Ssd:
        return Ssd(self.model_config(), rngs=rngs)

    def _backbone(self) -> dict[str, Any] | None:
        """The ImageNet ResNet-34 of `init.backbone_checkpoint` (a torchvision .pth) as
        the backbone's params, or None without one."""
        path = self.config.get("init", {}).get("backbone_checkpoint", "")
        if not path:
            return None
        return load_torchvision_resnet(path, backbone_config(self._model_shape(num_classes=1)))

    def pretrained(self, param_shapes) -> PretrainedModules | None:
        """The backbone from `init.backbone_checkpoint`; the heads start random."""
        backbone = self._backbone()
        if backbone is None:
            return None
        path = self.config.init.backbone_checkpoint
        return PretrainedModules({"backbone": backbone}, param_shapes, f"ResNet-34 backbone {path}")

    # ---- loss --------------------------------------------------------------------------
    def denominators(self, batch) -> dict[str, jax.Array]:
        return {"examples": jnp.asarray(batch["labels"].shape[0], jnp.float32)}

    def loss(self, model, batch, denominators, rng):
        del rng  # no dropout
        offsets, logits = model(normalise_images(batch["image"]), train=True)
        per_image = ssd_loss_per_image(offsets, logits, batch["boxes"], batch["labels"])
        n = denominators["examples"]
        loss = jnp.sum(per_image["total"]) / n
        wd = self.config.optimizer.l2_weight_decay
        if wd:
            # L2 on conv kernels, added once per global batch: each replica and
            # microbatch adds its share (its rows / global rows), the step sums them.
            kernels = [
                x
                for path, x in jax.tree_util.tree_leaves_with_path(
                    nnx.to_pure_dict(nnx.state(model, nnx.Param))
                )
                if str(getattr(path[-1], "key", "")) == "kernel"
            ]
            l2 = sum(jnp.sum(k.astype(jnp.float32) ** 2) for k in kernels)
            loss = loss + 0.5 * wd * l2 * (batch["labels"].shape[0] / n)
        aux = {
            "box_loss": jnp.sum(per_image["box"]) / n,
            "cls_loss": jnp.sum(per_image["cls"]) / n,
            "positives": jnp.sum(per_image["pos"]) / n,
        }
        return loss, aux

    # ---- eval --------------------------------------------------------------------------
    def eval_sums(self, model, batch) -> dict[str, jax.Array]:
        return {"examples": jnp.sum(batch["mask"]).astype(jnp.int32)}

    def eval_outputs(self, model, batch) -> dict[str, jax.Array]:
        """Fixed-size detections per image (normalised x0, y0, x1, y1), NMS on device."""
        offsets, logits = model(normalise_images(batch["image"]), train=False)
        anchors = jnp.asarray(default_boxes(self.anchors))
        boxes = jnp.clip(decode_offsets(offsets, anchors), 0.0, 1.0)
        e = self.config.eval
        return batched_nms(
            boxes,
            jax.nn.softmax(logits, axis=-1),
            pre_nms=e.pre_nms_top_k,
            max_detections=e.max_detections,
            iou_threshold=e.nms_iou_threshold,
            score_threshold=e.score_threshold,
        )

    def host_eval_stats(self, outputs, batches) -> dict[str, np.ndarray]:
        """This host's detections as [rows, D, 6] (x, y, w, h in image pixels, score,
        label) with image ids and the padding mask; same shapes on every host."""
        dets, ids, mask = [], [], []
        for out, batch in zip(outputs, batches, strict=True):
            xywh = to_pixel_xywh(out["boxes"], batch["width"], batch["height"])
            dets.append(
                np.concatenate(
                    [xywh, out["scores"][..., None], out["classes"][..., None]], -1
                ).astype(np.float32)
            )
            ids.append(batch["image_id"].astype(np.int64))
            mask.append(batch["mask"].astype(np.float32))
        return {
            "detections": np.concatenate(dets),
            "image_ids": np.concatenate(ids),
            "mask": np.concatenate(mask),
        }

    def coco_results(self, sums: dict[str, Any]) -> list[dict[str, Any]]:
        """COCO result dicts from the gathered detections of every shard."""
        dets = np.asarray(sums["detections"]).reshape(-1, *np.shape(sums["detections"])[-2:])
        ids = np.asarray(sums["image_ids"]).reshape(-1)
        mask = np.asarray(sums["mask"]).reshape(-1)
        real = mask > 0
        dets, ids = dets[real], ids[real]
        keep = dets[..., 4] > 0  # filled NMS slots
        image_ids = np.broadcast_to(ids[:, None], keep.shape)[keep]
        d = dets[keep]
        labels = d[:, 5].astype(np.int64)
        return self.data.evaluator.box_results(image_ids, d[:, :4], d[:, 4], labels)

    def finalize_eval(self, sums: dict[str, Any]) -> dict[str, float]:
        stats = self.data.evaluator.evaluate(self.coco_results(sums))
        return {
            "mAP": stats["AP"],
            "AP50": stats["AP50"],
            "AP75": stats["AP75"],
            "AR100": stats["AR100"],
            "eval_examples": int(sums["examples"]),
        }

    # ---- reporting ---------------------------------------------------------------------
    def mllog_hparams(self) -> dict[str, Any]:
        c, o = self.config, self.config.optimizer
        return {
            "opt_name": o.name,
            "opt_base_learning_rate": o.learning_rate,
            "opt_weight_decay": o.l2_weight_decay,
            "opt_learning_rate_warmup_steps": o.warmup_steps,
            "opt_learning_rate_warmup_factor": o.warmup_factor,
            "opt_learning_rate_decay_boundary_epochs": list(o.lr_drop_epochs),
            "opt_learning_rate_decay_factor": o.lr_drop_factor,
            "model_bn_span": c.model.bn_group_size,
            "spatial_partitions": c.model.spatial_partitions,
            "max_samples": 1,
        }

    def flops_per_example(self, phase: Phase) -> float:
        """3 x the forward FLOPs of one image, as XLA counts them on the lowered HLO."""
        s = self.anchors.image_size
        graphdef, state = nnx.split(nnx.eval_shape(lambda: self.build_model(nnx.Rngs(0))))

        def forward(state, images):
            return nnx.merge(graphdef, state)(images, train=False)

        images = jax.ShapeDtypeStruct((1, s, s, 3), jnp.float32)
        cost = jax.jit(forward).lower(state, images).cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return 3.0 * float(cost.get("flops", 0.0))
