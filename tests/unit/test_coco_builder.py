"""COCO-format builder, procedural shapes data set, detection augmentation."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import DATA_DIR
from PIL import Image

from input_pipeline.coco_builder import CocoFolder, prepare_coco
from input_pipeline.coco_records import CocoFormatError, load_coco_json
from input_pipeline.detection_augment import Instances, random_iou_crop, ssd_train_augment
from input_pipeline.shapes_dataset import ShapesParams, prepare_shapes, write_shapes_coco

SMALL = ShapesParams(num_images=12, image_size=64, seed=3)


def _text(path):
    with open(path) as f:
        return f.read()


def _read_json(path):
    return json.loads(_text(path))


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    ann, images = prepare_shapes(str(cache), SMALL)
    data = prepare_coco(CocoFolder(ann, images, eval_count=4, split_seed=1), str(cache / "tfds"))
    return ann, images, data


def test_shapes_are_deterministic_by_seed(tmp_path):
    a = write_shapes_coco(str(tmp_path / "a"), SMALL)
    b = write_shapes_coco(str(tmp_path / "b"), SMALL)
    assert _text(a) == _text(b)
    img = "shapes_000003.png"
    assert (tmp_path / "a/images" / img).read_bytes() == (tmp_path / "b/images" / img).read_bytes()
    c = write_shapes_coco(str(tmp_path / "c"), ShapesParams(num_images=12, image_size=64, seed=4))
    assert _text(a) != _text(c)


def test_shapes_boxes_enclose_their_polygons(shapes):
    ann, _, _ = shapes
    coco = _read_json(ann)
    assert {c["name"] for c in coco["categories"]} == {"rectangle", "ellipse", "triangle"}
    assert len(coco["annotations"]) >= len(coco["images"])
    for a in coco["annotations"]:
        pts = np.asarray(a["segmentation"][0]).reshape(-1, 2)
        x, y, w, h = a["bbox"]
        np.testing.assert_allclose(pts.min(0), [x, y], atol=0.02)
        np.testing.assert_allclose(pts.max(0), [x + w, y + h], atol=0.02)


def test_builder_splits_and_records(shapes):
    ann, _, data = shapes
    assert len(data.train) == 8 and len(data.eval) == 4
    assert data.label_to_category == [0, 1, 2, 3]
    ids = {int(data.train[i]["image_id"]) for i in range(8)}
    eval_ids = {int(data.eval[i]["image_id"]) for i in range(4)}
    assert not ids & eval_ids and len(ids | eval_ids) == 12
    gt = _read_json(data.eval_gt_path)
    assert {im["id"] for im in gt["images"]} == eval_ids
    coco = _read_json(ann)
    r = data.train[0]
    anns = [a for a in coco["annotations"] if a["image_id"] == int(r["image_id"])]
    assert len(r["boxes"]) == len(anns) == len(r["poly_sizes"])
    x, y, w, h = anns[0]["bbox"]
    np.testing.assert_allclose(r["boxes"][0], np.array([x, y, x + w, y + h]) / 64, atol=1e-5)
    assert r["poly_coords"].shape == (2 * r["poly_sizes"].sum(),)


def _bad_folder(tmp_path):
    images = tmp_path / "imgs"
    images.mkdir()
    for name in ("good.png", "good2.png"):
        Image.new("RGB", (40, 30), (120, 20, 20)).save(images / name)
    (images / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    coco = {
        "images": [
            {"id": 1, "file_name": "good.png", "width": 40, "height": 30},
            {"id": 2, "file_name": "missing.png", "width": 40, "height": 30},
            {"id": 3, "file_name": "corrupt.jpg", "width": 40, "height": 30},
            {"id": 4, "file_name": "good2.png", "width": 40, "height": 30},
        ],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 1, "bbox": [2, 3, 10, 8], "iscrowd": 0},
            {"id": 11, "image_id": 1, "category_id": 1, "bbox": [2, 3, 0, 8], "iscrowd": 0},
            {"id": 12, "image_id": 1, "category_id": 1, "bbox": [35, 3, 30, 8], "iscrowd": 0},
            {"id": 13, "image_id": 1, "category_id": 99, "bbox": [2, 3, 10, 8], "iscrowd": 0},
            {
                "id": 14,
                "image_id": 4,
                "category_id": 1,
                "bbox": [5, 5, 10, 10],
                "iscrowd": 0,
                # one usable polygon and one with two points: the short one is named
                "segmentation": [[5, 5, 15, 5, 15, 15], [5, 5, 6, 6]],
            },
        ],
        "categories": [{"id": 1, "name": "thing"}],
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(coco))
    return str(path), str(images)


def test_bad_records_are_named_skipped_and_counted(tmp_path, capsys, caplog):
    ann, images = _bad_folder(tmp_path)
    data = prepare_coco(CocoFolder(ann, images, eval_count=1), str(tmp_path / "tfds"))
    out = capsys.readouterr().out
    assert "skipped 6 records" in out
    for reason in ("missing image file", "undecodable image", "zero-area box", "polygon dropped"):
        assert f"1 {reason}" in out
    assert "annotation 14 of image 4 (good2.png): polygon dropped" in caplog.text
    assert "1 out-of-image box" in out and "1 unknown category id" in out
    records = [data.train[0], data.eval[0]]
    assert sorted(int(r["image_id"]) for r in records) == [1, 4]
    good = next(r for r in records if int(r["image_id"]) == 1)
    assert len(good["boxes"]) == 1  # only annotation 10 survives


def test_not_coco_is_a_clear_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"foo": [1, 2]}))
    with pytest.raises(CocoFormatError, match="not a COCO instances file"):
        load_coco_json(str(path))
    path.write_text("{broken")
    with pytest.raises(CocoFormatError, match="not JSON"):
        load_coco_json(str(path))
    with pytest.raises(FileNotFoundError, match="data.data_dir"):
        prepare_coco(CocoFolder(str(tmp_path / "nope.json"), str(tmp_path)), str(tmp_path))


def test_iou_crop_and_flip_keep_boxes_and_polygons_consistent(shapes):
    _, _, data = shapes
    rng = np.random.default_rng(0)
    cropped = 0
    for i in range(8):
        record = data.train[i]
        pixels, inst = ssd_train_augment(record, rng, 48)
        assert pixels.shape == (48, 48, 3) and pixels.dtype == np.uint8  # normalised on device
        assert np.all((inst.boxes >= 0) & (inst.boxes <= 1))
        assert np.all(inst.boxes[:, 2] > inst.boxes[:, 0])
        # Shape polygons stay inside their (clipped) boxes.
        pts = inst.poly_coords.reshape(-1, 2)
        owner = np.repeat(inst.poly_instance, inst.poly_sizes)
        b = inst.boxes[owner]
        assert np.all(pts >= b[:, :2] - 1e-4) and np.all(pts <= b[:, 2:] + 1e-4)
        crop, _ = random_iou_crop(np.random.default_rng(i), Instances.from_record(record))
        cropped += int(not np.allclose(crop, [0, 0, 1, 1]))
    assert cropped > 0


def test_colour_distortion_changes_pixels_not_geometry(shapes):
    _, _, data = shapes
    changed = 0
    for i in range(6):
        plain, inst = ssd_train_augment(data.train[i], np.random.default_rng(i), 48)
        coloured, inst_c = ssd_train_augment(
            data.train[i], np.random.default_rng(i), 48, colour=True
        )
        # Same crop and flip (colour draws come last), so the same boxes.
        np.testing.assert_array_equal(inst.boxes, inst_c.boxes)
        assert np.isfinite(coloured).all() and coloured.shape == plain.shape
        changed += int(not np.allclose(plain, coloured))
    assert changed > 0  # each distortion applies with p=1/2: some of 6 images change


def test_flip_mirrors_boxes():
    inst = Instances(
        np.array([[0.1, 0.2, 0.3, 0.6]], np.float32),
        np.array([1], np.int32),
        np.array([0.1, 0.2, 0.3, 0.6], np.float32),
        np.array([2], np.int32),
        np.array([0], np.int32),
    )
    flipped = inst.transform(np.ones(2, np.float32), np.zeros(2, np.float32), flip=True)
    np.testing.assert_allclose(flipped.boxes, [[0.7, 0.2, 0.9, 0.6]], atol=1e-6)
    np.testing.assert_allclose(flipped.poly_coords, [0.9, 0.2, 0.7, 0.6], atol=1e-6)


def test_coco128_person_split(tmp_path):
    root = os.path.join(DATA_DIR, "coco128_seg")
    if not os.path.isdir(root):
        pytest.skip(f"{root} is not available (MULTIPOD_DATA_DIR)")
    folder = CocoFolder(
        os.path.join(root, "annotations", "instances_train2017.json"),
        os.path.join(root, "images"),
        eval_count=32,
        categories=("person",),
    )
    data = prepare_coco(folder, str(tmp_path))
    assert (len(data.train), len(data.eval)) == (96, 32)
    assert data.category_names == ["background", "person"]
    gt = _read_json(data.eval_gt_path)
    assert {a["category_id"] for a in gt["annotations"]} == {1}
