"""COCO box and mask mAP of a Mask R-CNN run's checkpoint and of the untrained model, on
the eval split and on the training split, outside the training loop.

    python -m launch.bench.maskrcnn_split_eval --workdir W [--step N]

The config comes from the checkpoint (a run's workdir); the untrained parameters are
the initialisation of that config's seed: the baseline that a trained model's mAP must
be well above. The training split is scored against its own COCO ground truth
(the annotations of the training images), which shows what the model learnt as opposed
to how it generalises. Images are resized and padded as in eval (no augmentation).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from absl import app, flags

_WORKDIR = flags.DEFINE_string("workdir", "", "The run's work directory (its checkpoints).")
_STEP = flags.DEFINE_integer("step", -1, "Checkpoint step; -1: the latest.")


def _config_and_step(workdir: str, step: int):
    """The run's config (from its checkpoint metadata) and the checkpoint step."""
    from ml_collections import ConfigDict

    from mlperf.checkpoint import checkpoint_metadata

    directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    step, meta = checkpoint_metadata(directory, step, workdir)
    return ConfigDict(meta["config"]), directory, step


def _write_ground_truth(task, records) -> str:
    """`records`' COCO ground truth (the kept categories) as a JSON file in /tmp."""
    fd, path = tempfile.mkstemp(prefix="maskrcnn_gt_", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(task.ground_truth_of(records), f)
    return path


def split_metrics(workdir: str, step: int = -1) -> list[dict[str, Any]]:
    """Box and mask mAP (and AP50) of the checkpoint and of the initial parameters, on
    the eval split and on the training split (one compiled eval step for all four)."""
    import jax

    from mlperf.checkpoint import CheckpointConfig, Checkpointer
    from mlperf.evaluate import Evaluator
    from mlperf.trainer import build_trainer

    config, directory, step = _config_and_step(workdir, step)
    trainer = build_trainer(config)
    task = trainer.task
    ckpt = Checkpointer(CheckpointConfig(directory), task.target_metric, read_only=True)
    trained = ckpt.restore_step(step, trainer.layout.abstract_train_state).state["params"]
    ckpt.close()
    untrained = trainer.init_state()["params"]
    data = task.data.coco
    size = config.train.eval_batch_size
    layout = trainer.partitioner.data_layout(size)
    evaluator, results = None, []
    for split, records in (("eval", data.eval), ("train", data.train)):
        gt = data.eval_gt_path if split == "eval" else _write_ground_truth(task, records)
        scored = task.scored_against(gt)
        batches = task.eval_batches(records, size, layout.shard_index, layout.shard_count)
        if evaluator is None:
            evaluator = Evaluator(scored, trainer.layout, trainer.partitioner, batches, size)
        # Same shapes: the compiled step is reused with the other split and ground truth.
        evaluator.task, evaluator.host_batches = scored, batches
        for name, params in (("untrained", untrained), (f"step {step}", trained)):
            metrics = evaluator.evaluate(params)
            metrics.update(split=split, params=name, images=len(records))
            results.append(jax.tree.map(lambda x: x.item() if hasattr(x, "item") else x, metrics))
    return results


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir (a Mask R-CNN run's work directory) is required.")
    for metrics in split_metrics(_WORKDIR.value, _STEP.value):
        print(json.dumps(metrics, sort_keys=True), flush=True)


if __name__ == "__main__":
    app.run(main)
