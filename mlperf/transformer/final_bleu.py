"""Final BLEU of a Transformer run on whole eval sets, computed once after training.

The in-loop eval decodes a fixed subset of the validation set (`data.max_eval_examples`)
so that beam search stays a modest part of the run; the score that is reported for a
finished run is this one: beam search over every sentence of each set in
`eval.final_sets` (name -> (source file, target file), relative to data.data_dir),
with the same distributed evaluator (statistics summed over hosts).

`TransformerTask.final_eval_sets` names the sets (`final_sets`); the trainer evaluates
them inside the training process, which still holds the trained parameters;
`python -m launch.final_bleu` runs `evaluate_sets` on a finished run's newest checkpoint
and records the result (`record`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import jax

from input_pipeline.translation_data import build_translation_data
from mlperf import evaluate
from mlperf.config_error import ConfigError
from mlperf.task import Task


def set_config(config, source: str, target: str):
    """A copy of `config` whose eval set is the whole (source, target) file pair."""
    c = config.copy_and_resolve_references()
    with c.unlocked():
        c.data.eval_files = (source, target)
        c.data.max_eval_examples = 0
    return c


def final_sets(task: Task) -> dict[str, Callable[[], Task]]:
    """Name -> a function building the task whose eval set is that whole set of the
    task's config.eval.final_sets (built when it is evaluated)."""

    def builder(source: str, target: str) -> Callable[[], Task]:
        def build() -> Task:
            set_cfg = set_config(task.config, source, target)
            # Evaluation only: the training rows are not packed.
            return type(task)(set_cfg, build_translation_data(set_cfg.data, with_train=False))

        return build

    sets = task.config.eval.get("final_sets", None) or {}
    return {name: builder(source, target) for name, (source, target) in sets.items()}


def evaluate_sets(
    task: Task, params: Any, layout, partitioner, names: list[str] | None = None
) -> dict[str, dict[str, float]]:
    """BLEU (and teacher-forced loss) of `params` on the sets of the task's
    config.eval.final_sets (all, or those in `names`)."""
    sets = task.final_eval_sets()
    if not sets:
        raise ConfigError(
            "config.eval.final_sets is empty: give name -> (source file, target file) pairs."
        )
    batch = task.eval_plan().global_batch_size
    return evaluate.evaluate_sets(sets, params, layout, partitioner, batch, names or ())


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
