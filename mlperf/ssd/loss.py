"""The SSD loss: smooth-L1 on matched boxes plus softmax cross-entropy with hard
negative mining at 3:1, against one-hot labels (no gather), per image normalised by
its number of positives (the MLPerf reference's definition)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_POS_RATIO = 3


def smooth_l1(x: jax.Array) -> jax.Array:
    """Huber loss with beta 1 (PyTorch's SmoothL1Loss default)."""
    ax = jnp.abs(x)
    return jnp.where(ax < 1.0, 0.5 * x * x, ax - 0.5)


def hard_negative_mask(
    neg_loss: jax.Array, positives: jax.Array, ratio: int = NEG_POS_RATIO
) -> jax.Array:
    """Per image, the `ratio x positives` background boxes with the largest loss.

    neg_loss [B, A] (positives' entries are ignored), positives [B, A] bool -> [B, A] bool.
    The rank of each box is its position in a descending sort (argsort of argsort).
    """
    loss = jnp.where(positives, -jnp.inf, neg_loss)
    rank = jnp.argsort(jnp.argsort(-loss, axis=1), axis=1)
    num_neg = jnp.minimum(ratio * positives.sum(axis=1, keepdims=True), loss.shape[1])
    return (rank < num_neg) & ~positives


def ssd_loss_per_image(
    pred_offsets: jax.Array,
    pred_logits: jax.Array,
    target_offsets: jax.Array,
    target_labels: jax.Array,
) -> dict[str, jax.Array]:
    """Per-image losses [B]: total, box (smooth-L1), class (cross-entropy), positives."""
    num_classes = pred_logits.shape[-1]
    positives = target_labels > 0
    num_pos = positives.sum(axis=1).astype(jnp.float32)
    box = jnp.sum(smooth_l1(pred_offsets - target_offsets).sum(-1) * positives, axis=1)
    log_probs = jax.nn.log_softmax(pred_logits.astype(jnp.float32), axis=-1)
    xent = -jnp.sum(log_probs * jax.nn.one_hot(target_labels, num_classes), axis=-1)  # [B, A]
    negatives = hard_negative_mask(jax.lax.stop_gradient(xent), positives)
    cls = jnp.sum(xent * (positives | negatives), axis=1)
    # Images without objects contribute nothing (the reference's num_mask).
    scale = jnp.where(num_pos > 0, 1.0 / jnp.maximum(num_pos, 1e-6), 0.0)
    return {"total": (box + cls) * scale, "box": box * scale, "cls": cls * scale, "pos": num_pos}
