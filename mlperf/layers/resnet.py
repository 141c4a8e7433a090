"""ResNet-34 (basic blocks) and ResNet-50 (bottlenecks) backbones returning C2..C5.

Written on logical axes only (mlperf/layers/conv.py), so the same module runs data
parallel or spatially partitioned. Detection heads choose what they need: SSD takes
C4 of a ResNet-34 whose third stage keeps stride 1 (the MLPerf SSD backbone, 38x38 at
300x300 input); Mask R-CNN takes C2..C5 of a ResNet-50 for its FPN.

`freeze_at` and `frozen_bn` are the detection references' fine-tuning choices: Mask
R-CNN (maskrcnn-benchmark, FREEZE_CONV_BODY_AT=2, FrozenBatchNorm2d) keeps the stem and
the first stage fixed and every batch norm frozen; SSD trains the whole backbone.
The parameter names follow torchvision's layout one to one (mlperf/layers/
resnet_import.py maps a torchvision state_dict onto them).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.config_error import ConfigError
from mlperf.layers.conv import ConvBN, constrain_image, max_pool

STAGE_NAMES = ("C2", "C3", "C4", "C5")


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    """Backbone shape. `width` scales every stage's channels (64 = the standard nets)."""

    block: str = "basic"  # "basic" (ResNet-18/34) or "bottleneck" (ResNet-50/101)
    stage_sizes: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    stage_strides: tuple[int, ...] = (1, 2, 2, 2)
    num_stages: int = 4  # build stages C2.. up to C{1+num_stages}
    bn_group_size: int = 0  # examples per batch-norm group, 0 = global batch
    bn_momentum: float = 0.9
    dtype: jnp.dtype = jnp.float32
    # 0: everything trains; 1: the stem is fixed; k >= 2: the stem and stages C2..C(k)
    # are fixed (weights and batch-norm affine; no gradient flows below them).
    freeze_at: int = 0
    frozen_bn: bool = False  # every batch norm uses fixed statistics and affine

    def stage_channels(self, i: int) -> int:
        """Output channels of stage i (0 = C2)."""
        expansion = 4 if self.block == "bottleneck" else 1
        return self.width * (2**i) * expansion


def resnet34(**overrides) -> ResNetConfig:
    """ResNet-34: basic blocks 3-4-6-3."""
    return ResNetConfig(block="basic", stage_sizes=(3, 4, 6, 3), **overrides)


def resnet50(**overrides) -> ResNetConfig:
    """ResNet-50: bottleneck blocks 3-4-6-3."""
    return ResNetConfig(block="bottleneck", stage_sizes=(3, 4, 6, 3), **overrides)


def _conv_bn_kwargs(cfg: ResNetConfig, rngs: nnx.Rngs, frozen: bool) -> dict:
    return dict(
        rngs=rngs,
        bn_group_size=cfg.bn_group_size,
        bn_momentum=cfg.bn_momentum,
        dtype=cfg.dtype,
        frozen=frozen,
        frozen_bn=cfg.frozen_bn,
    )


class BasicBlock(nnx.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 projection) shortcut."""

    def __init__(
        self,
        cin: int,
        cout: int,
        stride: int,
        cfg: ResNetConfig,
        *,
        rngs: nnx.Rngs,
        frozen: bool = False,
    ):
        kw = _conv_bn_kwargs(cfg, rngs, frozen)
        self.conv1 = ConvBN(cin, cout, 3, strides=stride, **kw)
        # Zero-initialised last BN scale: each block starts as the identity (Goyal et al.).
        self.conv2 = ConvBN(cout, cout, 3, relu=False, zero_init_scale=True, **kw)
        self.proj = (
            ConvBN(cin, cout, 1, strides=stride, relu=False, **kw)
            if stride != 1 or cin != cout
            else None
        )

    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        shortcut = x if self.proj is None else self.proj(x, train)
        y = self.conv2(self.conv1(x, train), train)
        return constrain_image(jax.nn.relu(y + shortcut))


class Bottleneck(nnx.Module):
    """1x1 reduce, 3x3 (carrying the stride, as in torchvision v1.5), 1x1 expand."""

    def __init__(
        self,
        cin: int,
        cout: int,
        stride: int,
        cfg: ResNetConfig,
        *,
        rngs: nnx.Rngs,
        frozen: bool = False,
    ):
        kw = _conv_bn_kwargs(cfg, rngs, frozen)
        mid = cout // 4
        self.conv1 = ConvBN(cin, mid, 1, **kw)
        self.conv2 = ConvBN(mid, mid, 3, strides=stride, **kw)
        self.conv3 = ConvBN(mid, cout, 1, relu=False, zero_init_scale=True, **kw)
        self.proj = (
            ConvBN(cin, cout, 1, strides=stride, relu=False, **kw)
            if stride != 1 or cin != cout
            else None
        )

    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        shortcut = x if self.proj is None else self.proj(x, train)
        y = self.conv3(self.conv2(self.conv1(x, train), train), train)
        return constrain_image(jax.nn.relu(y + shortcut))


class ResNet(nnx.Module):
    """Stem (7x7/2 conv, 3x3/2 max pool) and up to four stages; returns {"C2": .., ...}."""

    def __init__(self, cfg: ResNetConfig, *, rngs: nnx.Rngs, in_channels: int = 3):
        if cfg.block not in ("basic", "bottleneck"):
            raise ConfigError(f"ResNet block {cfg.block!r}: use 'basic' or 'bottleneck'.")
        if not 1 <= cfg.num_stages <= len(cfg.stage_sizes):
            raise ConfigError(f"num_stages={cfg.num_stages} must be in 1..{len(cfg.stage_sizes)}.")
        if not 0 <= cfg.freeze_at <= cfg.num_stages + 1:
            raise ConfigError(
                f"backbone freeze_at={cfg.freeze_at} must be in 0..{cfg.num_stages + 1} (0: "
                "train all, 1: freeze the stem, k: the stem and the first k-1 stages)."
            )
        self.cfg = cfg
        self.stem = ConvBN(
            in_channels, cfg.width, 7, strides=2, **_conv_bn_kwargs(cfg, rngs, cfg.freeze_at >= 1)
        )
        block_cls = BasicBlock if cfg.block == "basic" else Bottleneck
        stages = []
        cin = cfg.width
        for i in range(cfg.num_stages):
            cout = cfg.stage_channels(i)
            blocks = []
            for j in range(cfg.stage_sizes[i]):
                stride = cfg.stage_strides[i] if j == 0 else 1
                frozen = cfg.freeze_at >= i + 2
                blocks.append(block_cls(cin, cout, stride, cfg, rngs=rngs, frozen=frozen))
                cin = cout
            stages.append(nnx.List(blocks))
        self.stages = nnx.List(stages)

    @property
    def out_channels(self) -> dict[str, int]:
        """Channels of each returned feature map."""
        return {STAGE_NAMES[i]: self.cfg.stage_channels(i) for i in range(self.cfg.num_stages)}

    def __call__(self, images: jax.Array, train: bool) -> dict[str, jax.Array]:
        x = constrain_image(images.astype(self.cfg.dtype))
        x = max_pool(self.stem(x, train), 3, 2)
        if self.cfg.freeze_at >= 1:
            x = jax.lax.stop_gradient(x)  # no backward pass through the fixed layers
        features = {}
        for i, (name, stage) in enumerate(zip(STAGE_NAMES, self.stages, strict=False)):
            for block in stage:
                x = block(x, train)
            if self.cfg.freeze_at >= i + 2:
                x = jax.lax.stop_gradient(x)
            features[name] = x
        return features
