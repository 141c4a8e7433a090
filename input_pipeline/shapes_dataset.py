"""A procedural detection and instance-segmentation data set in COCO format ("shapes").

Coloured rectangles, ellipses and triangles on textured backgrounds, each with its box
and its polygon, written as a COCO folder (PNG images + instances JSON) that the COCO
builder (input_pipeline/coco_builder.py) reads like any other. Deterministic by seed:
the same parameters give byte-identical files. It is the embedded default of the SSD
and Mask R-CNN configs, so nothing needs a download.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os

import numpy as np
from PIL import Image, ImageDraw

from input_pipeline.file_lock import file_lock

CATEGORIES = (
    {"id": 1, "name": "rectangle", "supercategory": "shape"},
    {"id": 2, "name": "ellipse", "supercategory": "shape"},
    {"id": 3, "name": "triangle", "supercategory": "shape"},
)
_ELLIPSE_POINTS = 24


@dataclasses.dataclass(frozen=True)
class ShapesParams:
    """What the generated set looks like; its hash names the cached folder."""

    num_images: int = 512
    image_size: int = 128
    min_shapes: int = 1
    max_shapes: int = 4
    min_extent: float = 0.15  # shape side as a fraction of the image side
    max_extent: float = 0.5
    seed: int = 0

    def fingerprint(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A textured background: a colour gradient, stripes of random orientation, noise."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    c0, c1 = rng.uniform(40, 215, 3), rng.uniform(40, 215, 3)
    t = rng.uniform(0, 1)
    grad = (t * xx + (1 - t) * yy)[..., None]
    img = c0 * (1 - grad) + c1 * grad
    angle, freq = rng.uniform(0, math.pi), rng.uniform(4, 14)
    stripes = np.sin(2 * math.pi * freq * (xx * math.cos(angle) + yy * math.sin(angle)))
    img += 18.0 * stripes[..., None]
    img += rng.normal(0, 10.0, img.shape)
    return np.clip(img, 0, 255)


def _polygon(rng: np.random.Generator, kind: int, x0: float, y0: float, w: float, h: float):
    """Vertices (x, y) of one shape inside the box (x0, y0, w, h)."""
    if kind == 1:
        return [(x0, y0), (x0 + w, y0), (x0 + w, y0 + h), (x0, y0 + h)]
    if kind == 2:
        cx, cy = x0 + w / 2, y0 + h / 2
        angles = np.linspace(0, 2 * math.pi, _ELLIPSE_POINTS, endpoint=False)
        return [(cx + w / 2 * math.cos(a), cy + h / 2 * math.sin(a)) for a in angles]
    # Triangle: apex somewhere on the top edge, base on the bottom edge.
    apex = x0 + rng.uniform(0.2, 0.8) * w
    return [(apex, y0), (x0 + w, y0 + h), (x0, y0 + h)]


def _area(points) -> float:
    """Shoelace area of a polygon."""
    xs = np.array([p[0] for p in points])
    ys = np.array([p[1] for p in points])
    return float(abs(np.dot(xs, np.roll(ys, -1)) - np.dot(ys, np.roll(xs, -1))) / 2)


def _overlaps(box, boxes, margin: float) -> bool:
    x0, y0, w, h = box
    for bx, by, bw, bh in boxes:
        x_hit = x0 < bx + bw + margin and bx < x0 + w + margin
        if x_hit and y0 < by + bh + margin and by < y0 + h + margin:
            return True
    return False


def generate_image(rng: np.random.Generator, p: ShapesParams):
    """One image (uint8 HxWx3) and its annotations [(category_id, polygon)]."""
    size = p.image_size
    img = Image.fromarray(_background(rng, size).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    boxes, anns = [], []
    target = int(rng.integers(p.min_shapes, p.max_shapes + 1))
    for _ in range(50 * target):  # rejection sampling: shapes never overlap
        if len(anns) == target:
            break
        w = rng.uniform(p.min_extent, p.max_extent) * size
        h = rng.uniform(p.min_extent, p.max_extent) * size
        x0, y0 = rng.uniform(0, size - w), rng.uniform(0, size - h)
        if _overlaps((x0, y0, w, h), boxes, margin=2.0):
            continue
        kind = int(rng.integers(1, 4))
        poly = [(round(x, 2), round(y, 2)) for x, y in _polygon(rng, kind, x0, y0, w, h)]
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        draw.polygon(poly, fill=colour, outline=(0, 0, 0))
        boxes.append((x0, y0, w, h))
        anns.append((kind, poly))
    return np.asarray(img), anns


def write_shapes_coco(out_dir: str, p: ShapesParams) -> str:
    """Writes images/ and annotations/instances.json under out_dir; returns the JSON path."""
    rng = np.random.default_rng(p.seed)
    os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
    images, annotations = [], []
    for i in range(p.num_images):
        pixels, anns = generate_image(rng, p)
        name = f"shapes_{i:06d}.png"
        Image.fromarray(pixels).save(os.path.join(out_dir, "images", name))
        images.append(
            {"id": i + 1, "file_name": name, "width": p.image_size, "height": p.image_size}
        )
        for kind, poly in anns:
            xs, ys = [q[0] for q in poly], [q[1] for q in poly]
            x0, y0 = min(xs), min(ys)
            bbox = [round(x0, 2), round(y0, 2), round(max(xs) - x0, 2), round(max(ys) - y0, 2)]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": kind,
                    "bbox": bbox,
                    "area": round(_area(poly), 2),
                    "segmentation": [[c for q in poly for c in q]],
                    "iscrowd": 0,
                }
            )
    coco = {
        "info": {"description": f"multipod procedural shapes {dataclasses.asdict(p)}"},
        "images": images,
        "annotations": annotations,
        "categories": list(CATEGORIES),
    }
    os.makedirs(os.path.join(out_dir, "annotations"), exist_ok=True)
    path = os.path.join(out_dir, "annotations", "instances.json")
    with open(path + ".tmp", "w") as f:
        json.dump(coco, f)
    os.replace(path + ".tmp", path)  # the JSON appears last: its presence means complete
    return path


def prepare_shapes(cache_dir: str, p: ShapesParams) -> tuple[str, str]:
    """The cached shapes folder for p (built once, safely across processes).

    Returns (instances JSON path, images folder).
    """
    out_dir = os.path.join(os.path.expanduser(cache_dir), "shapes", f"h{p.fingerprint()}")
    path = os.path.join(out_dir, "annotations", "instances.json")
    with file_lock(out_dir + ".lock"):
        if not os.path.exists(path):
            write_shapes_coco(out_dir, p)
    return path, os.path.join(out_dir, "images")
