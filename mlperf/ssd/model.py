"""SSD300 on a ResNet-34 backbone (the MLPerf v0.7 model), Flax NNX, logical axes only.

Backbone: ResNet-34 up to C4 with stride 1 in its third stage (38x38 at 300x300).
Extra feature layers: 1x1 conv-BN-ReLU then 3x3 conv-BN-ReLU, stride 2 (padding 1)
to halve the map, or a 3x3 "valid" conv to shrink a small one by 2 (5 -> 3 -> 1),
giving 38, 19, 10, 5, 3, 1 at 300. Heads: one 3x3 conv per level for box offsets and
one for class logits. Everything is NHWC with (batch, height, width, channels) logical
axes, so spatial partitioning (height over `model`) needs no change here.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.config_error import ConfigError
from mlperf.layers.conv import BatchNorm, Conv, constrain_image
from mlperf.layers.resnet import ResNet, ResNetConfig, resnet34
from mlperf.ssd.boxes import AnchorConfig
from parallel.partition import constrain


@dataclasses.dataclass(frozen=True)
class SsdConfig:
    """Model shape; the anchors fix the input size and the feature-map sizes."""

    num_classes: int = 81  # including background (COCO: 80 + 1)
    anchors: AnchorConfig = AnchorConfig()
    backbone_width: int = 64  # ResNet width (64 = ResNet-34)
    feature_channels: tuple[int, ...] = (256, 512, 512, 256, 256, 256)  # per level
    extra_mid_channels: tuple[int, ...] = (256, 256, 128, 128, 128)
    bn_group_size: int = 0
    bn_momentum: float = 0.9
    dtype: jnp.dtype = jnp.float32
    # Backbone fine-tuning (mlperf/layers/resnet.py); the SSD reference trains it all.
    backbone_freeze_at: int = 0
    backbone_frozen_bn: bool = False
    # Height shards of spatial partitioning (>1: the extra layers' stride-2 convs run as
    # stride-1 convs plus slicing, see mlperf.layers.conv.Conv).
    spatial_partitions: int = 1


def backbone_config(cfg: SsdConfig) -> ResNetConfig:
    """The ResNet-34 up to C4, third stage at stride 1 (38x38 at 300x300): the MLPerf SSD
    backbone, torchvision's resnet34 with layer3's first block at stride 1."""
    return resnet34(
        width=cfg.backbone_width,
        num_stages=3,
        stage_strides=(1, 2, 1),
        bn_group_size=cfg.bn_group_size,
        bn_momentum=cfg.bn_momentum,
        dtype=cfg.dtype,
        freeze_at=cfg.backbone_freeze_at,
        frozen_bn=cfg.backbone_frozen_bn,
    )


def extra_layer_strides(feature_sizes: tuple[int, ...]) -> list[str]:
    """How each extra level is made from the previous one: "s2" or "valid"."""
    kinds = []
    for prev, size in zip(feature_sizes[:-1], feature_sizes[1:], strict=True):
        # Small maps shrink by a 3x3 valid conv (the reference's 5 -> 3 -> 1).
        if size == prev - 2 and (prev <= 5 or size != (prev + 1) // 2):
            kinds.append("valid")
        elif size == (prev + 1) // 2:
            kinds.append("s2")
        else:
            raise ConfigError(
                f"feature size {size} cannot follow {prev}: an extra layer halves the map "
                "(stride 2) or shrinks it by 2 (3x3 valid); fix anchors.feature_sizes."
            )
    return kinds


class ExtraBlock(nnx.Module):
    """1x1 conv-BN-ReLU, then 3x3 conv-BN-ReLU (stride 2, or valid)."""

    def __init__(self, cin: int, mid: int, cout: int, kind: str, cfg: SsdConfig, rngs: nnx.Rngs):
        bn = dict(rngs=rngs, group_size=cfg.bn_group_size, momentum=cfg.bn_momentum)
        self.conv1 = Conv(cin, mid, 1, rngs=rngs, dtype=cfg.dtype)
        self.bn1 = BatchNorm(mid, dtype=cfg.dtype, **bn)
        stride, padding = (2, 1) if kind == "s2" else (1, 0)
        self.conv2 = Conv(
            mid,
            cout,
            3,
            strides=stride,
            padding=padding,
            rngs=rngs,
            dtype=cfg.dtype,
            # Works around XLA's wrong kernel gradient for stride-2 convs on maps with
            # <= 1 row per height shard (here: the small extra levels).
            stride_by_slicing=cfg.spatial_partitions > 1,
        )
        self.bn2 = BatchNorm(cout, dtype=cfg.dtype, **bn)

    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = jax.nn.relu(self.bn1(self.conv1(x), train))
        return jax.nn.relu(self.bn2(self.conv2(x), train))


class Ssd(nnx.Module):
    """images [B, S, S, 3] -> (box offsets [B, A, 4], class logits [B, A, C]), fp32."""

    def __init__(self, cfg: SsdConfig, *, rngs: nnx.Rngs):
        a = cfg.anchors
        levels = len(a.feature_sizes)
        if len(cfg.feature_channels) != levels or len(cfg.extra_mid_channels) != levels - 1:
            raise ConfigError(
                f"{levels} feature levels need {levels} feature_channels and {levels - 1} "
                "extra_mid_channels."
            )
        self.cfg = cfg
        self.backbone = ResNet(backbone_config(cfg), rngs=rngs)
        c4 = self.backbone.out_channels["C4"]
        # The reference projects C4 to the first level's channels only if they differ.
        self.c4_proj = (
            Conv(c4, cfg.feature_channels[0], 1, rngs=rngs, dtype=cfg.dtype)
            if c4 != cfg.feature_channels[0]
            else None
        )
        kinds = extra_layer_strides(a.feature_sizes)
        self.extras = nnx.List(
            [
                ExtraBlock(cin, mid, cout, kind, cfg, rngs)
                for cin, mid, cout, kind in zip(
                    cfg.feature_channels[:-1],
                    cfg.extra_mid_channels,
                    cfg.feature_channels[1:],
                    kinds,
                    strict=True,
                )
            ]
        )
        per_cell = a.boxes_per_cell()
        self.loc_heads = nnx.List(
            [
                Conv(ch, n * 4, 3, rngs=rngs, use_bias=True, dtype=cfg.dtype)
                for ch, n in zip(cfg.feature_channels, per_cell, strict=True)
            ]
        )
        self.conf_heads = nnx.List(
            [
                Conv(ch, n * cfg.num_classes, 3, rngs=rngs, use_bias=True, dtype=cfg.dtype)
                for ch, n in zip(cfg.feature_channels, per_cell, strict=True)
            ]
        )

    def features(self, images: jax.Array, train: bool) -> list[jax.Array]:
        """The feature map of every level, largest first."""
        x = self.backbone(images, train)["C4"]
        if self.c4_proj is not None:
            x = self.c4_proj(x)
        feats = [x]
        for block in self.extras:
            x = block(x, train)
            feats.append(x)
        return feats

    def __call__(self, images: jax.Array, train: bool) -> tuple[jax.Array, jax.Array]:
        feats = self.features(constrain_image(images), train)
        locs, confs = [], []
        b = images.shape[0]
        for x, loc, conf in zip(feats, self.loc_heads, self.conf_heads, strict=True):
            # Cell-major, then the cell's boxes: the order of default_boxes().
            locs.append(loc(x).astype(jnp.float32).reshape(b, -1, 4))
            confs.append(conf(x).astype(jnp.float32).reshape(b, -1, self.cfg.num_classes))
        loc_out = constrain(jnp.concatenate(locs, axis=1), ("batch", "anchors", None))
        conf_out = constrain(jnp.concatenate(confs, axis=1), ("batch", "anchors", "classes"))
        return loc_out, conf_out
