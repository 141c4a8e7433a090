"""Per-example outputs of a restored model over padded batches, on the mesh.

The same program the evaluator compiles for its per-example outputs (a task's
`eval_outputs`, or any function of (model, batch)), jitted with the batch sharded over
`batch` and the outputs read back row by row; a batch that is not full is padded with
rows of zeros, whose outputs are dropped. One process: this host feeds the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np

from mlperf.steps import make_eval_step

Batch = dict[str, np.ndarray]


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n (and >= multiple)."""
    return max(multiple, -(-n // multiple) * multiple)


class BatchRunner:
    """Runs `fn(model, batch) -> {name: [B, ...]}` of a TrainedModel on host batches."""

    def __init__(self, trained, fn: Callable[[Any, Batch], dict[str, jax.Array]]):
        self.trained = trained
        partitioner, layout = trained.partitioner, trained.layout
        step = make_eval_step(fn, layout)
        param_shardings = layout.state_shardings["params"]

        def program(params, batch):
            out = step(params, batch)
            return jax.tree.map(partitioner.constrain_batch, out)

        self._compiled = partitioner.jit(program, in_shardings=(param_shardings, None))

    def batch_multiple(self) -> int:
        """Rows of a batch must be a multiple of this: the ways `batch` is split."""
        return self.trained.partitioner.batch_shards()

    def batch_size(self, wanted: int) -> int:
        """`wanted` rows rounded up to a whole number of rows per data shard."""
        return round_up(max(wanted, 1), self.batch_multiple())

    def __call__(self, host_batch: Batch) -> Batch:
        """Outputs of one full batch (its rows a multiple of `batch_multiple()`)."""
        partitioner = self.trained.partitioner
        rows = len(next(iter(host_batch.values())))
        layout = partitioner.data_layout(rows)
        batch = partitioner.host_to_global(host_batch, layout)
        out = self._compiled(self.trained.params, batch)
        return partitioner.global_to_host(out, layout)

    def run(self, examples: Iterable[Batch], batch_size: int) -> Iterator[Batch]:
        """Outputs per example (dicts of arrays without the batch dim), in order, over
        batches of `batch_size` rows (the last padded with zero rows)."""
        chunk: list[Batch] = []
        for example in examples:
            chunk.append(example)
            if len(chunk) == batch_size:
                yield from self._run_chunk(chunk, batch_size)
                chunk = []
        if chunk:
            yield from self._run_chunk(chunk, batch_size)

    def _run_chunk(self, chunk: list[Batch], batch_size: int) -> Iterator[Batch]:
        batch = pad_stack(chunk, batch_size)
        out = self(batch)
        for i in range(len(chunk)):
            yield {k: v[i] for k, v in out.items()}


def pad_stack(examples: list[Batch], rows: int) -> Batch:
    """Examples stacked into a batch of `rows` rows, padded with zeros."""
    out = {}
    for name in examples[0]:
        first = np.asarray(examples[0][name])
        stacked = np.zeros((rows, *first.shape), first.dtype)
        for i, example in enumerate(examples):
            stacked[i] = example[name]
        out[name] = stacked
    return out
