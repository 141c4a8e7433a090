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

from input_pipeline.input_errors import InputError

Batch = dict[str, np.ndarray]


class ToNumpy(grain.MapTransform):
    """Casts each feature to its declared dtype (tfds decodes scalars to Python ints)."""

    def __init__(self, dtypes: Mapping[str, str]):
        self._dtypes = dict(dtypes)

    def map(self, element: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {k: np.asarray(v, dtype=self._dtypes.get(k)) for k, v in element.items()}


class GlobalOrderHostRows:
    """This host's rows of an endless stream of global batches, as a random-access source.

    The stream is the concatenation of epochs, each a fresh seeded permutation of all
    records; global batch b is stream positions [b*G, (b+1)*G) and host h of n owns rows
    [h*G/n, (h+1)*G/n) of it. So a host reads only its own records, the hosts of one
    global batch read disjoint records whose union is that batch, an epoch covers every
    record once, and global batch b is the same whatever the number of hosts (1 process
    x 8 devices trains on exactly the data of 2 processes x 4 devices).
    """

    def __init__(
        self,
        source: Sequence[Any],
        host_batch_size: int,
        shard_index: int,
        shard_count: int,
        seed: int,
    ):
        self._source = source
        self._num_records = len(source)
        self._host_batch = host_batch_size
        self._global_batch = host_batch_size * shard_count
        self._offset = shard_index * host_batch_size
        self._seed = seed
        self._perm_epoch = -1
        self._perm = np.empty(0, np.int64)

    def __len__(self) -> int:
        return 2**62  # endless; grain's sampler walks it lazily

    def __repr__(self) -> str:
        # Grain checks a restored iterator state against repr(data_source).
        return (
            f"GlobalOrderHostRows(records={self._num_records}, "
            f"global_batch={self._global_batch}, host_batch={self._host_batch}, "
            f"offset={self._offset}, seed={self._seed}, source={self._source!r})"
        )

    def record_index(self, k: int) -> int:
        """Index into the source of this host's k-th row."""
        batch, row = divmod(k, self._host_batch)
        position = batch * self._global_batch + self._offset + row
        epoch, i = divmod(position, self._num_records)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self._seed, epoch]).permutation(self._num_records)
            self._perm_epoch = epoch
        return int(self._perm[i])

    def __getitem__(self, k: int) -> Any:
        return self._source[self.record_index(k)]


def train_loader(
    source: Sequence[Any],
    host_batch_size: int,
    seed: int,
    shard_index: int,
    shard_count: int,
    dtypes: Mapping[str, str],
    worker_count: int = 0,
    read_threads: int | None = None,
) -> grain.DataLoader:
    """An endless loader of this host's rows of the global batches (GlobalOrderHostRows).

    worker_count > 0 reads in that many grain worker processes (launch.bench.step measures
    which count pays off; pre-built examples are cheap, so the default reads in-process).
    read_threads: threads per process that read records ahead (grain's ReadOptions; None:
    grain's default of 16). 0 reads each record when the batch is made: on a 2-core host
    the reader threads and their prefetch bookkeeping cost the train step more CPU time
    than the reads they overlap (docs/design.md, "Reader threads").

    The global batch is host_batch_size x shard_count. The iterator is checkpointable
    (get_state / set_state): its state is the position in the stream.
    """
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
    if host_batch_size < 1:
        raise ValueError(f"host_batch_size must be >= 1, got {host_batch_size}")
    if len(source) == 0:
        raise InputError("the training set is empty: the data the config names holds no examples")
    rows = GlobalOrderHostRows(source, host_batch_size, shard_index, shard_count, seed)
    sampler = grain.IndexSampler(
        num_records=len(rows), shard_options=grain.NoSharding(), shuffle=False, num_epochs=1
    )
    return grain.DataLoader(
        data_source=rows,
        sampler=sampler,
        operations=[ToNumpy(dtypes), grain.Batch(host_batch_size, drop_remainder=True)],
        worker_count=worker_count,
        read_options=None if read_threads is None else grain.ReadOptions(num_threads=read_threads),
    )


def image_read_options(host_batch_size: int) -> grain.ReadOptions:
    """Read-ahead for loaders whose records are decoded, augmented images: grain's 16
    reader threads, but a buffer of a few host batches instead of its default 500
    elements (500 of Mask R-CNN's 1344 x 1344 float32 images are 11 GB of host memory;
    a few batches ahead keep the step fed as well)."""
    return grain.ReadOptions(num_threads=16, prefetch_buffer_size=max(4 * host_batch_size, 16))


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
        raise InputError(
            f"global batch size {global_batch_size} is not divisible by the host count "
            f"{shard_count}"
        )
    if num_examples < 1:
        raise InputError("the eval set is empty: the data the config names holds no eval examples")
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
