"""Detection images leave the host as uint8 and are normalised on the device: the model
sees what the host's float32 normalisation gave it, padding included, at a quarter of
the bytes."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from input_pipeline.detection_augment import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    eval_view,
    normalise,
)
from input_pipeline.maskrcnn_data import MaskRcnnInput, example_spec, make_example
from mlperf.layers.pixels import normalise_images


def _png(width: int, height: int, seed: int = 0) -> np.ndarray:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return np.frombuffer(buf.getvalue(), np.uint8)


def _float_reference(img: Image.Image) -> np.ndarray:
    """The float32 host normalisation the loaders did before images went as uint8."""
    return (np.asarray(img, np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD


def test_the_device_normalises_as_the_host_does_inside_each_images_extent():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 16, 12, 3), np.uint8)
    valid_hw = np.array([[16, 12], [9, 12], [5, 7]], np.int32)
    host = normalise(images, valid_hw)
    device = np.asarray(jax.jit(normalise_images)(jnp.asarray(images), jnp.asarray(valid_hw)))
    np.testing.assert_allclose(device, host, rtol=0, atol=1e-6)
    assert not device[1, 9:].any() and not device[2, :, 7:].any()
    np.testing.assert_allclose(device[2, :5, :7], normalise(images[2])[:5, :7], atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(normalise_images(jnp.asarray(images))), normalise(images), atol=1e-6
    )


def test_float_images_pass_as_normalised_and_other_dtypes_are_refused():
    x = jnp.linspace(-2.0, 2.0, 2 * 4 * 4 * 3).reshape(2, 4, 4, 3)
    assert normalise_images(x) is x  # an exported program's float input is used as given
    with pytest.raises(TypeError, match="uint8 RGB"):
        normalise_images(jnp.zeros((1, 4, 4, 3), jnp.int16))


def test_the_ssd_eval_view_normalised_equals_the_float_host_path():
    record = {"image_bytes": _png(40, 30)}
    view = eval_view(record, 24)
    assert view.dtype == np.uint8 and view.shape == (24, 24, 3)
    img = Image.open(io.BytesIO(record["image_bytes"].tobytes())).convert("RGB")
    reference = _float_reference(img.resize((24, 24), Image.BILINEAR))
    np.testing.assert_allclose(normalise(view), reference, atol=1e-6)


def test_the_maskrcnn_example_normalised_equals_normalise_then_pad():
    p = MaskRcnnInput(image_size=32, max_instances=2, mask_size=4)
    record = {
        "image_bytes": _png(40, 20, seed=1),
        "image_id": 3,
        "height": 20,
        "width": 40,
        "boxes": np.zeros((0, 4), np.float32),
        "labels": np.zeros((0,), np.int32),
        "is_crowd": np.zeros((0,), np.int32),
        "poly_coords": np.zeros((0,), np.float32),
        "poly_sizes": np.zeros((0,), np.int32),
        "poly_instance": np.zeros((0,), np.int32),
    }
    for flip in (False, True):
        ex = make_example(record, p, flip=flip, train=False)
        img = Image.open(io.BytesIO(record["image_bytes"].tobytes())).convert("RGB")
        resized = _float_reference(img.resize((32, 16), Image.BILINEAR))
        reference = np.zeros((32, 32, 3), np.float32)  # normalised, then zero-padded
        reference[:16] = resized[:, ::-1] if flip else resized
        got = jax.jit(normalise_images)(ex["image"][None], ex["image_hw"][None])[0]
        np.testing.assert_allclose(np.asarray(got), reference, atol=1e-6)


def test_the_maskrcnn_spec_sends_uint8_images_with_their_extent():
    spec = example_spec(MaskRcnnInput(image_size=64), train=True)
    assert spec["image"] == ((64, 64, 3), "uint8")
    assert spec["image_hw"] == ((2,), "int32")
