"""Distributed in-loop evaluator.

Every host feeds the same number of padded eval batches (big_vision's recipe); the
jitted eval step returns per-batch sums over real examples (weighted by `mask`), which
XLA reduces across the whole mesh. Sums stay on device until the end of the pass, so
one transfer per eval; integer counts make the metric identical on 1 device, 8
devices and several processes.

Metrics that need the host (BLEU from decoded text, COCO mAP from detections) use the
optional task methods `eval_outputs` (per-example device outputs, e.g. beam-search
tokens or NMS detections) and `host_eval_stats` (numpy stats from this host's rows).
Every host computes stats on its own rows; they are gathered with a leading shard axis
and handed to `finalize_eval` with the device sums. A task with `async_finalize = True`
(COCOeval takes seconds) gets its `finalize_eval` run in a background thread while
training continues.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from input_pipeline.input_errors import InputError
from mlperf.steps import batch_abstract, make_eval_step, spec_of
from mlperf.task import Task
from mlperf.train_state import StateLayout
from parallel.partition import Partitioner


def _local_value(x: jax.Array) -> np.ndarray:
    """The value of a replicated global array, read from this process's own copy."""
    return np.asarray(x.addressable_data(0))


class Evaluator:
    """Compiles the eval step once and runs full passes over this host's eval batches."""

    def __init__(
        self,
        task: Task,
        layout: StateLayout,
        partitioner: Partitioner,
        host_batches: list[dict[str, np.ndarray]],
        global_batch_size: int,
    ):
        if not host_batches:
            raise InputError("the eval set is empty: check data.eval_files / eval_fraction.")
        self.task = task
        self.partitioner = partitioner
        self.host_batches = host_batches
        self.layout = partitioner.data_layout(global_batch_size)
        abstract = batch_abstract(partitioner, spec_of(host_batches[0]), global_batch_size)
        params = layout.abstract_train_state["params"]
        self.with_outputs = task.host_metrics
        step = eval_program(task, layout, partitioner, params, abstract)
        self.compiled = step.lower(params, abstract).compile()

    @property
    def num_examples(self) -> int:
        """Real (unpadded) examples on this host."""
        return int(sum(np.sum(b["mask"]) for b in self.host_batches))

    def run_pass(self, params: Any) -> dict[str, np.ndarray]:
        """One pass over this host's eval batches: the global sums, plus (for tasks with
        host metrics) every data shard's host stats as name -> [shard_count, ...]."""
        total, outputs = None, []
        for host_batch in self.host_batches:
            batch = self.partitioner.host_to_global(host_batch, self.layout)
            out = self.compiled(params, batch)
            if self.with_outputs:
                out, per_example = out
                outputs.append(self.partitioner.global_to_host(per_example, self.layout))
            total = out if total is None else jax.tree.map(lambda a, b: a + b, total, out)
        result = dict(jax.tree.map(_local_value, total))
        if self.with_outputs:
            stats = self.task.host_eval_stats(outputs, self.host_batches)
            result.update(self.partitioner.gather_host_stats(stats, self.layout))
        return result

    def start(self, params: Any) -> Callable[[], dict[str, float]]:
        """Runs the device part of an eval now; returns a function giving the metrics.

        With `task.async_finalize` the host part runs in a thread and the returned
        function waits for it; otherwise the metrics are ready on return.
        """
        sums = self.run_pass(params)
        if not self.task.async_finalize:
            metrics = self.task.finalize_eval(sums)
            return lambda: metrics
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                result["metrics"] = self.task.finalize_eval(sums)
            except BaseException as e:  # re-raised in the training thread
                result["error"] = e

        thread = threading.Thread(target=work, name="eval-finalize", daemon=True)
        thread.start()

        def wait() -> dict[str, float]:
            thread.join()
            if "error" in result:
                raise result["error"]
            return result["metrics"]

        return wait

    def evaluate(self, params: Any) -> dict[str, float]:
        """Final metrics (task.finalize_eval over the global sums), waiting for them."""
        return self.start(params)()


def evaluate_sets(
    sets: Mapping[str, Callable[[], Task]],
    params: Any,
    layout: StateLayout,
    partitioner: Partitioner,
    global_batch_size: int,
    names: Sequence[str] = (),
) -> dict[str, dict[str, float]]:
    """The metrics of `params` on each set of `sets` (name -> a function building the
    task whose eval data is that set: `Task.final_eval_sets`), or on those in `names`,
    each with the seconds it took (building its data included) as `eval_s`."""
    unknown = sorted(set(names) - set(sets))
    if unknown:
        raise InputError(f"unknown final eval sets {unknown}; eval.final_sets has {sorted(sets)}")
    results = {}
    for name, build in sets.items():
        if names and name not in names:
            continue
        start = time.perf_counter()
        task = build()
        shards = partitioner.data_layout(global_batch_size)
        batches = task.eval_data(global_batch_size, shards.shard_index, shards.shard_count)
        evaluator = Evaluator(task, layout, partitioner, batches, global_batch_size)
        metrics = evaluator.evaluate(params)
        metrics["eval_s"] = time.perf_counter() - start
        results[name] = metrics
        if jax.process_index() == 0:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())
            print(f"final eval {name}: {shown}", flush=True)
    return results


def eval_program(
    task: Task, layout: StateLayout, partitioner: Partitioner, params: Any, abstract: Any
):
    """The jitted eval step: the task's on-device sums and, for tasks with host metrics
    (COCO mAP, BLEU), the per-example outputs too, in one program, so the forward pass
    they share runs (and the global batch is assembled) once per batch. Outputs stay
    sharded over `batch`: each host reads back only its own rows. `params` and
    `abstract` (the batch) may be abstract; they give the output shapes."""
    sums_fn = make_eval_step(task.eval_sums, layout)
    if not task.host_metrics:
        fn, out_shardings = sums_fn, partitioner.replicated()
    else:
        outputs_fn = make_eval_step(task.eval_outputs, layout)

        def fn(p, b):
            return sums_fn(p, b), outputs_fn(p, b)

        _, shapes = jax.eval_shape(fn, params, abstract)
        row_shardings = jax.tree.map(
            lambda s: partitioner.sharding(partitioner.batch_spec(s.ndim)), shapes
        )
        out_shardings = (partitioner.replicated(), row_shardings)
    return partitioner.jit(
        fn, in_shardings=(layout.state_shardings["params"], None), out_shardings=out_shardings
    )
