"""COCO instances JSON -> checked per-image records (pure Python, no tfds).

What the COCO builder stores, and what the evaluator compares against: boxes in
normalised (x0, y0, x1, y1), contiguous labels, crowd flags, polygons. Each bad record
is returned with the reason it was skipped, so the builder can name and count them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from input_pipeline import input_files, storage
from input_pipeline.input_errors import InputError

_REQUIRED = ("images", "annotations", "categories")
_BOX_TOLERANCE = 1.0  # pixels a box may stick out of its image (rounding in real data)


class CocoFormatError(ValueError):
    """The annotations file is not a COCO instances JSON."""


def load_coco_json(path: str) -> dict[str, Any]:
    """Reads and checks the top-level structure of a COCO instances file (local or in a
    bucket)."""
    if not storage.isfile(path):
        raise FileNotFoundError(
            f"COCO annotations file {path!r} does not exist; check data.data_dir and "
            "data.annotations / data.eval_annotations."
        )
    try:
        with storage.open_file(path, "r") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise CocoFormatError(f"{path} is not JSON ({e}); expected a COCO instances file.") from e
    if not isinstance(data, dict) or any(k not in data for k in _REQUIRED):
        found = sorted(data)[:8] if isinstance(data, dict) else type(data).__name__
        raise CocoFormatError(
            f"{path} is not a COCO instances file: it needs the keys {list(_REQUIRED)} "
            f"(found {found}). Point data.annotations at instances_*.json."
        )
    for key in _REQUIRED:
        if not isinstance(data[key], list):
            raise CocoFormatError(
                f"{path}: '{key}' must be a list, got {type(data[key]).__name__}."
            )
    for i, img in enumerate(data["images"]):
        if not isinstance(img, dict) or any(k not in img for k in ("id", "file_name")):
            raise CocoFormatError(f"{path}: images[{i}] lacks 'id' or 'file_name': {img!r:.120}")
    for i, cat in enumerate(data["categories"]):
        if not isinstance(cat, dict) or any(k not in cat for k in ("id", "name")):
            raise CocoFormatError(f"{path}: categories[{i}] lacks 'id' or 'name': {cat!r:.120}")
    return data


def label_map_for(coco: dict[str, Any], names: Sequence[str]) -> list[int]:
    """[0, category ids...]: contiguous label i -> COCO category id, sorted by id."""
    cats = {c["id"]: c["name"] for c in coco["categories"]}
    if names:
        missing = sorted(set(names) - set(cats.values()))
        if missing:
            raise CocoFormatError(
                f"categories {missing} are not in the annotations; known: {sorted(cats.values())}."
            )
        ids = sorted(i for i, n in cats.items() if n in set(names))
    else:
        ids = sorted(cats)
    return [0, *ids]


def _check_box(ann: dict[str, Any], width: float, height: float) -> str | None:
    """Why this annotation's box is unusable, or None."""
    bbox = ann.get("bbox")
    if not isinstance(bbox, list | tuple) or len(bbox) != 4:
        return f"bad box: bbox {bbox!r} is not [x, y, w, h]"
    x, y, w, h = (float(v) for v in bbox)
    if w <= 0 or h <= 0:
        return f"zero-area box: bbox {bbox}"
    t = _BOX_TOLERANCE
    if x < -t or y < -t or x + w > width + t or y + h > height + t:
        return f"out-of-image box: bbox {bbox} in a {width}x{height} image"
    return None


def _polygons(ann: dict[str, Any]) -> tuple[list[np.ndarray], list[str]]:
    """The annotation's polygons as [N, 2] arrays (RLE masks give none), and why any
    polygon was dropped (fewer than 3 points, an odd coordinate count)."""
    seg = ann.get("segmentation")
    if not isinstance(seg, list):
        return [], []
    out, dropped = [], []
    for poly in seg:
        if isinstance(poly, list) and len(poly) >= 6 and len(poly) % 2 == 0:
            out.append(np.asarray(poly, np.float32).reshape(-1, 2))
        else:
            n = len(poly) if isinstance(poly, list) else 0
            dropped.append(f"polygon dropped: {n} coordinates (needs >= 3 points as x,y pairs)")
    return out, dropped


def build_records(
    coco: dict[str, Any],
    images_dir: str,
    category_names: Sequence[str],
    decode_error: Callable[[str], str | None],
    label_map: list[int] | None = None,
) -> tuple[list[dict[str, Any]], list[int], list[tuple[str, str]]]:
    """Checked per-image records, the label map, and the skipped (record, reason) pairs.
    `images_dir` is a local folder or a prefix in a bucket (whose images are listed once
    and checked several at a time)."""
    label_map = label_map or label_map_for(coco, category_names)
    known = {c["id"] for c in coco["categories"]}
    label_of = {cat: i for i, cat in enumerate(label_map) if i > 0}
    by_image: dict[Any, list[dict[str, Any]]] = {}
    for ann in coco["annotations"]:
        by_image.setdefault(ann.get("image_id"), []).append(ann)
    exists = input_files.existing_files(images_dir)
    paths = [storage.join(images_dir, img["file_name"]) for img in coco["images"]]
    present = [exists(path) for path in paths]
    decode_errors = input_files.map_ahead(
        decode_error,
        [p for p, ok in zip(paths, present, strict=True) if ok],
        storage.is_url(images_dir),
    )
    records, skipped = [], []
    for img, path, ok in zip(coco["images"], paths, present, strict=True):
        name = f"image {img['id']} ({img['file_name']})"
        if not ok:
            skipped.append((name, f"missing image file: {path}"))
            continue
        error = next(decode_errors)
        if error is not None:
            skipped.append((name, f"undecodable image: {error}"))
            continue
        width, height = float(img.get("width", 0)), float(img.get("height", 0))
        if width <= 0 or height <= 0:
            skipped.append((name, f"bad image size: {img.get('width')}x{img.get('height')}"))
            continue
        boxes, labels, crowd, coords, sizes, owner = [], [], [], [], [], []
        for ann in by_image.get(img["id"], []):
            what = f"annotation {ann.get('id')} of {name}"
            if ann.get("category_id") not in known:
                skipped.append((what, f"unknown category id: {ann.get('category_id')}"))
                continue
            if ann["category_id"] not in label_of:
                continue  # a category this config does not train on
            why = _check_box(ann, width, height)
            if why is not None:
                skipped.append((what, why))
                continue
            x, y, w, h = (float(v) for v in ann["bbox"])
            box = np.clip([x / width, y / height, (x + w) / width, (y + h) / height], 0.0, 1.0)
            polygons, dropped = _polygons(ann)
            skipped.extend((what, why) for why in dropped)
            for poly in polygons:
                coords.append((poly / np.array([width, height], np.float32)).reshape(-1))
                sizes.append(len(poly))
                owner.append(len(boxes))
            boxes.append(box)
            labels.append(label_of[ann["category_id"]])
            crowd.append(int(ann.get("iscrowd", 0)))
        records.append(
            {
                "path": path,
                "image_id": int(img["id"]),
                "height": int(height),
                "width": int(width),
                "boxes": np.asarray(boxes, np.float32).reshape(-1, 4),
                "labels": np.asarray(labels, np.int32),
                "is_crowd": np.asarray(crowd, np.int32),
                "poly_coords": (np.concatenate(coords) if coords else np.zeros(0)).astype(
                    np.float32
                ),
                "poly_sizes": np.asarray(sizes, np.int32),
                "poly_instance": np.asarray(owner, np.int32),
            }
        )
    return records, label_map, skipped


def split_image_ids(ids: Sequence[int], eval_count: int, seed: int) -> tuple[list[int], list[int]]:
    """A fixed (train, eval) split of image ids: eval_count ids chosen by a seeded shuffle."""
    ordered = sorted(ids)
    if not 0 < eval_count < len(ordered):
        raise InputError(
            f"data.eval_count={eval_count} must be in 1..{len(ordered) - 1} for {len(ordered)} "
            "images (or give separate eval annotations)."
        )
    perm = np.random.default_rng(seed).permutation(len(ordered))
    eval_ids = sorted(ordered[i] for i in perm[:eval_count])
    held = set(eval_ids)
    return [i for i in ordered if i not in held], eval_ids


def eval_ground_truth(
    coco: dict[str, Any], records: list[dict[str, Any]], label_map: list[int]
) -> dict[str, Any]:
    """A clean COCO JSON for pycocotools: the eval records' images and their usable
    annotations of the kept categories (crowd regions kept, so COCOeval ignores them)."""
    keep_images = {r["image_id"] for r in records}
    keep_cats = set(label_map[1:])
    images = [
        {k: img[k] for k in ("id", "file_name", "width", "height") if k in img}
        for img in coco["images"]
        if img["id"] in keep_images
    ]
    sizes = {img["id"]: (float(img["width"]), float(img["height"])) for img in images}
    annotations = []
    for ann in coco["annotations"]:
        if ann.get("image_id") not in keep_images or ann.get("category_id") not in keep_cats:
            continue
        if _check_box(ann, *sizes[ann["image_id"]]) is not None:
            continue
        x, y, w, h = (float(v) for v in ann["bbox"])
        annotations.append(
            {
                "id": ann.get("id", len(annotations) + 1),
                "image_id": ann["image_id"],
                "category_id": ann["category_id"],
                "bbox": [x, y, w, h],
                "area": float(ann.get("area", w * h)),
                "iscrowd": int(ann.get("iscrowd", 0)),
                **({"segmentation": ann["segmentation"]} if "segmentation" in ann else {}),
            }
        )
    categories = [c for c in coco["categories"] if c["id"] in keep_cats]
    return {"images": images, "annotations": annotations, "categories": categories}
