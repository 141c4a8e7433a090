"""Mask R-CNN input: resize/pad/flip, polygon rasterisation, bad instances skipped and
counted, fixed-shape batches from the per-host grain loader."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from input_pipeline import maskrcnn_data
from input_pipeline.maskrcnn_data import MaskRcnnInput, example_spec, make_example, rasterise_crop


def _png(width: int, height: int) -> np.ndarray:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buf, format="PNG")
    return np.frombuffer(buf.getvalue(), np.uint8)


def _record(polys: list[list[tuple[float, float]]], boxes, labels, width=80, height=40):
    """A COCO builder record (normalised boxes and polygons) for an 80x40 image."""
    coords, sizes, owner = [], [], []
    for i, poly in enumerate(polys):
        for x, y in poly:
            coords += [x / width, y / height]
        sizes.append(len(poly))
        owner.append(i)
    return {
        "image_bytes": _png(width, height),
        "image_id": 7,
        "height": height,
        "width": width,
        "boxes": np.asarray(boxes, np.float32) / [width, height, width, height],
        "labels": np.asarray(labels, np.int32),
        "is_crowd": np.zeros(len(labels), np.int32),
        "poly_coords": np.asarray(coords, np.float32),
        "poly_sizes": np.asarray(sizes, np.int32),
        "poly_instance": np.asarray(owner, np.int32),
    }


GOOD = [(10, 10), (30, 10), (30, 20), (10, 20)]  # a 20x10 rectangle, box x 10..30, y 10..20


def test_resize_pad_boxes_and_masks():
    p = MaskRcnnInput(image_size=64, max_instances=4, mask_size=8)
    ex = make_example(_record([GOOD], [[10, 10, 30, 20]], [2]), p, flip=False, train=False)
    assert ex["image"].shape == (64, 64, 3)
    # 80x40 -> 64x32 (scale 0.8), padded below with zeros; uint8, normalised on the
    # device inside image_hw.
    assert ex["image"].dtype == np.uint8 and ex["image_hw"].tolist() == [32, 64]
    assert ex["image"][:32].astype(int).sum() > 0 and not ex["image"][32:].any()
    np.testing.assert_allclose(ex["gt_boxes"][0], [8, 8, 16, 24])  # y1, x1, y2, x2
    assert ex["gt_classes"].tolist() == [2, 0, 0, 0]
    assert ex["gt_masks"][0].all() and not ex["gt_masks"][1:].any()
    assert float(ex["scale"]) == pytest.approx(0.8) and int(ex["image_id"]) == 7


def test_flip_mirrors_boxes():
    p = MaskRcnnInput(image_size=64, max_instances=2, mask_size=8)
    ex = make_example(_record([GOOD], [[10, 10, 30, 20]], [1]), p, flip=True, train=True)
    np.testing.assert_allclose(ex["gt_boxes"][0], [8, 64 - 24, 16, 64 - 8])
    assert set(ex) == set(example_spec(p, train=True))


def test_bad_instances_are_skipped_and_counted(caplog):
    before = dict(maskrcnn_data.SKIPPED.counts)
    p = MaskRcnnInput(image_size=64, max_instances=4, mask_size=8)
    two_points = [(40, 5), (60, 30)]
    outside = [(100, 50), (120, 50), (120, 60)]  # polygon beyond the 80x40 image
    record = _record(
        [GOOD, two_points, outside],
        [[10, 10, 30, 20], [40, 5, 60, 30], [50, 30, 70, 39]],
        [1, 2, 3],
    )
    record["image_id"] = 4242  # an id no other test uses: its first skip is logged
    ex = make_example(record, p, flip=False, train=True)
    assert ex["gt_classes"].tolist() == [1, 0, 0, 0]  # only the good instance is kept
    after = maskrcnn_data.SKIPPED.counts
    assert (
        after["no polygon with 3 or more points"]
        == before.get("no polygon with 3 or more points", 0) + 1
    )
    assert after["mask outside the image"] == before.get("mask outside the image", 0) + 1
    # Each bad instance is named with its image and reason.
    logged = " ".join(r.getMessage() for r in caplog.records)
    for reason in ("no polygon with 3 or more points", "mask outside the image"):
        assert f"image 4242: {reason}" in logged


def test_rasterise_crop_of_a_triangle():
    crop = rasterise_crop([np.asarray([(0.0, 0.0), (16.0, 16.0), (0.0, 16.0)])], [0, 0, 16, 16], 16)
    # Lower-left triangle: about half the cells, the corner cells decided.
    assert crop[15, 0] == 1 and crop[0, 15] == 0
    assert 100 <= int(crop.sum()) <= 160


def test_train_loader_batches_have_the_example_spec():
    p = MaskRcnnInput(image_size=64, max_instances=3, mask_size=8)
    records = [_record([GOOD], [[10, 10, 30, 20]], [1 + i % 3]) for i in range(6)]
    loader = maskrcnn_data.train_loader(records, p, 2, seed=0, shard_index=1, shard_count=2)
    batch = next(iter(loader))
    for name, (shape, dtype) in example_spec(p, train=True).items():
        assert batch[name].shape == (2, *shape) and batch[name].dtype == np.dtype(dtype), name
    assert (batch["gt_classes"][:, 0] > 0).all()
    # Augmented images are large: the loader reads a few batches ahead, not grain's
    # default 500 elements (11 GB of 1344 x 1344 float32 images).
    assert loader._read_options.prefetch_buffer_size == 16


def test_empty_training_set_is_a_clear_error():
    with pytest.raises(ValueError, match="training set is empty"):
        maskrcnn_data.train_loader([], MaskRcnnInput(), 2, 0, 0, 1)


def test_scale_jitter_crops_boxes_and_masks_exactly():
    # Jitter 2: 80x40 -> 128x64 (scale 1.6); crop_at x=1 keeps the window x 64..128.
    p = MaskRcnnInput(image_size=64, max_instances=2, mask_size=8)
    right = [(60, 10), (75, 10), (75, 30), (60, 30)]  # x 96..120, y 16..48 at scale 1.6
    record = _record([GOOD, right], [[10, 10, 30, 20], [60, 10, 75, 30]], [1, 2])
    ex = make_example(record, p, flip=False, train=True, jitter=2.0, crop_at=(1.0, 0.0))
    # GOOD (x 16..48) lies left of the window and is dropped; `right` moves by -64.
    assert ex["gt_classes"].tolist() == [2, 0]
    np.testing.assert_allclose(ex["gt_boxes"][0], [16, 32, 48, 56])
    assert ex["gt_masks"][0].all()
    # Flipped, the same draw keeps the mirrored window x 0..64: `right` is at x 8..32.
    flipped = make_example(record, p, flip=True, train=True, jitter=2.0, crop_at=(1.0, 0.0))
    assert flipped["gt_classes"].tolist() == [2, 0]
    np.testing.assert_allclose(flipped["gt_boxes"][0], [16, 8, 48, 32])
    # A box cut by the window edge keeps the part inside; its mask still fills the box.
    half = _record([[(30, 10), (50, 10), (50, 20), (30, 20)]], [[30, 10, 50, 20]], [3])
    cut = make_example(half, p, flip=False, train=True, jitter=2.0, crop_at=(1.0, 0.0))
    np.testing.assert_allclose(cut["gt_boxes"][0], [16, 0, 32, 16])  # x 48..80 - 64, clipped
    assert cut["gt_masks"][0].all()
