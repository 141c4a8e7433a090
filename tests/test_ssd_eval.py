"""SSD eval: the task's COCO mAP equals pycocotools on the same detections written to a
results JSON; distributed eval on 2 processes x 4 devices equals 1 process x 8."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, cpu_env, on_processes
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from configs.ssd import get_config
from mlperf.coco_eval import write_results
from mlperf.ssd.task import SsdTask


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    c = get_config("tiny")
    c.data.update(cache_dir=str(tmp_path_factory.mktemp("cache")), shapes_images=40, eval_count=16)
    t = SsdTask(c)
    t.prepare(0, 1)
    return t


def _detections_from_ground_truth(task, rows_per_batch=4, slots=12, seed=0):
    """NMS-style outputs (normalised boxes) and eval batches: jittered true boxes with
    random scores plus false positives, padded like the evaluator pads."""
    rng = np.random.default_rng(seed)
    data = task._require_data()
    n = len(data.eval)
    outputs, batches = [], []
    for start in range(0, n + 2 * rows_per_batch, rows_per_batch):  # two padding batches
        out = {
            "boxes": np.zeros((rows_per_batch, slots, 4), np.float32),
            "scores": np.zeros((rows_per_batch, slots), np.float32),
            "classes": np.zeros((rows_per_batch, slots), np.int32),
        }
        batch = {k: np.zeros(rows_per_batch, np.int32) for k in ("image_id", "height", "width")}
        batch["mask"] = np.zeros(rows_per_batch, np.float32)
        for r in range(rows_per_batch):
            if start + r >= n:
                continue
            rec = data.eval[start + r]
            batch["image_id"][r], batch["height"][r] = rec["image_id"], rec["height"]
            batch["width"][r], batch["mask"][r] = rec["width"], 1.0
            k = 0
            for box, label in zip(rec["boxes"], rec["labels"], strict=True):
                wh = box[2:] - box[:2]
                jitter = rng.normal(0, 0.06, 4) * np.tile(wh, 2)
                out["boxes"][r, k] = np.clip(box + jitter, 0, 1)
                out["scores"][r, k] = rng.uniform(0.2, 1.0)
                out["classes"][r, k] = label if rng.random() < 0.85 else rng.integers(1, 4)
                k += 1
            for k2 in range(k, k + 3):
                x0, y0 = rng.uniform(0, 0.7, 2)
                out["boxes"][r, k2] = [x0, y0, x0 + 0.2, y0 + 0.25]
                out["scores"][r, k2] = rng.uniform(0.05, 0.5)
                out["classes"][r, k2] = rng.integers(1, 4)
        outputs.append(out)
        batches.append(batch)
    return outputs, batches


def test_task_map_equals_pycocotools_on_a_results_json(task, tmp_path):
    outputs, batches = _detections_from_ground_truth(task)
    stats = task.host_eval_stats(outputs, batches)
    sums = {k: v[None] for k, v in stats.items()}  # one data shard
    sums["examples"] = int(stats["mask"].sum())
    metrics = task.finalize_eval(sums)
    assert metrics["eval_examples"] == 16
    assert 0.2 < metrics["mAP"] < 0.95

    path = str(tmp_path / "results.json")
    write_results(path, task.coco_results(sums))
    gt = COCO(task._require_data().eval_gt_path)
    coco_eval = COCOeval(gt, gt.loadRes(path), iouType="bbox")
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
    assert metrics["mAP"] == float(coco_eval.stats[0])
    assert metrics["AP50"] == float(coco_eval.stats[1])


def test_split_over_shards_gives_the_same_map(task):
    """Rows gathered from two data shards (as two hosts give them) score the same."""
    outputs, batches = _detections_from_ground_truth(task, rows_per_batch=2)
    whole = task.host_eval_stats(outputs, batches)
    halves = [task.host_eval_stats(outputs[i::2], batches[i::2]) for i in range(2)]
    assert len(outputs) % 2 == 0  # equal shapes per shard, as the evaluator guarantees
    sums_one = {k: v[None] for k, v in whole.items()} | {"examples": 16}
    sums_two = {k: np.stack([h[k] for h in halves]) for k in whole} | {"examples": 16}
    assert task.finalize_eval(sums_one)["mAP"] == task.finalize_eval(sums_two)["mAP"]


SMALL = [
    "--config.model.image_size=64",
    "--config.model.feature_sizes=(8,4,2,1)",
    "--config.model.steps=(8,16,32,64)",
    "--config.model.scales=(6,13,24,35,46)",
    "--config.model.aspect_ratios=((2,),(2,3),(2,),(2,))",
    "--config.model.feature_channels=(32,16,16,16)",
    "--config.model.extra_mid_channels=(16,8,8)",
    "--config.data.shapes_images=80",
    "--config.data.shapes_image_size=64",
    "--config.data.eval_count=24",
    "--config.train.steps=20",
    "--config.train.target=0.0",
    "--config.train.eval_every_samples=320",
    "--config.train.eval_batch_size=16",
    "--config.train.global_batch_size=16",
    "--config.train.log_every_steps=1",
    "--config.train.stop_at_target=False",
    "--config.checkpoint.enabled=False",
]


def _run(workdir, cache, processes: int, devices: int) -> list[dict]:
    train = [
        sys.executable,
        "-m",
        "launch.train",
        "--config=configs/ssd.py:tiny",
        f"--workdir={workdir}",
        f"--config.data.cache_dir={cache}",
        *SMALL,
    ]
    cmd = on_processes(train, processes, devices)
    proc = subprocess.run(
        cmd, cwd=REPO, env=cpu_env(devices), capture_output=True, text=True, timeout=2400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.xdist_group("ssd_multiprocess")
def test_distributed_eval_2x4_equals_1x8(tmp_path):
    cache = tmp_path / "cache"
    one = _run(tmp_path / "p1", cache, 1, 8)
    two = _run(tmp_path / "p2", cache, 2, 4)
    evals_one = [r for r in one if r["kind"] == "eval"]
    evals_two = [r for r in two if r["kind"] == "eval"]
    assert len(evals_one) == len(evals_two) == 1
    for key in ("mAP", "AP50", "AR100", "eval_examples"):
        assert evals_two[0][key] == pytest.approx(evals_one[0][key], rel=1e-6, abs=1e-9), key
    assert evals_one[0]["eval_examples"] == 24 and evals_one[0]["AR100"] > 0
    losses_one = [r["loss"] for r in one if r["kind"] == "train"]
    losses_two = [r["loss"] for r in two if r["kind"] == "train"]
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-4)
