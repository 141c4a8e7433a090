"""Mask R-CNN input: COCO-format records -> fixed-shape batches, per host, with grain.

Augmentation (the Mask R-CNN recipe): resize so the longer side is `image_size`
(aspect kept), pad bottom/right to `image_size` x `image_size`, random horizontal flip
in training, and optional scale jitter (the longer side resized to `image_size` times a
random factor, then a random `image_size` crop where it overflows). Instance polygons
are rasterised straight into an M x M grid spanning each instance's box (the "cropped
ground-truth mask" of the TPU implementation), so a sample carries `max_instances`
small masks instead of full-image ones.

Bad instances are skipped and counted, never fatal: no polygon with 3 or more points,
a mask that is empty inside the image (polygon outside it), or a box under one pixel
after resizing. Each is named in the log once per record and reason.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import grain.python as grain
import numpy as np
from absl import logging
from PIL import Image, ImageDraw

from input_pipeline.detection_augment import Instances, decode_image
from input_pipeline.grain_pipeline import GlobalOrderHostRows, ToNumpy, image_read_options
from input_pipeline.input_errors import InputError


@dataclasses.dataclass(frozen=True)
class MaskRcnnInput:
    """Shapes of one example."""

    image_size: int = 128  # padded square side; the longer image side is resized to it
    max_instances: int = 8
    mask_size: int = 32  # M: rasterised mask crop per instance
    # Training scale jitter: the resize factor is drawn from [min, max] (1, 1: none).
    scale_range: tuple[float, float] = (1.0, 1.0)


class SkipCounter:
    """Thread-safe counts of skipped instances by reason (grain may use threads); each
    (image, reason) pair is named in the log the first time it occurs."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self._named: set[tuple[int, str]] = set()

    def add(self, image_id: int, reason: str) -> None:
        with self._lock:
            self.counts[reason] += 1
            first = (image_id, reason) not in self._named
            self._named.add((image_id, reason))
        if first:
            logging.warning(
                "Mask R-CNN input: skipping an instance of image %d: %s (%d skipped so far "
                "for this reason)",
                image_id,
                reason,
                self.counts[reason],
            )


SKIPPED = SkipCounter()


def example_spec(p: MaskRcnnInput, train: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (per-example shape, dtype) of a batch."""
    s, g, m = p.image_size, p.max_instances, p.mask_size
    spec = {
        "image": ((s, s, 3), "uint8"),
        "image_hw": ((2,), "int32"),
        "gt_boxes": ((g, 4), "float32"),
        "gt_classes": ((g,), "int32"),
        "gt_masks": ((g, m, m), "uint8"),
    }
    if not train:
        spec.update(image_id=((), "int32"), scale=((), "float32"))
    return spec


def rasterise_crop(polygons: Sequence[np.ndarray], box: np.ndarray, size: int) -> np.ndarray:
    """Polygons [N_i, 2] (x, y image pixels) filled into a size x size grid over box
    [y1, x1, y2, x2]: the instance's mask crop, uint8 0/1."""
    y1, x1, y2, x2 = box
    sy, sx = size / max(y2 - y1, 1e-6), size / max(x2 - x1, 1e-6)
    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    for poly in polygons:
        pts = [((x - x1) * sx, (y - y1) * sy) for x, y in poly]
        draw.polygon(pts, fill=1, outline=1)
    return np.asarray(canvas, np.uint8)


def _polygons_of(inst: Instances, i: int, width: float, height: float) -> list[np.ndarray]:
    """Instance i's polygons in pixels (drops polygons with fewer than 3 points)."""
    pts = inst.poly_coords.reshape(-1, 2) * np.array([width, height], np.float32)
    starts = np.concatenate([[0], np.cumsum(inst.poly_sizes)])
    return [
        pts[starts[q] : starts[q + 1]]
        for q in range(len(inst.poly_sizes))
        if inst.poly_instance[q] == i and inst.poly_sizes[q] >= 3
    ]


def _mask_inside_image(polygons, width: float, height: float) -> bool:
    """Whether the polygons cover any pixel of the image (cheap full-image raster)."""
    canvas = Image.new("L", (max(int(round(width)), 1), max(int(round(height)), 1)), 0)
    draw = ImageDraw.Draw(canvas)
    for poly in polygons:
        draw.polygon([(float(x), float(y)) for x, y in poly], fill=1, outline=1)
    return bool(np.asarray(canvas).any())


def make_example(
    record: dict[str, Any],
    p: MaskRcnnInput,
    flip: bool,
    train: bool,
    jitter: float = 1.0,
    crop_at: tuple[float, float] = (0.0, 0.0),
) -> dict[str, np.ndarray]:
    """One fixed-shape example from a COCO builder record.

    `jitter` multiplies the resize scale; where the resized image overflows the
    `image_size` canvas, the crop starts at `crop_at` (fractions of the overflow, x, y).
    Polygons are rasterised unclipped over their clipped boxes, so a crop cuts masks
    exactly.
    """
    img = decode_image(record["image_bytes"])
    w0, h0 = img.size
    scale = p.image_size / max(w0, h0) * jitter
    w, h = max(int(round(w0 * scale)), 1), max(int(round(h0 * scale)), 1)
    cw, ch = min(w, p.image_size), min(h, p.image_size)  # the kept window
    ox, oy = int(round(crop_at[0] * (w - cw))), int(round(crop_at[1] * (h - ch)))
    resized = img.resize((w, h), Image.BILINEAR).crop((ox, oy, ox + cw, oy + ch))
    pixels = np.asarray(resized, np.uint8)
    inst = Instances.from_record(record)
    if flip:
        pixels = pixels[:, ::-1]
        inst = inst.transform(np.ones(2, np.float32), np.zeros(2, np.float32), flip=True)
        ox = w - cw - ox  # the window mirrors with the image
    # uint8 on a zero canvas; `image_hw` tells the device's normalisation where the image
    # ends, so the padding is 0 after it (as normalising then padding gives).
    image = np.zeros((p.image_size, p.image_size, 3), np.uint8)
    image[:ch, :cw] = pixels
    g, m = p.max_instances, p.mask_size
    boxes = np.zeros((g, 4), np.float32)
    classes = np.zeros((g,), np.int32)
    masks = np.zeros((g, m, m), np.uint8)
    image_id = int(record["image_id"])
    offset = np.array([ox, oy], np.float32)
    n = 0
    for i in range(len(inst.boxes)):
        x0, y0, x1, y1 = inst.boxes[i] * np.array([w, h, w, h], np.float32)
        x0, x1 = np.clip([x0 - ox, x1 - ox], 0.0, cw)
        y0, y1 = np.clip([y0 - oy, y1 - oy], 0.0, ch)
        if x1 - x0 < 1.0 or y1 - y0 < 1.0:
            if jitter == 1.0:  # with jitter, mostly an object the random crop cut away
                SKIPPED.add(image_id, "box under one pixel after resizing")
            continue
        polys = [q - offset for q in _polygons_of(inst, i, w, h)]
        if not polys:
            SKIPPED.add(image_id, "no polygon with 3 or more points")
            continue
        if not _mask_inside_image(polys, cw, ch):
            if jitter == 1.0:
                SKIPPED.add(image_id, "mask outside the image")
            continue
        if n == g:
            SKIPPED.add(image_id, f"more than max_instances={g} instances")
            break
        boxes[n] = (y0, x0, y1, x1)
        classes[n] = inst.labels[i]
        masks[n] = rasterise_crop(polys, boxes[n], m)
        n += 1
    out = {
        "image": image,
        "image_hw": np.array([ch, cw], np.int32),
        "gt_boxes": boxes,
        "gt_classes": classes,
        "gt_masks": masks,
    }
    if not train:
        out["image_id"] = np.int32(image_id)
        out["scale"] = np.float32(scale)
    return out


class TrainAugment(grain.RandomMapTransform):
    """Random flip, scale jitter and crop + resize/pad + mask rasterisation of a record."""

    def __init__(self, p: MaskRcnnInput, flip: bool = True):
        self.p, self.flip = p, flip

    def random_map(self, element, rng: np.random.Generator):
        flip = self.flip and bool(rng.random() < 0.5)
        lo, hi = self.p.scale_range
        jitter = float(rng.uniform(lo, hi)) if hi > lo else 1.0
        crop_at = (float(rng.random()), float(rng.random()))
        return make_example(element, self.p, flip=flip, train=True, jitter=jitter, crop_at=crop_at)


def train_loader(
    source: Sequence[Any],
    p: MaskRcnnInput,
    host_batch_size: int,
    seed: int,
    shard_index: int,
    shard_count: int,
    worker_count: int = 0,
) -> grain.DataLoader:
    """Endless per-host loader of augmented batches (global batch order as in
    input_pipeline/grain_pipeline.py: the same data whatever the host count)."""
    if len(source) == 0:
        raise InputError("the Mask R-CNN training set is empty: check data.data_dir.")
    rows = GlobalOrderHostRows(source, host_batch_size, shard_index, shard_count, seed)
    sampler = grain.IndexSampler(
        num_records=len(rows),
        shard_options=grain.NoSharding(),
        shuffle=False,
        num_epochs=1,
        seed=seed,
    )
    dtypes = {k: d for k, (_, d) in example_spec(p, train=True).items()}
    return grain.DataLoader(
        data_source=rows,
        sampler=sampler,
        operations=[TrainAugment(p), ToNumpy(dtypes), grain.Batch(host_batch_size, True)],
        worker_count=worker_count,
        read_options=image_read_options(host_batch_size),
    )


class EvalExamples(Sequence):
    """The eval split as fixed-shape examples (no augmentation), built on access."""

    def __init__(self, source: Sequence[Any], p: MaskRcnnInput):
        self.source, self.p = source, p

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i):
        return make_example(self.source[i], self.p, flip=False, train=False)
