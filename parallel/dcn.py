"""Which collectives of a compiled multi-slice step cross the data-centre network (DCN).

The TPU compiler splits a multi-slice program (libtpu's "megascale"): every collective
over a mesh axis that spans slices becomes its ICI part, a collective inside each slice
(replica groups of that slice's devices), and its DCN part, a host transfer: a `send`
(with its `recv`) whose `_xla_megascale_transfer_type` is ALL_REDUCE, REDUCE_SCATTER,
ALL_GATHER, ALL_TO_ALL or ONE_TO_ONE and whose operand is what this device sends.
`dcn_collectives` counts those sends, their bytes and, with a ring over the slices, the
bytes each device puts on DCN: the planner's DCN term.

A program compiled without that split (one SPMD program whose replica groups hold
devices of several slices) is read through its replica groups instead: partition ids
are positions in the mesh's flattened device order, and a group with devices of more
than one slice crosses DCN (a group's devices inside one slice share the slow hop).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from parallel.hlo_text import COLLECTIVES, INSTR, SHAPE, repeated_link, shape_bytes, wire_bytes


def _iota(dims_text: str, reshape_text: str, transpose_text: str | None) -> np.ndarray:
    """XLA's iota device list `[G,S]<=[a,b]T(1,0)`: iota(prod) reshaped, transposed."""
    reshape = [int(d) for d in reshape_text.split(",") if d]
    ids = np.arange(int(np.prod(reshape))).reshape(reshape)
    if transpose_text:
        ids = ids.transpose([int(d) for d in transpose_text.split(",")])
    return ids.reshape([int(d) for d in dims_text.split(",") if d])


def replica_groups(instr_text: str, num_devices: int) -> list[list[int]]:
    """The participant groups of one collective, as partition ids.

    Reads explicit `{{0,4},{1,5}}`, iota `[2,4]<=[4,2]T(1,0)`, mesh `mesh['a'=2,'b'=4]
    {'a'}` and `source_target_pairs={{0,1},...}` (each pair is a group); an empty or
    missing group list means every device.
    """
    m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", instr_text)
    if m:
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", m.group(1))]
    m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", instr_text)
    if m:
        groups = [
            [int(d) for d in g.split(",") if d] for g in re.findall(r"\{([\d,]*)\}", m.group(1))
        ]
        return [g for g in groups if g] or [list(range(num_devices))]
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", instr_text)
    if m:
        return _iota(*m.groups()).tolist()
    m = re.search(
        r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(?\[([\d,]+)\]<=\[([\d,]+)\]"
        r"(?:T\(([\d,]+)\))?\)?)?\s*\{([^}]*)\}",
        instr_text,
    )
    if m:
        axes = [(a, int(s)) for a, s in re.findall(r"'([^']+)'=(\d+)", m.group(1))]
        shape = [s for _, s in axes]
        if m.group(2):
            ids = _iota(m.group(2), m.group(3), m.group(4)).reshape(shape)
        else:
            ids = np.arange(int(np.prod(shape))).reshape(shape)
        named = set(re.findall(r"'([^']+)'", m.group(5)))
        inner = [i for i, (a, _) in enumerate(axes) if a in named]
        outer = [i for i in range(len(axes)) if i not in inner]
        size = int(np.prod([shape[i] for i in inner] or [1]))
        return ids.transpose(outer + inner).reshape(-1, size).tolist()
    return [list(range(num_devices))]


_MEGASCALE = {
    "ALL_REDUCE": "all-reduce",
    "REDUCE_SCATTER": "reduce-scatter",
    "ALL_GATHER": "all-gather",
    "ALL_TO_ALL": "all-to-all",
    "ONE_TO_ONE": "collective-permute",
}


def megascale_wire_bytes(op: str, sent: int, slices: int) -> float:
    """Bytes one device puts on DCN for a host transfer whose operand is `sent` bytes,
    with a ring over `slices`: all-reduce 2(S-1)/S n; reduce-scatter (the operand is
    the whole tensor) (S-1)/S n; all-gather (the operand is one shard) (S-1) n;
    all-to-all (S-1)/S n; one-to-one n."""
    s = max(slices, 1)
    if op == "all-reduce":
        return 2.0 * (s - 1) / s * sent
    if op in ("reduce-scatter", "all-to-all"):
        return (s - 1) / s * sent
    if op == "all-gather":
        return float((s - 1) * sent)
    return float(sent)


def dcn_collectives(hlo_text: str, slice_of: Sequence[int]) -> dict[str, Any]:
    """Collectives that cross slices: counts, bytes and the bytes each device sends over
    DCN (megascale host transfers, else replica groups spanning slices).

    `slice_of[i]` is the slice of partition i (the mesh's flattened device order). A
    collective split into a chain of fusions counts once (`parallel.hlo_text.collective_chain`).
    """
    chains_seen: set[tuple[str, str]] = set()
    counts: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    wire: Counter[str] = Counter()
    n = len(slice_of)
    slices = len(set(slice_of))
    for line in hlo_text.splitlines():
        m = INSTR.match(line)
        if not m or m.group("op").endswith("-done"):
            continue
        op = m.group("op").removesuffix("-start")
        if op == "send":
            kind = re.search(r'_xla_megascale_transfer_type="(\w+)"', line)
            if kind is None:
                continue
            name = _MEGASCALE.get(kind.group(1), kind.group(1).lower())
            shapes = SHAPE.findall(m.group("type"))
            sent = shape_bytes("{}[{}]".format(*shapes[0])) if shapes else 0
            counts[name] += 1
            nbytes[name] += sent
            wire[name] += megascale_wire_bytes(name, sent, slices)
            continue
        if op not in COLLECTIVES:
            continue
        if repeated_link(line, chains_seen):
            continue
        groups = replica_groups(line, n)
        spans = [len({slice_of[i] for i in g if i < n}) for g in groups]
        crossing = max(spans, default=1)
        if crossing < 2:
            continue
        # A group of k devices in each of its slices: the slow hop carries 1/k of the
        # data per device (the rest is reduced or gathered inside each slice first).
        per_slice = max(len(groups[spans.index(crossing)]) // crossing, 1)
        type_text = m.group("type")
        if m.group("op").endswith("-start") and type_text.startswith("("):
            shapes = SHAPE.findall(type_text)
            type_text = "{}[{}]".format(*shapes[1]) if len(shapes) > 1 else type_text
        result = shape_bytes(type_text)
        counts[op] += 1
        nbytes[op] += result
        wire[op] += wire_bytes(op, result, crossing) / per_slice
    return {
        "dcn_collectives": {k: int(v) for k, v in counts.items()},
        "dcn_collective_bytes": {k: int(nbytes[k]) for k in counts},
        "dcn_wire_bytes": float(sum(wire.values())),
    }
