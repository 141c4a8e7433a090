"""What SSD and Mask R-CNN predictions share: image files in, COCO results and
annotated pictures out.

An input image is read whole (JPEG, PNG or anything else PIL opens) and checked before
any model work, so a file that is not an image is one error naming it. Detections come
back in the input image's pixels; `coco_results` writes them as pycocotools' results
(`[{"image_id", "category_id", "bbox": [x, y, w, h], "score", "segmentation": RLE}]`,
rounded as the in-loop eval rounds them) and `coco_images` the matching `images` and
`categories` blocks, so `COCO.loadRes` and `COCOeval` read them as they are.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, UnidentifiedImageError

from mlperf.coco_eval import CocoEvaluator

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
# Distinct colours for the classes in annotated pictures (tab10).
PALETTE = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)


class BadImageError(ValueError):
    """An input that is not a readable image."""


@dataclasses.dataclass(frozen=True)
class InputImage:
    """One input picture: its file, COCO image id, size and encoded bytes."""

    path: str
    image_id: int
    width: int
    height: int
    encoded: np.ndarray  # the file's bytes (uint8), as the COCO builder stores images


@dataclasses.dataclass
class Detections:
    """One image's detections in its own pixels: boxes [N, 4] as x, y, w, h, scores [N],
    labels [N] (the model's contiguous class ids, 1..K), masks [N, H, W] uint8 or None."""

    image: InputImage
    boxes_xywh: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    masks: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """Contiguous class id -> COCO category id and name ([0] is the background)."""

    category_ids: list[int]
    names: list[str]

    @classmethod
    def contiguous(cls, num_classes: int) -> LabelMap:
        """Ids 1..K as their own categories, when the run's data is not at hand."""
        return cls(
            list(range(num_classes)), ["background"] + [f"class {i}" for i in range(1, num_classes)]
        )


def image_files(inputs: Sequence[str]) -> list[str]:
    """The files named (folders: the images directly inside, sorted by name)."""
    files = []
    for path in inputs:
        if os.path.isdir(path):
            inside = sorted(os.listdir(path))
            files += [os.path.join(path, n) for n in inside if n.lower().endswith(IMAGE_SUFFIXES)]
        else:
            files.append(path)
    return files


def read_image(path: str, index: int) -> InputImage:
    """An image file read and checked (decodable); its COCO id is its file name's number
    when the name is one (COCO's 000000139.jpg is image 139), else its position."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BadImageError(f"{path}: cannot read it ({e.strerror or e})") from None
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            width, height = img.size
    except UnidentifiedImageError:
        raise BadImageError(f"{path} is not an image (PIL recognises no format in it)") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise BadImageError(f"{path} is not a readable image ({e})") from None
    stem = os.path.splitext(os.path.basename(path))[0]
    image_id = int(stem) if stem.isdigit() else index
    return InputImage(path, image_id, width, height, np.frombuffer(data, np.uint8))


def read_images(paths: Sequence[str]) -> list[InputImage]:
    """Every image checked before any model work; ids made unique by position."""
    images = [read_image(p, i) for i, p in enumerate(paths)]
    if len({im.image_id for im in images}) < len(images):
        images = [dataclasses.replace(im, image_id=i) for i, im in enumerate(images)]
    return images


def record_of(image: InputImage) -> dict[str, Any]:
    """The image as a COCO builder record with no annotations: what the eval views
    (`eval_view`, `make_example`) preprocess."""
    empty = np.zeros((0,), np.float32)
    return {
        "image_bytes": image.encoded,
        "image_id": np.int64(image.image_id),
        "height": np.int64(image.height),
        "width": np.int64(image.width),
        "boxes": np.zeros((0, 4), np.float32),
        "labels": np.zeros((0,), np.int64),
        "is_crowd": np.zeros((0,), np.int64),
        "poly_coords": empty,
        "poly_sizes": np.zeros((0,), np.int64),
        "poly_instance": np.zeros((0,), np.int64),
    }


def num_classes(trained) -> int:
    """Classes of a restored detector, background included."""
    if trained.run.benchmark == "ssd":
        return int(trained.task.model_config().num_classes)
    return int(trained.task.num_classes()) + 1


def run_label_map(task, num_classes: int) -> tuple[LabelMap, str]:
    """The run's categories (its prepared COCO data, built from data.* if not cached), or
    contiguous ids when that data is not here; the second value says which."""
    from input_pipeline.coco_records import CocoFormatError

    try:
        coco = task.prepare(0, 1).coco
    except (FileNotFoundError, CocoFormatError) as e:
        return LabelMap.contiguous(num_classes), f"the run's data is not here ({e}): class ids"
    return LabelMap(list(coco.label_to_category), list(coco.category_names)), "the run's data"


def coco_images(images: Sequence[InputImage], labels: LabelMap) -> dict[str, Any]:
    """COCO `images` and `categories` of the inputs (a ground-truth file without
    annotations: what results are scored or shown against)."""
    return {
        "images": [
            {
                "id": im.image_id,
                "file_name": os.path.basename(im.path),
                "width": im.width,
                "height": im.height,
            }
            for im in images
        ],
        "categories": [
            {"id": int(c), "name": n}
            for c, n in zip(labels.category_ids[1:], labels.names[1:], strict=True)
        ],
        "annotations": [],
    }


def coco_evaluator(images: Sequence[InputImage], labels: LabelMap) -> CocoEvaluator:
    """The eval's result writer over the inputs' images and the run's categories."""
    return CocoEvaluator(coco_images(images, labels), labels.category_ids)


def coco_results(detections: Sequence[Detections], labels: LabelMap) -> list[dict[str, Any]]:
    """COCO results of every image: boxes and scores (and RLE masks where there are)."""
    writer = coco_evaluator([d.image for d in detections], labels)
    out: list[dict[str, Any]] = []
    for d in detections:
        ids = np.full(len(d.scores), d.image.image_id)
        boxes = writer.box_results(ids, d.boxes_xywh, d.scores, d.labels)
        if d.masks is not None:
            masks = writer.mask_results(ids, d.masks, d.scores, d.labels)
            for box, mask in zip(boxes, masks, strict=True):
                box["segmentation"] = mask["segmentation"]
        out += boxes
    return out


def annotate(d: Detections, labels: LabelMap, threshold: float) -> Image.Image:
    """The image with its detections of score >= threshold drawn: masks tinted, boxes
    outlined, each labelled with its class name and score."""
    img = Image.open(io.BytesIO(d.image.encoded.tobytes())).convert("RGB")
    keep = np.flatnonzero(d.scores >= threshold)
    if d.masks is not None and len(keep):
        pixels = np.asarray(img, np.float32)
        for i in keep:
            colour = np.asarray(PALETTE[int(d.labels[i]) % len(PALETTE)], np.float32)
            on = d.masks[i].astype(bool)
            pixels[on] = 0.5 * pixels[on] + 0.5 * colour
        img = Image.fromarray(pixels.astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for i in keep:
        colour = PALETTE[int(d.labels[i]) % len(PALETTE)]
        x, y, w, h = (float(v) for v in d.boxes_xywh[i])
        draw.rectangle([x, y, x + w, y + h], outline=colour, width=2)
        label = int(d.labels[i])
        name = labels.names[label] if label < len(labels.names) else f"class {label}"
        text = f"{name} {float(d.scores[i]):.2f}"
        left, top, right, bottom = draw.textbbox((x, y), text)
        draw.rectangle([left, top, right, bottom], fill=colour)
        draw.text((x, y), text, fill=(255, 255, 255))
    return img


def picture_names(images: Sequence[InputImage]) -> list[str]:
    """`<file stem>.png` for each input, numbered where two inputs share a stem."""
    stems = [os.path.splitext(os.path.basename(im.path))[0] for im in images]
    seen: dict[str, int] = {}
    names = []
    for stem in stems:
        n = seen.get(stem, 0)
        seen[stem] = n + 1
        names.append(f"{stem}.png" if stems.count(stem) == 1 else f"{stem}_{n}.png")
    return names


def write_outputs(
    output_dir: str, detections: Sequence[Detections], labels: LabelMap, threshold: float
) -> list[str]:
    """output_dir/detections.json (COCO results), images.json (their images and
    categories) and an annotated PNG per image; returns the paths."""
    import json

    os.makedirs(output_dir, exist_ok=True)
    results = os.path.join(output_dir, "detections.json")
    with open(results, "w") as f:
        json.dump(coco_results(detections, labels), f)
    header = os.path.join(output_dir, "images.json")
    with open(header, "w") as f:
        json.dump(coco_images([d.image for d in detections], labels), f, indent=1)
    paths = [results, header]
    for d, name in zip(detections, picture_names([d.image for d in detections]), strict=True):
        path = os.path.join(output_dir, name)
        annotate(d, labels, threshold).save(path)
        paths.append(path)
    return paths
