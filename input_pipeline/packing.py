"""Sequence packing for translation: several short (inputs, targets) pairs in one row.

Google's MLPerf v0.7 Transformer trained on packed 256-token rows: each row holds as
many whole pairs as fit, with per-token segment ids (1, 2, ... per pair, 0 = padding)
and positions restarting at 0 in every pair. The model masks attention across
segments, so a packed row computes exactly what its pairs would compute one by one,
with far less padding.

Packing here is greedy first-fit over a few open rows, in a seeded order: deterministic,
so every host builds the same packed rows and the global batch order
(`grain_pipeline.GlobalOrderHostRows`) stays process-count-invariant. `first_fit` is the
rule on its own, for any sizes with a capacity per dimension (BERT's packing,
`bert_packing`, fits tokens, masked-LM predictions and sequences per row).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from input_pipeline.input_errors import InputError

PACKED_FIELDS = (
    "inputs",
    "inputs_segmentation",
    "inputs_position",
    "targets",
    "targets_segmentation",
    "targets_position",
)


def first_fit(used: np.ndarray, size: np.ndarray, capacity: np.ndarray) -> int | None:
    """Index of the first row of `used` [rows, dims] where `size` [dims] still fits under
    `capacity` [dims] in every dimension; None when it fits in none."""
    if len(used) == 0:
        return None
    fits = np.all(used + size <= capacity, axis=1)
    return int(np.argmax(fits)) if fits.any() else None


@dataclasses.dataclass
class _Row:
    inputs: list[np.ndarray] = dataclasses.field(default_factory=list)
    targets: list[np.ndarray] = dataclasses.field(default_factory=list)
    input_len: int = 0
    target_len: int = 0

    def add(self, src: np.ndarray, tgt: np.ndarray) -> None:
        self.inputs.append(src)
        self.targets.append(tgt)
        self.input_len += len(src)
        self.target_len += len(tgt)


def _fill(parts: list[np.ndarray], length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenates a row's sequences into (tokens, segment ids, positions), zero-padded."""
    tokens = np.zeros(length, np.int32)
    segments = np.zeros(length, np.int32)
    positions = np.zeros(length, np.int32)
    offset = 0
    for seg, part in enumerate(parts, start=1):
        n = len(part)
        tokens[offset : offset + n] = part
        segments[offset : offset + n] = seg
        positions[offset : offset + n] = np.arange(n)
        offset += n
    return tokens, segments, positions


def pack_pairs(
    inputs: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    length: int,
    seed: int = 0,
    open_rows: int = 8,
) -> dict[str, np.ndarray]:
    """Packs (inputs[i], targets[i]) pairs into rows of `length` tokens on each side.

    Pairs are visited in a seeded permutation; each goes into the first open row where
    both sides fit, else a new row is opened (the oldest open row is closed when
    `open_rows` are open). Returns the PACKED_FIELDS as int32 arrays [rows, length].
    A pair longer than `length` on either side is an error: filter first.
    """
    if len(inputs) != len(targets):
        raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
    if len(inputs) == 0:
        raise InputError("nothing to pack: no training pairs")
    rows_out: list[_Row] = []
    open_list: list[_Row] = []
    for i in np.random.default_rng(seed).permutation(len(inputs)):
        src, tgt = np.asarray(inputs[i]), np.asarray(targets[i])
        if len(src) > length or len(tgt) > length or len(src) == 0 or len(tgt) == 0:
            raise ValueError(
                f"pair {i} has lengths ({len(src)}, {len(tgt)}); each side must be in "
                f"[1, {length}] to pack into {length}-token rows"
            )
        used = np.array([(r.input_len, r.target_len) for r in open_list]).reshape(-1, 2)
        index = first_fit(used, np.array([len(src), len(tgt)]), np.array([length, length]))
        row = None if index is None else open_list[index]
        if row is None:
            if len(open_list) == open_rows:
                rows_out.append(open_list.pop(0))
            row = _Row()
            open_list.append(row)
        row.add(src, tgt)
    rows_out.extend(open_list)
    out = {name: np.zeros((len(rows_out), length), np.int32) for name in PACKED_FIELDS}
    for r, row in enumerate(rows_out):
        for side, parts in (("inputs", row.inputs), ("targets", row.targets)):
            tokens, segments, positions = _fill(parts, length)
            out[side][r] = tokens
            out[f"{side}_segmentation"][r] = segments
            out[f"{side}_position"][r] = positions
    return out


def unpacked_rows(
    inputs: Sequence[np.ndarray], targets: Sequence[np.ndarray], length: int
) -> dict[str, np.ndarray]:
    """One pair per row (segment 1, positions 0..n-1), padded to `length`: the unpacked
    layout with the same fields as pack_pairs, for comparisons and eval."""
    n = len(inputs)
    out = {name: np.zeros((n, length), np.int32) for name in PACKED_FIELDS}
    for r in range(n):
        for side, seq in (("inputs", inputs[r]), ("targets", targets[r])):
            tokens, segments, positions = _fill([np.asarray(seq)], length)
            out[side][r] = tokens
            out[f"{side}_segmentation"][r] = segments
            out[f"{side}_position"][r] = positions
    return out


class PackedRows:
    """Random-access view of packed rows as per-row dicts (a grain data source)."""

    def __init__(self, arrays: dict[str, np.ndarray], name: str):
        self._arrays = arrays
        self._name = name
        self._len = len(next(iter(arrays.values())))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[i] for k, v in self._arrays.items()}

    def __repr__(self) -> str:
        # Grain compares repr(data_source) when restoring an iterator: keep it short, stable.
        return f"PackedRows({self._name}, rows={self._len})"

    def efficiency(self) -> float:
        """Fraction of target slots holding real tokens."""
        seg = self._arrays["targets_segmentation"]
        return float((seg > 0).mean())
