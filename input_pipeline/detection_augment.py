"""Detection augmentation in NumPy/PIL, per host: decode, SSD random IoU crop,
horizontal flip, colour distortion, resize. Boxes are normalised (x0, y0, x1, y1);
polygons (flattened normalised x, y pairs with per-polygon sizes and owning instance, as
the COCO builder stores them) follow every geometric step so Mask R-CNN can rasterise
masks.

Images leave the host as uint8 RGB, a quarter of the bytes of float32: the ImageNet
normalisation runs on the device as the model's first step (`mlperf.layers.pixels`).
`normalise` is its host twin, for inputs to an exported program and for tests.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
from PIL import Image

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
# The SSD paper's sampling options: keep the image, or a crop whose IoU with every
# object exceeds one of these (-inf: any crop).
IOU_CHOICES = (None, 0.1, 0.3, 0.5, 0.7, 0.9, -np.inf)


@dataclasses.dataclass
class Instances:
    """An image's objects in normalised coordinates."""

    boxes: np.ndarray  # [N, 4] x0, y0, x1, y1
    labels: np.ndarray  # [N]
    poly_coords: np.ndarray  # [P*2] x, y pairs of all polygons
    poly_sizes: np.ndarray  # [Q] points per polygon
    poly_instance: np.ndarray  # [Q] owning instance per polygon

    @classmethod
    def from_record(cls, record: dict[str, np.ndarray], drop_crowd: bool = True) -> Instances:
        """The record's instances; crowd regions are not training targets."""
        inst = cls(
            np.asarray(record["boxes"], np.float32).reshape(-1, 4),
            np.asarray(record["labels"], np.int32),
            np.asarray(record["poly_coords"], np.float32),
            np.asarray(record["poly_sizes"], np.int32),
            np.asarray(record["poly_instance"], np.int32),
        )
        if drop_crowd:
            inst = inst.select(np.asarray(record["is_crowd"]) == 0)
        return inst

    def select(self, keep: np.ndarray) -> Instances:
        """The instances where keep is True, polygons included, renumbered."""
        keep = np.asarray(keep, bool)
        new_index = np.cumsum(keep) - 1
        poly_keep = keep[self.poly_instance] if len(self.poly_instance) else np.zeros(0, bool)
        point_keep = np.repeat(poly_keep, self.poly_sizes)
        coords = self.poly_coords.reshape(-1, 2)[point_keep].reshape(-1)
        return Instances(
            self.boxes[keep],
            self.labels[keep],
            coords,
            self.poly_sizes[poly_keep],
            new_index[self.poly_instance[poly_keep]].astype(np.int32),
        )

    def transform(self, scale: np.ndarray, offset: np.ndarray, flip: bool = False) -> Instances:
        """x' = (x - offset) * scale per axis (a crop), then optionally mirror x."""
        boxes = (self.boxes - np.tile(offset, 2)) * np.tile(scale, 2)
        pts = (self.poly_coords.reshape(-1, 2) - offset) * scale
        if flip:
            boxes = np.stack([1 - boxes[:, 2], boxes[:, 1], 1 - boxes[:, 0], boxes[:, 3]], 1)
            pts = np.stack([1 - pts[:, 0], pts[:, 1]], 1) if len(pts) else pts
        return Instances(
            np.clip(boxes, 0.0, 1.0).astype(np.float32),
            self.labels,
            np.clip(pts, 0.0, 1.0).reshape(-1).astype(np.float32),
            self.poly_sizes,
            self.poly_instance,
        )


def decode_image(image_bytes: np.ndarray) -> Image.Image:
    """Encoded JPEG/PNG bytes -> RGB PIL image."""
    img = Image.open(io.BytesIO(np.asarray(image_bytes, np.uint8).tobytes()))
    return img.convert("RGB")


def box_iou(boxes: np.ndarray, box: np.ndarray) -> np.ndarray:
    """IoU of each of boxes [N, 4] with one box [4]."""
    x0 = np.maximum(boxes[:, 0], box[0])
    y0 = np.maximum(boxes[:, 1], box[1])
    x1 = np.minimum(boxes[:, 2], box[2])
    y1 = np.minimum(boxes[:, 3], box[3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / (area + (box[2] - box[0]) * (box[3] - box[1]) - inter)


def random_iou_crop(
    rng: np.random.Generator, inst: Instances, trials: int = 50
) -> tuple[np.ndarray, Instances]:
    """The SSD crop: returns (crop x0, y0, x1, y1 in normalised coordinates, instances in
    the crop's coordinates). Objects whose centre leaves the crop are dropped."""
    full = np.array([0.0, 0.0, 1.0, 1.0], np.float32)
    if len(inst.boxes) == 0:
        return full, inst
    while True:
        min_iou = IOU_CHOICES[rng.integers(len(IOU_CHOICES))]
        if min_iou is None:
            return full, inst
        for _ in range(trials):
            w, h = rng.uniform(0.3, 1.0, 2)
            if not 0.5 <= w / h <= 2.0:
                continue
            left, top = rng.uniform(0, 1 - w), rng.uniform(0, 1 - h)
            crop = np.array([left, top, left + w, top + h], np.float32)
            if not np.all(box_iou(inst.boxes, crop) > min_iou):
                continue
            cx = (inst.boxes[:, 0] + inst.boxes[:, 2]) / 2
            cy = (inst.boxes[:, 1] + inst.boxes[:, 3]) / 2
            inside = (cx > crop[0]) & (cx < crop[2]) & (cy > crop[1]) & (cy < crop[3])
            if not inside.any():
                continue
            kept = inst.select(inside)
            scale = np.array([1 / w, 1 / h], np.float32)
            return crop, kept.transform(scale, crop[:2])


def photometric_distort(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The SSD paper's colour distortion on [0, 1] RGB: each of brightness (+-32/255),
    contrast and saturation (x0.5..1.5) with probability 1/2, in a random order."""
    out = pixels
    ops = rng.permutation(3)
    apply = rng.random(3) < 0.5
    amount = rng.uniform([-32 / 255, 0.5, 0.5], [32 / 255, 1.5, 1.5])
    for op in ops:
        if not apply[op]:
            continue
        if op == 0:
            out = out + amount[0]
        elif op == 1:
            out = (out - out.mean()) * amount[1] + out.mean()
        else:
            grey = out @ np.array([0.299, 0.587, 0.114], np.float32)
            out = (out - grey[..., None]) * amount[2] + grey[..., None]
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def normalise(pixels: np.ndarray, valid_hw: np.ndarray | None = None) -> np.ndarray:
    """uint8 RGB [..., H, W, 3] -> float32 scaled to [0, 1], less the ImageNet mean, over
    its std; with `valid_hw` [..., 2] (the image's rows and columns on a padded canvas) the
    rest is 0, as normalising then padding gives. The device's `normalise_images` does the
    same in the model's first step."""
    x = (np.asarray(pixels, np.float32) / np.float32(255.0) - IMAGENET_MEAN) / IMAGENET_STD
    if valid_hw is not None:
        hw = np.asarray(valid_hw)
        rows = np.arange(x.shape[-3]) < hw[..., 0, None]
        cols = np.arange(x.shape[-2]) < hw[..., 1, None]
        x = np.where((rows[..., :, None] & cols[..., None, :])[..., None], x, np.float32(0.0))
    return x


def resize_pixels(
    img: Image.Image,
    size: int,
    crop: np.ndarray | None = None,
    colour_rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Crops (normalised box) and resizes to size x size, optionally distorts the colours
    (with `colour_rng`): uint8 RGB (a distorted image rounded back to whole levels, as
    a distortion on the decoded uint8 image gives)."""
    box = None
    if crop is not None:
        w, h = img.size
        box = (crop[0] * w, crop[1] * h, crop[2] * w, crop[3] * h)
    resized = np.asarray(img.resize((size, size), Image.BILINEAR, box=box), np.uint8)
    if colour_rng is None:
        return resized
    distorted = photometric_distort(resized.astype(np.float32) / 255.0, colour_rng)
    return np.rint(distorted * 255.0).astype(np.uint8)


def ssd_train_augment(
    record: dict[str, np.ndarray], rng: np.random.Generator, size: int, colour: bool = False
) -> tuple[np.ndarray, Instances]:
    """SSD training view of a record: IoU crop, flip with p=0.5, optional colour
    distortion, resize; uint8 RGB."""
    img = decode_image(record["image_bytes"])
    crop, inst = random_iou_crop(rng, Instances.from_record(record))
    flip = bool(rng.random() < 0.5)
    # Colour draws come after the crop and flip draws, so colour=False keeps the stream.
    pixels = resize_pixels(img, size, crop, colour_rng=rng if colour else None)
    if flip:
        pixels = pixels[:, ::-1]
        inst = inst.transform(np.ones(2, np.float32), np.zeros(2, np.float32), flip=True)
    return np.ascontiguousarray(pixels), inst


def eval_view(record: dict[str, np.ndarray], size: int) -> np.ndarray:
    """The eval input: the whole image resized to size x size, uint8 RGB."""
    return resize_pixels(decode_image(record["image_bytes"]), size)
