"""Which collectives of a compiled multi-slice step cross the data-centre network (DCN).

A multi-slice program is one SPMD program over the devices of every slice; its
collectives name their participants by partition id, the position of a device in the
mesh's flattened device order. A collective whose replica group (or permute pair)
holds devices of more than one slice sends over DCN, the slow, host-NIC path; the
rest stay on each slice's ICI. `dcn_collectives` reads the compiled HLO and says which
ops cross, how many bytes they carry and, with a ring over the slices of each group,
how many bytes each device sends over DCN (hierarchically: a group's devices inside
one slice share the slow hop): the planner's DCN term.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from parallel.aot import _INSTR, _SHAPE, COLLECTIVES, _shape_bytes, wire_bytes


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


def dcn_collectives(hlo_text: str, slice_of: Sequence[int]) -> dict[str, Any]:
    """Collectives whose groups span slices: counts, result bytes and the bytes each
    device sends over DCN (a ring over the slices in its group, `aot.wire_bytes`).

    `slice_of[i]` is the slice of partition i (the mesh's flattened device order).
    """
    counts: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    wire: Counter[str] = Counter()
    n = len(slice_of)
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m or m.group("op").endswith("-done"):
            continue
        op = m.group("op").removesuffix("-start")
        if op not in COLLECTIVES:
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
            shapes = _SHAPE.findall(type_text)
            type_text = "{}[{}]".format(*shapes[1]) if len(shapes) > 1 else type_text
        result = _shape_bytes(type_text)
        counts[op] += 1
        nbytes[op] += result
        wire[op] += wire_bytes(op, result, crossing) / per_slice
    return {
        "dcn_collectives": {k: int(counts[k]) for k in COLLECTIVES if counts[k]},
        "dcn_collective_bytes": {k: int(nbytes[k]) for k in COLLECTIVES if counts[k]},
        "dcn_wire_bytes": float(sum(wire.values())),
    }
