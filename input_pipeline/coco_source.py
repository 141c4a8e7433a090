"""The COCO-format source a detection config names (SSD and Mask R-CNN share it).

`data.source` is "shapes" (the embedded procedural set, generated into the cache) or
"coco": a folder laid out as COCO 2017 is distributed,

    <data_dir>/annotations/instances_train2017.json
    <data_dir>/annotations/instances_val2017.json
    <data_dir>/train2017/*.jpg
    <data_dir>/val2017/*.jpg

(relative `annotations`, `images_dir`, `eval_annotations`, `eval_images_dir` are taken
from `data_dir`, a local folder or a `gs://` URL), or any single COCO JSON whose images
are split by `split_seed`.
"""

from __future__ import annotations

import os

from input_pipeline import input_files, storage
from input_pipeline.coco_builder import CocoFolder
from input_pipeline.input_errors import InputError
from input_pipeline.shapes_dataset import ShapesParams, prepare_shapes

SOURCES = ("shapes", "coco")


def cache_dir(data) -> str:
    """Where generated and prepared data sets live (`data.cache_dir`, default
    ~/.cache/multipod): a local folder (a URL is refused in one line)."""
    value = data.get("cache_dir", "") or "~/.cache/multipod"
    input_files.local_cache_dir(value)
    return os.path.expanduser(value)


def coco_folder(data, shapes_image_size: int) -> CocoFolder:
    """The config's data block as a CocoFolder (the shapes set is generated first, at
    `shapes_image_size` pixels)."""
    if data.source == "shapes":
        params = ShapesParams(
            num_images=data.shapes_images, image_size=shapes_image_size, seed=data.shapes_seed
        )
        ann, images = prepare_shapes(cache_dir(data), params)
        return CocoFolder(ann, images, eval_count=data.eval_count, split_seed=data.split_seed)
    if data.source != "coco":
        raise InputError(f"data.source={data.source!r}: use one of {SOURCES}.")

    def path(p: str) -> str:
        return storage.join(data.data_dir, p) if p and not input_files.is_absolute(p) else p

    return CocoFolder(
        annotations=path(data.annotations),
        images_dir=path(data.images_dir),
        eval_annotations=path(data.eval_annotations),
        eval_images_dir=path(data.eval_images_dir),
        eval_count=data.eval_count,
        split_seed=data.split_seed,
        categories=tuple(data.categories),
    )
