"""A trained tiny Mask R-CNN used and exported: predict gives the evaluator's detections of
the same images (boxes and scores to 1e-5, pasted masks the same on > 99.9% of pixels) and
writes them as COCO results with RLE masks; the torch export's backbone re-imports to the
same parameters and gives our features in a torchvision-named torch ResNet; the stablehlo
export runs without the project and gives the JAX model's detections."""

from __future__ import annotations

import json

import numpy as np
import pytest
from detector_helpers import check_backbone_export, evaluator_sums, write_eval_images
from predict_helpers import run_exported, train_tiny_detector
from pycocotools import mask as mask_utils

from input_pipeline.detection_augment import normalise
from input_pipeline.maskrcnn_data import make_example
from launch.export_formats import export
from mlperf import detection_predict as dp
from mlperf.maskrcnn.postprocess import image_boxes, paste_masks, yxyx_to_xywh
from mlperf.maskrcnn.predict import MaskRcnnDetector
from mlperf.trained_model import load_trained, read_run

pytestmark = pytest.mark.slow

EVAL_IMAGES = 8


def train(root):
    """The tiny Mask R-CNN on a small shapes set, trained a couple of steps."""
    return train_tiny_detector(root, "maskrcnn.py:tiny", EVAL_IMAGES)


def test_maskrcnn_predict_and_export(tmp_path):
    """One test (one training): pytest-xdist would split separate tests of this module
    over its workers, each training again."""
    run = train(tmp_path)
    trained = load_trained(read_run(str(run)))
    detector = MaskRcnnDetector(trained)
    # The evaluator's detections and predict's, of the eval images.
    task, sums = evaluator_sums(trained, EVAL_IMAGES)
    images = write_eval_images(task, tmp_path / "images", EVAL_IMAGES)
    evaluated = task, sums, images, detector.detect(images, EVAL_IMAGES)
    check_detections_and_masks_equal_the_evaluators(evaluated)
    check_coco_results_carry_rle_masks_and_pictures(evaluated, tmp_path / "results")
    check_torch_export_backbone_and_heads(run, trained, tmp_path)
    check_stablehlo_export_gives_the_models_detections(run, detector, evaluated, tmp_path)


def check_detections_and_masks_equal_the_evaluators(evaluated):
    _, sums, images, found = evaluated
    flat = {
        k: np.asarray(v).reshape(-1, *np.shape(v)[2:]) for k, v in sums.items() if k != "examples"
    }
    ids = list(flat["image_id"])
    total = 0
    for d in found:
        i = ids.index(d.image.image_id)
        keep = flat["valid"][i]
        yxyx = image_boxes(flat["boxes"][i][keep], flat["scale"][i], d.image.height, d.image.width)
        total += int(keep.sum())
        np.testing.assert_allclose(d.boxes_xywh, yxyx_to_xywh(yxyx), atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(d.scores, flat["scores"][i][keep], atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(d.labels, flat["classes"][i][keep])
        masks = paste_masks(flat["masks"][i][keep], yxyx, d.image.height, d.image.width)
        assert d.masks.shape == masks.shape and np.mean(d.masks == masks) > 0.999
    assert total > 0  # something was detected to compare


def check_coco_results_carry_rle_masks_and_pictures(evaluated, tmp_path):
    task, _, images, found = evaluated
    labels = dp.LabelMap(task.data.coco.label_to_category, task.data.coco.category_names)
    tmp_path.mkdir()
    paths = dp.write_outputs(str(tmp_path), found[:2], labels, threshold=0.0)
    results = json.loads((tmp_path / "detections.json").read_text())
    assert len(results) == sum(len(d.scores) for d in found[:2]) > 0
    first = found[0]
    mine = [r for r in results if r["image_id"] == first.image.image_id]
    decoded = mask_utils.decode([r["segmentation"] for r in mine])  # [H, W, N]
    np.testing.assert_array_equal(decoded.transpose(2, 0, 1), first.masks)
    assert {r["category_id"] for r in results} <= set(labels.category_ids[1:])
    assert len(paths) == 4 and all(p.endswith(".png") for p in paths[2:])


def check_torch_export_backbone_and_heads(run, trained, tmp_path):
    from safetensors.numpy import load_file

    paths = export(str(run), "torch", output=str(tmp_path / "torch"), trained=trained)
    params = trained.host_params()
    check_backbone_export(paths[0], params["backbone"], trained.task.backbone_config())
    heads = load_file(paths[1])
    box = params["box_head"]["box"]["kernel"]  # [fc, K+1, 4] -> Linear [(K+1)*4, fc]
    np.testing.assert_array_equal(heads["box_head.box.weight"], box.reshape(box.shape[0], -1).T)
    deconv = params["mask_head"]["deconv"]["kernel"]  # [2, 2, in, out] -> [in, out, 2, 2]
    np.testing.assert_array_equal(heads["mask_head.deconv.weight"], deconv.transpose(2, 3, 0, 1))


def check_stablehlo_export_gives_the_models_detections(run, detector, evaluated, tmp_path):
    _, _, images, _ = evaluated
    folder = tmp_path / "stablehlo"
    trained = detector.runner.trained
    export(
        str(run),
        "stablehlo",
        str(folder),
        batch_size=EVAL_IMAGES,
        trained=trained,
    )
    # The exported program takes the normalised, zero-padded float32 view.
    examples = [make_example(dp.record_of(im), detector.input, False, False) for im in images]
    batch = {"image": np.stack([normalise(e["image"], e["image_hw"]) for e in examples])}
    expected = detector.runner(batch)
    out = run_exported(folder, batch, tmp_path)
    for name in ("boxes", "scores"):
        np.testing.assert_allclose(out[name], expected[name], atol=1e-5, rtol=1e-5)
    # Mask probabilities leave the program as float16: equal to its rounding (2^-11).
    masks = [x.astype(np.float32) for x in (out["masks"], expected["masks"])]
    np.testing.assert_allclose(*masks, atol=1e-3)
    np.testing.assert_array_equal(out["classes"], expected["classes"])
    np.testing.assert_array_equal(out["valid"], expected["valid"])
