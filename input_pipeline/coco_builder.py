"""A TF-free tensorflow-datasets builder over any COCO-format folder (instances JSON + images).

Each record is one image: its encoded bytes (decoded later, per host, by the
augmentation), its id and size, and its instances: boxes (normalised x0, y0, x1, y1),
contiguous labels (1..K, 0 is background), crowd flags and polygons (flattened
normalised coordinates with per-polygon point counts and owning instance), so Mask
R-CNN can rasterise masks. Splits: `train` and `eval`, from two JSON files (COCO 2017
train/val) or a fixed seeded split of one file's image ids. With a separate eval JSON
of all categories (COCO 2017's instances_val2017.json) the evaluator scores against that
file itself, as the MLPerf references do; otherwise the eval split's ground truth is
written as a clean COCO JSON (`eval_gt.json`) for pycocotools.

Bad records (missing or undecodable image, zero-area or out-of-image box, unknown
category) are named in the log, skipped, and counted; a JSON that is not COCO at all
is a CocoFormatError.

The annotations and images may be local or in a bucket (`gs://`): they are read in place
(the images of a bucket several at a time); the prepared copy is in the local cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from PIL import Image

from input_pipeline import input_files, storage
from input_pipeline.coco_records import (
    CocoFormatError,
    build_records,
    eval_ground_truth,
    load_coco_json,
    split_image_ids,
)
from input_pipeline.file_lock import file_lock

TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"
__all__ = ["CocoFormatError", "CocoFolder", "CocoData", "prepare_coco"]


@dataclasses.dataclass(frozen=True)
class CocoFolder:
    """Where a COCO data set lives and how to split it; its hash names the cached build."""

    annotations: str  # instances JSON (train, or the only one)
    images_dir: str
    eval_annotations: str = ""  # separate eval JSON (e.g. val2017); empty: split `annotations`
    eval_images_dir: str = ""
    eval_count: int = 0  # images held out for eval when splitting one JSON
    split_seed: int = 0
    categories: tuple[str, ...] = ()  # keep only these category names; empty: all

    def fingerprint(self) -> str:
        files = {}
        for path in (self.annotations, self.eval_annotations):
            if path:
                files[storage.resolve(path)] = storage.file_version(path)
        fields = dataclasses.asdict(self)
        fields["images_dir"] = storage.resolve(self.images_dir)
        blob = json.dumps({"folder": fields, "files": files}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclasses.dataclass(eq=False)
class CocoBuilderConfig(tfds.core.BuilderConfig):
    folder: CocoFolder | None = None


def _features() -> tfds.features.FeaturesDict:
    t = tfds.features.Tensor
    return tfds.features.FeaturesDict(
        {
            "image_bytes": t(shape=(None,), dtype=np.uint8),
            "image_id": t(shape=(), dtype=np.int64),
            "height": t(shape=(), dtype=np.int32),
            "width": t(shape=(), dtype=np.int32),
            "boxes": t(shape=(None, 4), dtype=np.float32),
            "labels": t(shape=(None,), dtype=np.int32),
            "is_crowd": t(shape=(None,), dtype=np.int32),
            "poly_coords": t(shape=(None,), dtype=np.float32),
            "poly_sizes": t(shape=(None,), dtype=np.int32),
            "poly_instance": t(shape=(None,), dtype=np.int32),
        }
    )


def _decodes(path: str) -> str | None:
    """None if the image decodes, else why not (a reduced-size decode is enough to tell)."""
    try:
        with storage.open_file(path, "rb") as f, Image.open(f) as img:
            img.draft("RGB", (max(img.width // 8, 1), max(img.height // 8, 1)))
            img.load()
        return None
    except Exception as e:  # PIL raises many types for corrupt files
        return f"{type(e).__name__}: {e}"


class CocoDetection(tfds.core.GeneratorBasedBuilder):
    """COCO instances (boxes + polygons) from local files."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS: list[CocoBuilderConfig] = []  # made at run time

    @property
    def folder(self) -> CocoFolder:
        return self.builder_config.folder

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(features=_features())

    def _split_generators(self, dl_manager) -> dict[str, Iterator]:
        del dl_manager  # local files only
        splits = getattr(self, "loaded_splits", None) or load_splits(self.folder)
        train, evals = splits[0], splits[1]
        return {TRAIN_SPLIT: self._generate(train), EVAL_SPLIT: self._generate(evals)}

    def _generate_examples(self, records):  # required by tfds; splits use _generate
        yield from self._generate(records)

    def _generate(self, records: list[dict[str, Any]]):
        remote = any(storage.is_url(r["path"]) for r in records)
        images = input_files.map_ahead(storage.read_bytes, [r["path"] for r in records], remote)
        for r, image in zip(records, images, strict=True):
            data = np.frombuffer(image, np.uint8)
            example = {k: v for k, v in r.items() if k != "path"}
            yield int(r["image_id"]), {"image_bytes": data, **example}


def load_splits(folder: CocoFolder):
    """(train records, eval records, label -> category id list, eval ground-truth JSON)."""
    train_json = load_coco_json(folder.annotations)
    eval_json = load_coco_json(folder.eval_annotations) if folder.eval_annotations else None
    # One label map for both splits: the train file's categories (filtered by name).
    train, label_map, skipped = build_records(
        train_json, folder.images_dir, folder.categories, _decodes
    )
    if eval_json is not None:
        evals, _, skipped_eval = build_records(
            eval_json,
            folder.eval_images_dir or folder.images_dir,
            folder.categories,
            _decodes,
            label_map=label_map,
        )
        skipped = skipped + skipped_eval
        gt_source = eval_json
    else:
        train_ids, eval_ids = split_image_ids(
            [r["image_id"] for r in train], folder.eval_count, folder.split_seed
        )
        by_id = {r["image_id"]: r for r in train}
        train = [by_id[i] for i in train_ids]
        evals = [by_id[i] for i in eval_ids]
        gt_source = train_json
    _report(skipped)
    gt = eval_ground_truth(gt_source, evals, label_map)
    return train, evals, label_map, gt


def _report(skipped: list[tuple[str, str]]) -> None:
    """Names each skipped record and prints the counts by reason."""
    for what, why in skipped:
        logging.warning("COCO builder: skipping %s: %s", what, why)
    if skipped:
        counts = Counter(why.split(":")[0] for _, why in skipped)
        shown = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
        print(f"COCO builder: skipped {len(skipped)} records ({shown}); see the log for each.")


@dataclasses.dataclass
class CocoData:
    """A prepared COCO data set: random-access splits, label map, eval ground truth."""

    train: Any
    eval: Any
    label_to_category: list[int]  # index = contiguous label; [0] = 0 (background)
    category_names: list[str]
    eval_gt_path: str

    @property
    def num_classes(self) -> int:
        """Classes including background."""
        return len(self.label_to_category)


def _builder(folder: CocoFolder, data_dir: str) -> CocoDetection:
    config = CocoBuilderConfig(
        name=f"h{folder.fingerprint()}",
        version=CocoDetection.VERSION,
        description=json.dumps(dataclasses.asdict(folder), sort_keys=True),
        folder=folder,
    )
    return CocoDetection(config=config, data_dir=data_dir, file_format="array_record")


def prepare_coco(folder: CocoFolder, data_dir: str) -> CocoData:
    """Builds (or reuses) the dataset under data_dir; safe when processes build at once."""
    for path, key in ((folder.annotations, "annotations"), (folder.images_dir, "images_dir")):
        if not (storage.exists(path) or storage.isdir(path)):
            raise FileNotFoundError(f"COCO {key} {path!r} does not exist; check data.data_dir.")
    name = _builder(folder, data_dir).builder_config.name
    with file_lock(os.path.join(data_dir, "locks", f"{name}.lock")):
        builder = _builder(folder, data_dir)
        meta_path = os.path.join(builder.data_dir, "coco_meta.json")
        if not builder.is_prepared() or not os.path.exists(meta_path):
            logging.info("Building COCO tfds dataset in %s", builder.data_dir)
            # Parse and check the records once; the builder's split generators reuse them.
            builder.loaded_splits = load_splits(folder)
            _, _, label_map, gt = builder.loaded_splits
            builder.download_and_prepare(file_format="array_record")
            with open(os.path.join(builder.data_dir, "eval_gt.json"), "w") as f:
                json.dump(gt, f)
            names = {c["id"]: c["name"] for c in gt["categories"]}
            meta = {
                "label_to_category": label_map,
                "names": ["background"] + [names[c] for c in label_map[1:]],
            }
            with open(meta_path + ".tmp", "w") as f:
                json.dump(meta, f)
            os.replace(meta_path + ".tmp", meta_path)
    with open(meta_path) as f:
        meta = json.load(f)
    sources = builder.as_data_source()
    return CocoData(
        train=sources[TRAIN_SPLIT],
        eval=sources[EVAL_SPLIT],
        label_to_category=meta["label_to_category"],
        category_names=meta["names"],
        eval_gt_path=eval_ground_truth_path(folder, builder.data_dir),
    )


def eval_ground_truth_path(folder: CocoFolder, build_dir: str) -> str:
    """The ground truth the eval scores against: the eval annotation file as given when
    it is a separate file and every category is kept (the full val2017 JSON, as the
    references score; pycocotools opens it by name, so an object in a bucket is given as
    its cached local copy), else the filtered copy written at build time."""
    if folder.eval_annotations and not folder.categories:
        return storage.local_copy(folder.eval_annotations)
    return os.path.join(build_dir, "eval_gt.json")
