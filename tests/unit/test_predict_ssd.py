"""A trained tiny SSD used and exported: `launch.predict detect` gives the evaluator's
detections of the same images (boxes and scores to 1e-5) and writes COCO results and
pictures; the torch export's backbone re-imports to the same parameters and gives our
features in a torchvision-named torch ResNet; the stablehlo export runs without the
project and gives the JAX model's detections."""

from __future__ import annotations

import json

import numpy as np
import pycocotools.coco
import pytest
from detector_helpers import check_backbone_export, evaluator_sums, write_eval_images
from predict_helpers import run_exported, train_tiny_detector

from input_pipeline.detection_augment import eval_view, normalise
from launch.export_formats import export
from launch.predict_verbs import detect
from mlperf.coco_eval import load_ground_truth
from mlperf.detection_predict import record_of
from mlperf.ssd.boxes import to_pixel_xywh
from mlperf.ssd.model import backbone_config
from mlperf.trained_model import load_trained, read_run

pytestmark = pytest.mark.slow

EVAL_IMAGES = 8


def train(root):
    """The tiny SSD on a small shapes set, trained a couple of steps."""
    return train_tiny_detector(
        root, "ssd.py:tiny", EVAL_IMAGES, "--config.train.global_batch_size=16"
    )


def test_ssd_predict_and_export(tmp_path):
    """One test (one training): pytest-xdist would split separate tests of this module
    over its workers, each training again."""
    run = train(tmp_path)
    trained = load_trained(read_run(str(run)))
    # The evaluator's detections and predict's (the `detect` verb), of the eval images.
    task, sums = evaluator_sums(trained, EVAL_IMAGES)
    images = write_eval_images(task, tmp_path / "images", EVAL_IMAGES)
    found, paths = detect(trained, images, str(tmp_path / "out"), EVAL_IMAGES)
    evaluated = task, sums, images, found
    check_detections_equal_the_evaluators(evaluated)
    check_outputs_are_coco_results_and_pictures(evaluated, paths, tmp_path / "out")
    check_torch_export_backbone_and_heads(run, trained, tmp_path)
    check_stablehlo_export_gives_the_models_detections(run, trained, evaluated, tmp_path)


def check_detections_equal_the_evaluators(evaluated):
    _, sums, images, found = evaluated
    dets = sums["detections"].reshape(-1, *sums["detections"].shape[-2:])
    ids = sums["image_ids"].reshape(-1)
    assert sorted(ids.tolist()) == sorted(im.image_id for im in images)
    total = 0
    for d in found:
        row = dets[list(ids).index(d.image.image_id)]
        row = row[row[:, 4] > 0]  # filled NMS slots
        total += len(row)
        np.testing.assert_allclose(d.boxes_xywh, row[:, :4], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(d.scores, row[:, 4], atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(d.labels, row[:, 5].astype(np.int64))
    assert total > 0  # something was detected to compare


def check_outputs_are_coco_results_and_pictures(evaluated, paths, out):
    task, _, images, found = evaluated
    results = json.loads((out / "detections.json").read_text())
    gt = load_ground_truth(str(out / "images.json"))
    loaded = gt.loadRes(results)  # pycocotools reads them as they are
    assert isinstance(loaded, pycocotools.coco.COCO)
    names = {c["name"] for c in gt.dataset["categories"]}
    assert names == set(task.data.coco.category_names[1:])
    assert len(results) == sum(len(d.scores) for d in found)
    first = [r for r in results if r["image_id"] == images[0].image_id]
    np.testing.assert_allclose([r["score"] for r in first], found[0].scores, atol=1e-5)
    assert paths[2:] == [str(out / f"{im.image_id}.png") for im in images]
    assert all((out / f"{im.image_id}.png").stat().st_size > 0 for im in images)


def check_torch_export_backbone_and_heads(run, trained, tmp_path):
    from safetensors.numpy import load_file

    paths = export(str(run), "torch", output=str(tmp_path / "torch"), trained=trained)
    params = trained.host_params()
    cfg = backbone_config(trained.task.model_config())
    check_backbone_export(paths[0], params["backbone"], cfg)
    heads = load_file(paths[1])
    mapping = json.loads((tmp_path / "torch" / "heads_mapping.json").read_text())
    assert {m["torch"] for m in mapping} == set(heads) and "conf_heads.0.weight" in heads
    kernel = params["conf_heads"][0]["kernel"]  # HWIO -> OIHW
    np.testing.assert_array_equal(heads["conf_heads.0.weight"], kernel.transpose(3, 2, 0, 1))
    np.testing.assert_array_equal(
        heads["extras.0.bn1.running_var"], params["extras"][0]["bn1"]["var"]
    )


def check_stablehlo_export_gives_the_models_detections(run, trained, evaluated, tmp_path):
    _, _, images, found = evaluated
    folder = tmp_path / "stablehlo"
    export(str(run), "stablehlo", str(folder), batch_size=EVAL_IMAGES, trained=trained)
    size = trained.task.anchors.image_size
    # The exported program takes the normalised float32 view (its preprocessing text).
    batch = {"image": normalise(np.stack([eval_view(record_of(im), size) for im in images]))}
    out = run_exported(folder, batch, tmp_path)
    assert json.loads((folder / "labels.json").read_text())["names"][0] == "background"
    for i, d in enumerate(found):  # predict's detections: the model run on the mesh
        keep = out["scores"][i] > 0
        w, h = np.asarray(d.image.width), np.asarray(d.image.height)
        xywh = to_pixel_xywh(out["boxes"][i][keep], w, h)
        np.testing.assert_allclose(xywh, d.boxes_xywh, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(out["scores"][i][keep], d.scores, atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(out["classes"][i][keep], d.labels)
