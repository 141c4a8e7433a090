"""Inputs for `python -m launch.bench.input`: small files in the real formats, and each
`mlperf_v07` config's per-host training loader over them, built as the task builds it.

No MLPerf data set is needed: the BERT and Transformer files are TFRecords of
tf.train.Examples in the reference layouts (512-token masked sequences; t2t's packed
256-token WMT rows), written with the project's own encoders; the detection images are
a COCO-format folder, either given (`--coco_dir`, real JPEGs) or generated here (JPEGs
of random shapes with polygon instances). Each loader is the task's own code path:
the TFRecord reader and parser, grain's DataLoader, the SSD crop / flip / resize /
anchor encoding, the Mask R-CNN resize / pad / flip / mask rasterisation, at the
`mlperf_v07` shapes.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator

import numpy as np
from PIL import Image, ImageDraw

from input_pipeline import grain_pipeline, packing, pretraining_examples, tf_example, tfrecord

MODELS = ("bert", "transformer", "ssd", "maskrcnn")
BERT_VOCAB = 30522  # the reference's uncased WordPiece vocabulary
WMT_VOCAB = 33708  # configs/transformer.py mlperf_v07 data.vocab_size
COCO_ANNOTATIONS = "annotations/instances_train2017.json"


def mlperf_config(model: str):
    """The model's `mlperf_v07` config."""
    return importlib.import_module(f"configs.{model}").get_config("mlperf_v07")


def _bert_example(rng: np.random.Generator, seq: int, predictions: int) -> bytes:
    """One reference-layout BERT record: mostly full sequences (create_pretraining_data's
    short_seq_prob 0.1), 15% of the tokens masked up to `predictions`."""
    length = seq if rng.random() > 0.1 else int(rng.integers(16, seq))
    ids = np.zeros(seq, np.int64)
    ids[:length] = rng.integers(999, BERT_VOCAB, length)
    mask = np.zeros(seq, np.int64)
    mask[:length] = 1
    segments = np.zeros(seq, np.int64)
    segments[int(rng.integers(1, length)) : length] = 1
    n = min(predictions, max(1, round(length * 0.15)))
    positions = np.zeros(predictions, np.int64)
    positions[:n] = np.sort(rng.choice(np.arange(1, length), n, replace=False))
    lm_ids = np.zeros(predictions, np.int64)
    lm_ids[:n] = rng.integers(999, BERT_VOCAB, n)
    weights = np.zeros(predictions, np.float32)
    weights[:n] = 1.0
    return tf_example.encode_example(
        {
            "input_ids": ids,
            "input_mask": mask,
            "segment_ids": segments,
            "masked_lm_positions": positions,
            "masked_lm_ids": lm_ids,
            "masked_lm_weights": weights,
            "next_sentence_labels": np.array([int(rng.random() < 0.5)]),
        }
    )


def _wmt_packed_example(rng: np.random.Generator, length: int) -> bytes:
    """One t2t packed WMT record: sentence pairs of ~10-60 subwords packed into `length`
    tokens a side, with segment ids and positions."""
    sides = {"inputs": [], "targets": []}
    segs = {"inputs": [], "targets": []}
    pos = {"inputs": [], "targets": []}
    segment = 0
    while True:
        n_in, n_tg = (int(x) for x in rng.integers(10, 60, 2))
        if len(sides["inputs"]) + n_in > length or len(sides["targets"]) + n_tg > length:
            break
        segment += 1
        for side, n in (("inputs", n_in), ("targets", n_tg)):
            ids = list(rng.integers(2, WMT_VOCAB, n - 1)) + [1]  # EOS = 1 ends each sequence
            sides[side] += ids
            segs[side] += [segment] * n
            pos[side] += list(range(n))
    features = {}
    for side in ("inputs", "targets"):
        features[side] = np.asarray(sides[side], np.int64)
        features[f"{side}_segmentation"] = np.asarray(segs[side], np.int64)
        features[f"{side}_position"] = np.asarray(pos[side], np.int64)
    return tf_example.encode_example(features)


def _synthetic_coco(folder: str, images: int, seed: int) -> None:
    """A COCO-format folder of `images` 640x480 JPEGs, each with 2-8 polygon instances
    of 3 categories drawn into it (real decode work, real polygons to rasterise)."""
    rng = np.random.default_rng(seed)
    image_dir = os.path.join(folder, "images", "train2017")
    os.makedirs(image_dir, exist_ok=True)
    os.makedirs(os.path.join(folder, "annotations"), exist_ok=True)
    coco = {
        "images": [],
        "annotations": [],
        "categories": [{"id": i, "name": f"shape{i}"} for i in (1, 2, 3)],
    }
    w, h = 640, 480
    for i in range(images):
        img = Image.fromarray(rng.integers(0, 256, (h // 8, w // 8, 3), np.uint8)).resize((w, h))
        draw = ImageDraw.Draw(img)
        name = f"{i:012d}.jpg"
        coco["images"].append({"id": i + 1, "file_name": name, "width": w, "height": h})
        for _ in range(int(rng.integers(2, 9))):
            cx, cy = rng.uniform(80, w - 80), rng.uniform(80, h - 80)
            r = rng.uniform(20, 75)
            angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(5, 12))))
            pts = [(cx + r * np.cos(a), cy + r * np.sin(a)) for a in angles]
            draw.polygon(pts, fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            box = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
            coco["annotations"].append(
                {
                    "id": len(coco["annotations"]) + 1,
                    "image_id": i + 1,
                    "category_id": int(rng.integers(1, 4)),
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                    "segmentation": [[float(v) for p in pts for v in p]],
                }
            )
        img.save(os.path.join(image_dir, name), quality=90)
    with open(os.path.join(folder, COCO_ANNOTATIONS), "w") as f:
        json.dump(coco, f)


def write_fixtures(fixture_dir: str, records: int, coco_dir: str = "", seed: int = 0) -> None:
    """Writes whatever `fixture_dir` lacks: bert/part-00000.tfrecord, wmt/packed.tfrecord
    (`records` each) and, without `coco_dir`, coco/ (max(records // 4, 4) images)."""
    rng = np.random.default_rng(seed)
    bert = mlperf_config("bert").data
    path = os.path.join(fixture_dir, "bert", "part-00000.tfrecord")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        examples = [
            _bert_example(rng, bert.seq_length, bert.max_predictions) for _ in range(records)
        ]
        tfrecord.write_records(path, examples)
    path = os.path.join(fixture_dir, "wmt", "packed.tfrecord")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        length = mlperf_config("transformer").data.max_length
        tfrecord.write_records(path, [_wmt_packed_example(rng, length) for _ in range(records)])
    if not coco_dir and not os.path.exists(os.path.join(fixture_dir, "coco", COCO_ANNOTATIONS)):
        _synthetic_coco(os.path.join(fixture_dir, "coco"), max(records // 4, 4), seed)


def coco_folder_of(fixture_dir: str, coco_dir: str):
    """The COCO folder to read: `coco_dir` (annotations/instances_train2017.json, its
    images' file names taken from images/train2017/, images/, train2017/ or the folder
    itself, whichever holds the first one) or the generated one."""
    from input_pipeline.coco_builder import CocoFolder

    root = coco_dir or os.path.join(fixture_dir, "coco")
    annotations = os.path.join(root, COCO_ANNOTATIONS)
    if not os.path.isfile(annotations):
        raise FileNotFoundError(
            f"--coco_dir {root!r} lacks {COCO_ANNOTATIONS!r}; give a COCO-format folder "
            "(annotations and images) or leave --coco_dir empty for generated images"
        )
    with open(annotations) as f:
        first = json.load(f)["images"][0]["file_name"]
    for sub in ("images/train2017", "images", "train2017", ""):
        if os.path.isfile(os.path.join(root, sub, first)):
            images = os.path.join(root, sub)
            return CocoFolder(annotations=annotations, images_dir=images, eval_count=2)
    raise FileNotFoundError(
        f"--coco_dir {root!r}: image {first!r} of {COCO_ANNOTATIONS} is in none of "
        "images/train2017/, images/, train2017/ or the folder itself"
    )


def train_iterator(
    model: str, fixture_dir: str, coco_dir: str, host_batch: int, workers: int
) -> Iterator[dict[str, np.ndarray]]:
    """The model's per-host training batches over the fixtures, as its task builds them
    (shard 0 of 1: a host's work per row does not depend on the host count), read by
    `workers` grain worker processes (0: in this process)."""
    cache = os.path.join(fixture_dir, "cache")
    config = mlperf_config(model)
    if model == "bert":
        from input_pipeline.bert_tfrecord import BertRecordParser

        d = config.data
        files = [os.path.join(fixture_dir, "bert", "part-00000.tfrecord")]
        parse = BertRecordParser(d.seq_length, d.max_predictions, BERT_VOCAB)
        source = tfrecord.TFRecordSource(files, parse, os.path.join(cache, "tfrecord_index"))
        spec = pretraining_examples.feature_spec(d.seq_length, d.max_predictions)
        dtypes = {name: dtype for name, (_, dtype) in spec.items()}
        loader = grain_pipeline.train_loader(
            source, host_batch, 0, 0, 1, dtypes, workers, read_threads=d.get("read_threads")
        )
    elif model == "transformer":
        from input_pipeline.translation_tfrecord import PackedRecordRows

        files = [os.path.join(fixture_dir, "wmt", "packed.tfrecord")]
        rows = PackedRecordRows(config.data.max_length, WMT_VOCAB)
        source = tfrecord.TFRecordSource(files, rows, os.path.join(cache, "tfrecord_index"))
        dtypes = {name: "int32" for name in packing.PACKED_FIELDS}
        loader = grain_pipeline.train_loader(source, host_batch, 0, 0, 1, dtypes, workers)
    elif model in ("ssd", "maskrcnn"):
        from input_pipeline.coco_builder import prepare_coco

        coco = prepare_coco(coco_folder_of(fixture_dir, coco_dir), os.path.join(cache, "tfds"))
        if model == "ssd":
            from mlperf.ssd import data as ssd_data
            from mlperf.ssd.boxes import BoxEncoder
            from mlperf.ssd.task import anchor_config

            anchors = anchor_config(config.model)
            loader = ssd_data.train_loader(
                coco.train, host_batch, 0, 0, 1, anchors.image_size, BoxEncoder(anchors),
                worker_count=workers, colour=config.data.get("colour_distort", False),
            )  # fmt: skip
        else:
            from input_pipeline import maskrcnn_data

            d = config.data
            params = maskrcnn_data.MaskRcnnInput(
                d.image_size, d.max_instances, d.mask_size, tuple(d.get("scale_range", (1.0, 1.0)))
            )
            loader = maskrcnn_data.train_loader(coco.train, params, host_batch, 0, 0, 1, workers)
    else:
        raise ValueError(f"unknown model {model!r}; use one of {', '.join(MODELS)}")
    return iter(loader)
