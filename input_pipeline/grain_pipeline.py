"""Per-host grain pipelines over a random-access source: sharded shuffled training batches and
padded eval batches (big_vision's recipe).

A host reads only its shard of the records; batches are dicts of numpy arrays with a
leading host-batch dimension, ready for the `parallel` package to assemble global arrays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import grain.python as grain
import numpy as np

Batch = dict[str, np.ndarray]


class ToNumpy(grain.MapTransform):
    """Casts each feature to its declared dtype (tfds decodes scalars to Python ints)."""

    def __init__(self, dtypes: Mapping[str, str]):
        self._dtypes = dict(dtypes)

    def map(self, element: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {k: np.asarray(v, dtype=self._dtypes.get(k)) for k, v in element.items()}


def train_loader(
    source: Sequence[Any],
    host_batch_size: int,
    seed: int,
    shard_index: int,
    shard_count: int,
    dtypes: Mapping[str, str],
) -> grain.DataLoader:
    """An infinite shuffled loader over this host's shard of source.

    Shard i of n holds a contiguous 1/n of the record indices (grain's even split, sizes
    differ by at most one; see shard_size), so the shards are disjoint and their union is
    the whole source. Each epoch of a shard is a fresh permutation of it, and batches run
    across epoch boundaries, so no record is dropped. (The stream is infinite on purpose:
    grain 0.2's DataLoader cuts a finite sharded sampler to num_records // n per shard,
    silently dropping the remainder.)
    """
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
    if host_batch_size < 1:
        raise ValueError(f"host_batch_size must be >= 1, got {host_batch_size}")
    sampler = grain.IndexSampler(
        num_records=len(source),
        shard_options=grain.ShardOptions(shard_index, shard_count, drop_remainder=False),
        shuffle=True,
        num_epochs=None,
        seed=seed,
    )
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[ToNumpy(dtypes), grain.Batch(host_batch_size, drop_remainder=True)],
        # In-process reading: the examples are small and pre-built, so worker processes
        # would cost more in start-up and pickling than they save.
        worker_count=0,
    )


def shard_size(num_records: int, shard_index: int, shard_count: int) -> int:
    """Records in one shard (one epoch of its train stream): the first num_records % n shards
    hold one more."""
    return num_records // shard_count + int(shard_index < num_records % shard_count)


def padded_eval_batches(
    source: Sequence[Any],
    num_examples: int,
    global_batch_size: int,
    shard_index: int,
    shard_count: int,
    dtypes: Mapping[str, str],
) -> list[Batch]:
    """This host's eval batches: the first num_examples records, padded to whole global batches.

    Global batch b is records [b*G, (b+1)*G) of the padded set; host h gets its slice
    [h*G/n, (h+1)*G/n) of each, so every host runs the same number of batches, global batch
    b is the same whatever the host count, and each real record (mask 1) appears exactly
    once over all hosts. Padding records are zeros with mask 0.
    """
    if global_batch_size % shard_count:
        raise ValueError(
            f"global batch size {global_batch_size} is not divisible by the host count "
            f"{shard_count}"
        )
    if num_examples < 1:
        raise ValueError("the eval set is empty")
    to_numpy = ToNumpy(dtypes)
    host_batch_size = global_batch_size // shard_count
    num_batches = math.ceil(num_examples / global_batch_size)
    padding = None
    batches = []
    for b in range(num_batches):
        start = b * global_batch_size + shard_index * host_batch_size
        examples = []
        for i in range(start, start + host_batch_size):
            if i < num_examples:
                example = to_numpy.map(source[i])
                example["mask"] = np.float32(1.0)
            else:
                if padding is None:
                    padding = {k: np.zeros_like(v) for k, v in to_numpy.map(source[0]).items()}
                    padding["mask"] = np.float32(0.0)
                example = padding
            examples.append(example)
        batches.append({k: np.stack([e[k] for e in examples]) for k in examples[0]})
    return batches
