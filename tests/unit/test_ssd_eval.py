"""SSD eval: the task's COCO mAP equals pycocotools on the same detections written to a
results JSON; distributed eval on 2 processes x 4 devices equals 1 process x 8, the image
height split over the model axis in both."""

from __future__ import annotations

import json
import os
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
    return t.with_data(t.prepare(0, 1))


def _detections_from_ground_truth(task, rows_per_batch=4, slots=12, seed=0):
    """NMS-style outputs (normalised boxes) and eval batches: jittered true boxes with
    random scores plus false positives, padded like the evaluator pads."""
    rng = np.random.default_rng(seed)
    data = task.data.coco
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
    gt = COCO(task.data.coco.eval_gt_path)
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


def small_eval_config(cache: str):
    """The tiny SSD shrunk to 64 pixels (levels 8, 4, 2, 1) on 24 eval images, its image
    height split 4 ways (spatial partitioning, data=2 x model=4): a process is sent only
    its devices' rows of pixels."""
    c = get_config("tiny")
    c.model.spatial_partitions = 4
    c.mesh.ici_shape = (-1, 4)
    c.parallel.rules = (("height", "model"),)
    c.model.update(
        image_size=64,
        feature_sizes=(8, 4, 2, 1),
        steps=(8, 16, 32, 64),
        scales=(6, 13, 24, 35, 46),
        aspect_ratios=((2,), (2, 3), (2,), (2,)),
        feature_channels=(16, 16, 8, 8),
        extra_mid_channels=(8, 8, 8),
    )
    c.data.update(cache_dir=cache, shapes_images=56, shapes_image_size=64, eval_count=24)
    c.train.update(global_batch_size=16, eval_batch_size=16)  # 24 images: 2 batches, padded
    return c


def eval_worker(out_path: str, cache: str) -> None:
    """One process of the distributed eval test (run as a script, under launch.local for
    several processes): the in-loop evaluator on the seeded initial parameters of the
    small SSD over every process's devices; process 0 writes the metrics as JSON. No
    train step is compiled, so the test is mostly one eval-step compile per process."""
    import jax

    from launch.distributed import init_distributed
    from mlperf.evaluate import Evaluator
    from mlperf.trainer import build_trainer

    env = os.environ
    init_distributed(
        env.get("MULTIPOD_COORDINATOR"),
        int(env.get("MULTIPOD_NUM_PROCESSES", "1")),
        int(env.get("MULTIPOD_PROCESS_ID", "0")),
        False,
        600,
    )
    config = small_eval_config(cache)
    trainer = build_trainer(config)
    p, ebs = trainer.partitioner, config.train.eval_batch_size
    layout = p.data_layout(ebs)
    batches = trainer.task.eval_data(ebs, layout.shard_index, layout.shard_count)
    evaluator = Evaluator(trainer.task, trainer.layout, p, batches, ebs)
    metrics = evaluator.evaluate(trainer.init_state()["params"])
    if jax.process_index() == 0:
        with open(out_path, "w") as f:
            json.dump({**metrics, "host_examples": evaluator.num_examples}, f)


def _run(out, cache, processes: int, devices: int) -> dict:
    worker = [sys.executable, os.path.abspath(__file__), str(out), str(cache)]
    # The worker imports conftest from tests/, one folder above this file's.
    env = cpu_env(devices) | {"PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "tests")])}
    proc = subprocess.run(
        on_processes(worker, processes, devices),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow  # eval subprocesses on 1 x 8 and 2 x 4 (CI: make test-ci-slow)
@pytest.mark.xdist_group("ssd_multiprocess")
def test_distributed_eval_2x4_equals_1x8(tmp_path):
    cache = tmp_path / "cache"
    one = _run(tmp_path / "one.json", cache, 1, 8)
    two = _run(tmp_path / "two.json", cache, 2, 4)
    assert one["eval_examples"] == two["eval_examples"] == 24
    # Two padded batches of 16: process 0 holds rows 0-7 and 16-23 (process 1: rows 8-15
    # and the padding).
    assert one["host_examples"] == 24 and two["host_examples"] == 16
    # The same detections reach COCOeval from one host or gathered from two.
    for key in ("mAP", "AP50", "AP75", "AR100"):
        assert two[key] == pytest.approx(one[key], rel=1e-6, abs=1e-9), key
    assert one["AR100"] > 0 and one["mAP"] > 0  # untrained, but its many boxes hit some


if __name__ == "__main__":
    eval_worker(sys.argv[1], sys.argv[2])
