"""The standard Mask R-CNN losses, on fixed-size sampled anchors and ROIs (fp32).

RPN: sigmoid cross-entropy on the sampled anchors and smooth-L1 on the positives. Box
head: softmax cross-entropy on the sampled ROIs and smooth-L1 on the foreground ROIs'
class-specific deltas (the ground truth class's deltas picked by a one-hot product).
Mask head: per-pixel sigmoid cross-entropy of the ground-truth class's mask on
foreground ROIs. Every loss is a sum divided by a static normaliser `norm` of the
*global* batch (sampled anchors, sampled ROIs, foreground ROI slots), so per-replica
contributions add up to the global loss and gradient accumulation is exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def smooth_l1(x: jax.Array, beta: float) -> jax.Array:
    """Huber-style smooth L1 per element (beta = 0 gives L1)."""
    ax = jnp.abs(x)
    if beta <= 0:
        return ax
    return jnp.where(ax < beta, 0.5 * ax * ax / beta, ax - 0.5 * beta)


def rpn_losses(
    scores: jax.Array, deltas: jax.Array, targets: dict[str, jax.Array], norm: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """scores [B, A] logits, deltas [B, A, 4] against rpn_targets -> (objectness, box)."""
    ce = optax.sigmoid_binary_cross_entropy(scores, targets["labels"])
    obj = jnp.sum(ce * targets["weights"]) / norm
    reg = smooth_l1(deltas - targets["box_targets"], 1.0 / 9.0).sum(-1)
    box = jnp.sum(reg * targets["box_weights"]) / norm
    return obj, box


def box_head_losses(
    logits: jax.Array,
    deltas: jax.Array,
    classes: jax.Array,
    box_targets: jax.Array,
    fg: jax.Array,
    valid: jax.Array,
    norm: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """logits [B, R, K+1], deltas [B, R, K+1, 4] -> (class loss, box loss, accuracy)."""
    w = valid.astype(jnp.float32)
    onehot = jax.nn.one_hot(classes, logits.shape[-1], dtype=jnp.float32)
    ce = optax.softmax_cross_entropy(logits, onehot)
    cls_loss = jnp.sum(ce * w) / norm
    picked = jnp.einsum("brk,brkd->brd", onehot, deltas)  # the GT class's deltas
    reg = smooth_l1(picked - box_targets, 1.0).sum(-1)
    box_loss = jnp.sum(reg * fg.astype(jnp.float32)) / norm
    accuracy = jnp.sum((jnp.argmax(logits, -1) == classes) * w) / norm
    return cls_loss, box_loss, accuracy


def mask_loss(
    logits: jax.Array, classes: jax.Array, targets: jax.Array, fg: jax.Array, norm: jax.Array
) -> jax.Array:
    """logits [B, R, M, M, K+1], targets [B, R, M, M] -> mean BCE over foreground pixels."""
    onehot = jax.nn.one_hot(classes, logits.shape[-1], dtype=logits.dtype)
    picked = jnp.einsum("brk,brhwk->brhw", onehot, logits)
    ce = optax.sigmoid_binary_cross_entropy(picked, targets).mean(axis=(-2, -1))
    return jnp.sum(ce * fg.astype(jnp.float32)) / norm
