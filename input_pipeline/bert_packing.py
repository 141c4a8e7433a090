"""BERT sequence packing: several pretraining examples in one row of `seq_length` tokens.

As in later MLPerf BERT rounds (Krell et al., "Efficient sequence packing without
cross-contamination"), a packed row holds up to `max_sequences` whole examples one after
another. Per token it carries `sequence_ids` (1, 2, ... per example, 0 = padding) and
`positions` restarting at 0 in every example; the model attends within a sequence only,
so a packed row computes what its examples compute one by one. Per row it carries the
examples' masked-LM predictions (`max_predictions` slots, offsets shifted into the row)
and per packed sequence its [CLS] position, next-sentence label and weight (1 for a real
sequence, 0 for an empty slot).

Packing is online, after the seeded random order of the unpacked pipeline: this host's
examples are read in the order of `grain_pipeline.GlobalOrderHostRows` (a fresh seeded
permutation every epoch) and placed first-fit (`packing.first_fit`) into the rows of the
batch being built. An example that fits in no row waits for the next batch; a batch is
done when `carry` examples wait. So the traversal order is as random as the unpacked
one's and differs with the random seed, as the MLPerf training rules require of
packing.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from input_pipeline.grain_pipeline import GlobalOrderHostRows, ToNumpy
from input_pipeline.input_errors import InputError
from input_pipeline.packing import first_fit

Batch = dict[str, np.ndarray]
# Features of an unpacked example that packing rewrites (every other one is an error).
EXAMPLE_FIELDS = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)


@dataclasses.dataclass(frozen=True)
class PackingConfig:
    """How examples are packed: row length, masked-LM slots per row, sequences per row,
    and how many examples may wait for the next batch before a batch is done."""

    seq_length: int
    max_predictions: int
    max_sequences: int
    carry: int

    def __post_init__(self):
        for name in ("seq_length", "max_predictions", "max_sequences", "carry"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"data.packing: {name} must be >= 1, got {getattr(self, name)!r}")


def packing_config(data_cfg, seq_length: int, max_predictions: int) -> PackingConfig | None:
    """The config's `data.packing` for a phase of (seq_length, max_predictions) per
    example; None when packing is off. Bad values raise a one-line InputError."""
    packing = data_cfg.get("packing")
    if packing is None or not packing.get("enabled", False):
        return None
    if not isinstance(packing.enabled, bool):
        raise InputError(f"data.packing.enabled must be True or False, got {packing.enabled!r}")
    sequences = packing.get("max_sequences", 3)
    per_row = packing.get("max_predictions", 0)
    carry = packing.get("carry", 16)
    for name, value in (("max_sequences", sequences), ("max_predictions", per_row)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(f"data.packing.{name} must be an integer >= 0, got {value!r}")
    if sequences < 1:
        raise InputError("data.packing.max_sequences must be >= 1 (sequences per packed row)")
    if not isinstance(carry, int) or carry < 1:
        raise InputError(f"data.packing.carry must be an integer >= 1, got {carry!r}")
    # 0: one example's slots plus one per further sequence (15% of a full row, rounded
    # up once per sequence), which is what MLPerf packing implementations use.
    if 0 < per_row < max_predictions:
        raise ValueError(
            f"data.packing.max_predictions={per_row} is fewer than one example's "
            f"{max_predictions} masked-LM predictions: raise it (or 0 for the default)"
        )
    per_row = per_row or max_predictions + sequences - 1
    return PackingConfig(int(seq_length), int(per_row), int(sequences), int(carry))


def packed_feature_spec(cfg: PackingConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of one packed row's features."""
    length, preds, seqs = (cfg.seq_length,), (cfg.max_predictions,), (cfg.max_sequences,)
    return {
        "input_ids": (length, "int32"),
        "input_mask": (length, "int32"),
        "segment_ids": (length, "int32"),
        "positions": (length, "int32"),
        "sequence_ids": (length, "int32"),
        "masked_lm_positions": (preds, "int32"),
        "masked_lm_ids": (preds, "int32"),
        "masked_lm_weights": (preds, "float32"),
        "cls_positions": (seqs, "int32"),
        "next_sentence_labels": (seqs, "int32"),
        "next_sentence_weights": (seqs, "float32"),
    }


def example_size(example: Mapping[str, np.ndarray]) -> np.ndarray:
    """(tokens, masked-LM predictions, 1) of an unpacked example: what it takes of a row."""
    tokens = int(np.count_nonzero(example["input_mask"]))
    predictions = int(np.count_nonzero(example["masked_lm_weights"]))
    return np.array([tokens, predictions, 1])


def capacity(cfg: PackingConfig) -> np.ndarray:
    """A row's room, as `example_size` counts it."""
    return np.array([cfg.seq_length, cfg.max_predictions, cfg.max_sequences])


def fill_rows(rows: Sequence[Sequence[Mapping[str, np.ndarray]]], cfg: PackingConfig) -> Batch:
    """Packed rows [len(rows), ...] from each row's examples, in order."""
    spec = packed_feature_spec(cfg)
    out = {k: np.zeros((len(rows), *shape), dtype) for k, (shape, dtype) in spec.items()}
    for r, examples in enumerate(rows):
        offset = slot = 0
        for s, ex in enumerate(examples):
            n, preds, _ = example_size(ex)
            if offset + n > cfg.seq_length or slot + preds > cfg.max_predictions:
                raise ValueError(f"row {r}'s examples do not fit {capacity(cfg).tolist()}")
            tokens = slice(offset, offset + n)
            out["input_ids"][r, tokens] = ex["input_ids"][:n]
            out["input_mask"][r, tokens] = 1
            out["segment_ids"][r, tokens] = ex["segment_ids"][:n]
            out["positions"][r, tokens] = np.arange(n)
            out["sequence_ids"][r, tokens] = s + 1
            real = np.flatnonzero(ex["masked_lm_weights"])
            slots = slice(slot, slot + preds)
            out["masked_lm_positions"][r, slots] = ex["masked_lm_positions"][real] + offset
            out["masked_lm_ids"][r, slots] = ex["masked_lm_ids"][real]
            out["masked_lm_weights"][r, slots] = ex["masked_lm_weights"][real]
            out["cls_positions"][r, s] = offset
            out["next_sentence_labels"][r, s] = ex["next_sentence_labels"]
            out["next_sentence_weights"][r, s] = 1.0
            offset += n
            slot += preds
    return out


def pack_examples(
    examples: Sequence[Mapping[str, np.ndarray]], cfg: PackingConfig
) -> tuple[Batch, list[list[int]]]:
    """All `examples`, in their order, first-fit into as many rows as they need: (packed
    rows, the example indices of each row). For tests and the padding measurement."""
    limit = capacity(cfg)
    used = np.zeros((0, 3), np.int64)
    members: list[list[int]] = []
    for i, ex in enumerate(examples):
        size = example_size(ex)
        if np.any(size > limit):
            raise ValueError(f"example {i} has size {size.tolist()} > a row's {limit.tolist()}")
        row = first_fit(used, size, limit)
        if row is None:
            used = np.concatenate([used, size[None]])
            members.append([i])
        else:
            used[row] += size
            members[row].append(i)
    return fill_rows([[examples[i] for i in m] for m in members], cfg), members


def padding_fraction(examples: Sequence[Mapping[str, np.ndarray]], seq_length: int) -> float:
    """Fraction of the token slots that are padding when each example has its own row."""
    tokens = sum(int(np.count_nonzero(ex["input_mask"])) for ex in examples)
    return 1.0 - tokens / (len(examples) * seq_length)


class PackedTrainIterator:
    """Endless host batches of packed rows, packed online in the seeded random order.

    This host's k-th example is `GlobalOrderHostRows(source, 1, shard_index,
    shard_count, seed)[k]`: the hosts share each epoch's permutation, interleaved. A batch
    places the examples that waited from the last batch first, then the next ones in
    order, each first-fit into the batch's `host_batch_size` rows; an example that fits
    in none waits (`cfg.carry` of them end the batch; at most one per row, so every one
    fits in the next batch). Checkpointable: get_state() / set_state() hold the position
    in the order and the waiting examples.
    """

    def __init__(
        self,
        source: Sequence[Any],
        host_batch_size: int,
        cfg: PackingConfig,
        seed: int,
        shard_index: int,
        shard_count: int,
        dtypes: Mapping[str, str],
    ):
        if host_batch_size < 1:
            raise ValueError(f"host_batch_size must be >= 1, got {host_batch_size}")
        if len(source) == 0:
            raise InputError(
                "the training set is empty: the data the config names holds no examples"
            )
        self._order = GlobalOrderHostRows(source, 1, shard_index, shard_count, seed)
        self._rows = host_batch_size
        self._cfg = cfg
        self._carry_limit = min(cfg.carry, host_batch_size)
        self._to_numpy = ToNumpy(dtypes)
        self._position = 0
        self._waiting: list[int] = []

    def __iter__(self) -> PackedTrainIterator:
        return self

    def _example(self, k: int) -> dict[str, np.ndarray]:
        example = self._to_numpy.map(self._order[k])
        return {name: example[name] for name in EXAMPLE_FIELDS}

    def __next__(self) -> Batch:
        limit = capacity(self._cfg)
        used = np.zeros((self._rows, 3), np.int64)
        rows: list[list[dict[str, np.ndarray]]] = [[] for _ in range(self._rows)]
        waiting, self._waiting = self._waiting, []
        while len(self._waiting) < self._carry_limit:
            if waiting:
                k = waiting.pop(0)
            else:
                k, self._position = self._position, self._position + 1
            example = self._example(k)
            size = example_size(example)
            if np.any(size > limit):
                raise InputError(
                    f"a training example has size {size.tolist()} (tokens, predictions, 1) "
                    f"> a packed row's {limit.tolist()}: raise data.packing.max_predictions"
                )
            row = first_fit(used, size, limit)
            if row is None:
                self._waiting.append(k)
            else:
                used[row] += size
                rows[row].append(example)
        return fill_rows(rows, self._cfg)

    def get_state(self) -> dict[str, Any]:
        return {"position": self._position, "waiting": list(self._waiting)}

    def set_state(self, state: bytes | str | Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping):
            state = json.loads(state)
        self._position = int(state["position"])
        self._waiting = [int(k) for k in state["waiting"]]
