"""Mask R-CNN heads on logical axes: FPN (P2..P6), RPN head, box head, mask head.

Convolutions come from mlperf/layers/conv.py, so every feature map is placed by its
logical axes (`batch`, `height`, `width`, `channels`) and spatial partitioning applies
to the FPN and RPN exactly as to the backbone. The heads that run on ROI crops treat
(image, ROI) pairs as the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.layers.conv import Conv, constrain_image
from mlperf.layers.linear import DenseGeneral, logical_param
from parallel.partition import constrain

HEAD_INIT = nnx.initializers.normal(stddev=0.01)


def upsample2x(x: jax.Array) -> jax.Array:
    """Nearest-neighbour 2x upsampling by broadcast + reshape (no gather)."""
    b, h, w, c = x.shape
    y = jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, c))
    return constrain_image(y.reshape(b, 2 * h, 2 * w, c))


class Fpn(nnx.Module):
    """Feature pyramid: 1x1 laterals on C2..C5, top-down sum, 3x3 outputs P2..P5, and P6
    as a stride-2 subsample of P5 (the Mask R-CNN recipe)."""

    def __init__(self, in_channels: dict[str, int], dim: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.names = tuple(sorted(in_channels))  # C2..C5
        self.lateral = nnx.List(
            [
                Conv(in_channels[n], dim, 1, rngs=rngs, use_bias=True, dtype=dtype)
                for n in self.names
            ]
        )
        self.output = nnx.List(
            [Conv(dim, dim, 3, rngs=rngs, use_bias=True, dtype=dtype) for _ in self.names]
        )

    def __call__(self, feats: dict[str, jax.Array]) -> list[jax.Array]:
        lat = [conv(feats[n]) for conv, n in zip(self.lateral, self.names, strict=True)]
        top = lat[-1]
        merged = [top]
        for x in reversed(lat[:-1]):
            top = x + upsample2x(top)
            merged.insert(0, top)
        outs = [conv(x) for conv, x in zip(self.output, merged, strict=True)]
        outs.append(constrain_image(outs[-1][:, ::2, ::2, :]))
        return outs


class RpnHead(nnx.Module):
    """Shared 3x3 conv + ReLU, then per-anchor objectness logits and box deltas."""

    def __init__(self, dim: int, num_anchors: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        kw = dict(rngs=rngs, use_bias=True, dtype=dtype, kernel_init=HEAD_INIT)
        self.conv = Conv(dim, dim, 3, **kw)
        self.scores = Conv(dim, num_anchors, 1, **kw)
        self.deltas = Conv(dim, 4 * num_anchors, 1, **kw)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """x [B, H, W, D] -> scores [B, H*W*A], deltas [B, H*W*A, 4] (fp32)."""
        h = jax.nn.relu(self.conv(x))
        b = x.shape[0]
        scores = self.scores(h).astype(jnp.float32).reshape(b, -1)
        deltas = self.deltas(h).astype(jnp.float32).reshape(b, -1, 4)
        return scores, deltas


class BoxHead(nnx.Module):
    """Two fully connected layers on flattened ROI crops, then class logits (K + 1 with
    background) and class-specific box deltas."""

    def __init__(
        self,
        roi_size: int,
        dim: int,
        fc_dim: int,
        num_classes: int,
        *,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
    ):
        self.num_classes = num_classes
        flat = roi_size * roi_size * dim
        self.fc1 = DenseGeneral((flat,), (fc_dim,), ("embed", "mlp"), rngs=rngs, dtype=dtype)
        self.fc2 = DenseGeneral((fc_dim,), (fc_dim,), ("embed", "mlp"), rngs=rngs, dtype=dtype)
        self.cls = DenseGeneral(
            (fc_dim,),
            (num_classes + 1,),
            ("mlp", "classes"),
            rngs=rngs,
            dtype=dtype,
            kernel_init=HEAD_INIT,
        )
        self.box = DenseGeneral(
            (fc_dim,),
            (num_classes + 1, 4),
            ("mlp", "classes", None),
            rngs=rngs,
            dtype=dtype,
            kernel_init=nnx.initializers.normal(stddev=0.001),
        )

    def __call__(self, crops: jax.Array) -> tuple[jax.Array, jax.Array]:
        """crops [B, R, S, S, D] -> logits [B, R, K+1], deltas [B, R, K+1, 4] (fp32)."""
        b, r = crops.shape[:2]
        x = constrain(crops.reshape(b, r, -1), ("batch", None, None))
        x = jax.nn.relu(self.fc1(x))
        x = jax.nn.relu(self.fc2(x))
        return self.cls(x).astype(jnp.float32), self.box(x).astype(jnp.float32)


class ConvTranspose2x(nnx.Module):
    """2x2 stride-2 transposed convolution (each input pixel paints a 2x2 block)."""

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        init = nnx.initializers.variance_scaling(2.0, "fan_out", "normal")
        self.kernel = logical_param(
            rngs, init, (2, 2, cin, cout), ("kernel_h", "kernel_w", "conv_in", "conv_out")
        )
        self.bias = logical_param(rngs, nnx.initializers.zeros, (cout,), ("channels",))
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        # Stride 2 with a 2x2 kernel: the output blocks do not overlap, so this is an
        # einsum into a [2, 2] sub-pixel grid and a reshape.
        b, h, w, _ = x.shape
        k = self.kernel[...].astype(self.dtype)
        y = jnp.einsum("bhwc,ijcd->bhiwjd", x.astype(self.dtype), k)
        y = y.reshape(b, 2 * h, 2 * w, k.shape[-1]) + self.bias[...].astype(self.dtype)
        return constrain_image(y)


class MaskHead(nnx.Module):
    """Four 3x3 convs + ReLU, a 2x upsampling deconv, and per-class mask logits."""

    def __init__(
        self, dim: int, num_classes: int, *, rngs: nnx.Rngs, num_convs: int = 4, dtype=jnp.float32
    ):
        self.convs = nnx.List(
            [Conv(dim, dim, 3, rngs=rngs, use_bias=True, dtype=dtype) for _ in range(num_convs)]
        )
        self.deconv = ConvTranspose2x(dim, dim, rngs=rngs, dtype=dtype)
        self.logits = Conv(dim, num_classes + 1, 1, rngs=rngs, use_bias=True, dtype=dtype)

    def __call__(self, crops: jax.Array) -> jax.Array:
        """crops [B, R, S, S, D] -> mask logits [B, R, 2S, 2S, K+1] (fp32)."""
        b, r, s, _, d = crops.shape
        x = crops.reshape(b * r, s, s, d)
        for conv in self.convs:
            x = jax.nn.relu(conv(x))
        x = jax.nn.relu(self.deconv(x))
        y = self.logits(x).astype(jnp.float32)
        return y.reshape(b, r, 2 * s, 2 * s, -1)
