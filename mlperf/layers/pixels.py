"""The detection models' first step: the loaders' uint8 RGB images made model input on
the device (ImageNet normalisation), so a host sends a quarter of float32's bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from input_pipeline.detection_augment import IMAGENET_MEAN, IMAGENET_STD


def normalise_images(images: jax.Array, valid_hw: jax.Array | None = None) -> jax.Array:
    """uint8 RGB [B, H, W, 3] -> float32 scaled to [0, 1], less the ImageNet mean, over its
    std (the host's `input_pipeline.detection_augment.normalise`, op for op). With
    `valid_hw` [B, 2] (each image's rows and columns on a padded canvas) the rest is 0, as
    normalising then padding gives.

    Floating images are taken as already normalised and returned as they are: an exported
    program's input, or a caller's own preprocessing. Any other dtype is refused.
    """
    if jnp.issubdtype(images.dtype, jnp.floating):
        return images
    if images.dtype != jnp.uint8:
        raise TypeError(
            f"detection images must be uint8 RGB (normalised on the device) or floating "
            f"(already normalised); got {images.dtype}"
        )
    mean = jnp.asarray(IMAGENET_MEAN, jnp.float32)
    std = jnp.asarray(IMAGENET_STD, jnp.float32)
    x = (images.astype(jnp.float32) / jnp.float32(255.0) - mean) / std
    if valid_hw is None:
        return x
    _, h, w, _ = images.shape
    rows = jnp.arange(h)[None, :] < valid_hw[:, 0:1]  # [B, H]
    cols = jnp.arange(w)[None, :] < valid_hw[:, 1:2]  # [B, W]
    inside = rows[:, :, None, None] & cols[:, None, :, None]
    return jnp.where(inside, x, jnp.float32(0.0))
