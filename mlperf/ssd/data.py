"""SSD input: per-host grain loaders of augmented, anchor-encoded training examples and
padded eval batches, over a prepared COCO-format data set.

Augmentation randomness is keyed by (seed, global stream position), not by host, so
global batch b is the same images with the same crops whatever the number of hosts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grain.python as grain
import numpy as np

from input_pipeline.detection_augment import eval_view, ssd_train_augment
from input_pipeline.grain_pipeline import (
    GlobalOrderHostRows,
    image_read_options,
    padded_eval_batches,
)
from input_pipeline.input_errors import InputError
from mlperf.ssd.boxes import BoxEncoder

_AUGMENT_STREAM = 7919  # separates augmentation randomness from the shuffle's


class SsdTrainRows:
    """This host's rows of the global training stream, augmented and encoded."""

    def __init__(
        self,
        source: Sequence[Any],
        host_batch_size: int,
        shard_index: int,
        shard_count: int,
        seed: int,
        image_size: int,
        encoder: BoxEncoder,
        colour: bool = False,
    ):
        self._rows = GlobalOrderHostRows(source, host_batch_size, shard_index, shard_count, seed)
        self._host_batch = host_batch_size
        self._global_batch = host_batch_size * shard_count
        self._offset = shard_index * host_batch_size
        self._seed = seed
        self._size = image_size
        self._encoder = encoder
        self._colour = colour

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"SsdTrainRows(size={self._size}, rows={self._rows!r})"

    def __getitem__(self, k: int) -> dict[str, np.ndarray]:
        record = self._rows[k]
        batch, row = divmod(k, self._host_batch)
        position = batch * self._global_batch + self._offset + row
        rng = np.random.default_rng([self._seed, _AUGMENT_STREAM, position])
        pixels, inst = ssd_train_augment(record, rng, self._size, self._colour)
        offsets, labels = self._encoder.encode(inst.boxes, inst.labels)
        return {"image": pixels, "boxes": offsets, "labels": labels}


def train_loader(
    source: Sequence[Any],
    host_batch_size: int,
    seed: int,
    shard_index: int,
    shard_count: int,
    image_size: int,
    encoder: BoxEncoder,
    worker_count: int = 0,
    colour: bool = False,
) -> grain.DataLoader:
    """Endless, checkpointable loader of this host's training batches (`colour`: the SSD
    photometric distortion on top of crop and flip)."""
    if len(source) == 0:
        raise InputError("the SSD training split is empty: check data.eval_count and the JSON.")
    rows = SsdTrainRows(
        source, host_batch_size, shard_index, shard_count, seed, image_size, encoder, colour
    )
    sampler = grain.IndexSampler(
        num_records=len(rows), shard_options=grain.NoSharding(), shuffle=False, num_epochs=1
    )
    return grain.DataLoader(
        data_source=rows,
        sampler=sampler,
        operations=[grain.Batch(host_batch_size, drop_remainder=True)],
        worker_count=worker_count,
        read_options=image_read_options(host_batch_size),
    )


class SsdEvalView:
    """Eval records as fixed-size model inputs plus what COCO results need."""

    def __init__(self, source: Sequence[Any], image_size: int):
        self._source = source
        self._size = image_size

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        record = self._source[i]
        return {
            "image": eval_view(record, self._size),
            "image_id": np.int32(record["image_id"]),
            "height": np.int32(record["height"]),
            "width": np.int32(record["width"]),
        }


EVAL_DTYPES = {"image": "uint8", "image_id": "int32", "height": "int32", "width": "int32"}


def eval_batches(
    source: Sequence[Any],
    image_size: int,
    global_batch_size: int,
    shard_index: int,
    shard_count: int,
    max_examples: int = 0,
) -> list[dict[str, np.ndarray]]:
    """This host's padded eval batches (mask 0 on padding rows)."""
    view = SsdEvalView(source, image_size)
    n = len(view) if max_examples <= 0 else min(max_examples, len(view))
    return padded_eval_batches(view, n, global_batch_size, shard_index, shard_count, EVAL_DTYPES)
