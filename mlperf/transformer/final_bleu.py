"""Final BLEU of a Transformer run on whole eval sets, computed once after training.

The in-loop eval decodes a fixed subset of the validation set (`data.max_eval_examples`)
so that beam search stays a modest part of the run; the score that is reported for a
finished run is this one: beam search over every sentence of each set in
`eval.final_sets` (name -> (source file, target file), relative to data.data_dir),
with the same distributed evaluator (statistics summed over hosts).

    python -m mlperf.transformer.final_bleu --config configs/transformer.py:multi30k \
        --workdir W [--config.data.data_dir=/work/shared/data]

restores the newest checkpoint in W (the run's last step: the loop checkpoints at every
eval and the last step is an eval), writes W/final_bleu.json, appends one
{"kind": "final_eval"} line per set to W/metrics.jsonl and adds "final_eval" to
W/result.json. `TransformerTask.final_eval` runs the same from inside a process that
still holds the trained parameters.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
from absl import app, flags
from ml_collections import config_flags

from mlperf.evaluate import Evaluator


def set_config(config, source: str, target: str):
    """A copy of `config` whose eval set is the whole (source, target) file pair."""
    c = config.copy_and_resolve_references()
    with c.unlocked():
        c.data.eval_files = (source, target)
        c.data.max_eval_examples = 0
    return c


def evaluate_sets(
    config, params: Any, layout, partitioner, names: list[str] | None = None
) -> dict[str, dict[str, float]]:
    """BLEU (and teacher-forced loss) of `params` on the sets of config.eval.final_sets
    (all, or those in `names`)."""
    from mlperf.transformer.task import TransformerTask  # the task imports this module

    sets = config.eval.get("final_sets", None) or {}
    if not sets:
        raise ValueError(
            "config.eval.final_sets is empty: give name -> (source file, target file) pairs."
        )
    unknown = sorted(set(names or ()) - set(sets))
    if unknown:
        raise ValueError(f"unknown final eval sets {unknown}; eval.final_sets has {sorted(sets)}")
    batch = int(config.train.eval_batch_size)
    results = {}
    for name, (source, target) in sets.items():
        if names and name not in names:
            continue
        start = time.perf_counter()
        task = TransformerTask(set_config(config, source, target), with_train=False)
        data_layout = partitioner.data_layout(batch)
        task.prepare(data_layout.shard_index, data_layout.shard_count)
        batches = task.eval_data(batch, data_layout.shard_index, data_layout.shard_count)
        evaluator = Evaluator(task, layout, partitioner, batches, batch)
        metrics = evaluator.evaluate(params)
        metrics["eval_s"] = time.perf_counter() - start
        results[name] = metrics
        if jax.process_index() == 0:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())
            print(f"final eval {name}: {shown}", flush=True)
    return results


def record(workdir: str, step: int, results: dict[str, dict[str, float]]) -> None:
    """Writes final_bleu.json, metrics.jsonl lines and result.json["final_eval"] (process 0)."""
    if jax.process_index() != 0:
        return
    path = os.path.join(workdir, "final_bleu.json")
    previous = {}
    if os.path.exists(path):  # sets evaluated by separate calls accumulate
        with open(path) as f:
            previous = json.load(f)
        if previous.get("step") != step:
            previous = {}
    merged = {**{k: v for k, v in previous.items() if k != "step"}, **results}
    with open(path, "w") as f:
        json.dump({"step": step, **merged}, f, indent=2)
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        for name, metrics in results.items():
            f.write(json.dumps({"step": step, "kind": "final_eval", "set": name, **metrics}))
            f.write("\n")
    result_path = os.path.join(workdir, "result.json")
    if os.path.exists(result_path):
        with open(result_path) as f:
            result = json.load(f)
        result["final_eval"] = {"step": step, **merged}
        with open(result_path, "w") as f:
            json.dump(result, f, indent=2)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from mlperf.checkpoint import CheckpointConfig, Checkpointer
    from mlperf.train import build_trainer

    config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
    if config is None or not workdir:
        raise app.UsageError("--config and --workdir are required.")
    # The layout only: the model's vocabulary size is the config's, rounded up as in training.
    trainer = build_trainer(config, prepare_data=False)
    checkpointer = Checkpointer(
        CheckpointConfig.from_config(config, workdir), trainer.task.target_metric, read_only=True
    )
    restored = checkpointer.restore_latest(trainer.layout.abstract_train_state)
    if restored is None:
        raise SystemExit(f"no checkpoint under {workdir}: train first (launch.train).")
    names = [n for n in flags.FLAGS.sets.split(",") if n] or list(config.eval.final_sets)
    for name in names:  # recorded one by one: a long second set does not hold up the first
        results = evaluate_sets(
            config, restored.state["params"], trainer.layout, trainer.partitioner, [name]
        )
        record(workdir, restored.step, results)


if __name__ == "__main__":
    # Defined here, not at import: the task imports this module inside launch.train,
    # which has its own --config flag.
    config_flags.DEFINE_config_file(
        "config", None, "The run's config, e.g. configs/transformer.py:multi30k."
    )
    flags.DEFINE_string("workdir", None, "The finished run's work directory.")
    flags.DEFINE_string("sets", "", "Comma-separated names of eval.final_sets ('' = all).")
    app.run(main)
