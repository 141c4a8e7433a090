"""The torus links a compiled collective can drive: the ICI term counts them.

A TPU slice is a 2D (v5e, v6e) or 3D (v4, v5p) torus, each chip with two links per
dimension. A collective whose device group lies along one torus dimension runs as a
bidirectional ring on that dimension's two links. A group that spans d dimensions can
drive 2d links at once: the bytes split into d parts, each reduced along the dimensions
in its own order, so every dimension's links carry a part at every phase (the
multi-dimensional all-reduce of Ying et al., "Image classification at supercomputer
scale", and of the TPU v4 paper, Jouppi et al.). The planner's ICI time is the ring wire
bytes over the two links of one ring (`costmodel.tpu_step_time`), so a collective over d
dimensions counts `wire / d` here: its ring-equivalent bytes.

Partition ids in the HLO are positions in the mesh's flattened device order
(`parallel.dcn`), so `mesh_coords` gives each id its chip's torus coordinates.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from parallel.dcn import replica_groups
from parallel.hlo_counts import hlo_wire_bytes


def mesh_coords(mesh) -> list[tuple[int, ...]] | None:
    """Each mesh position's chip coordinates on the torus (the devices of a TPU
    topology carry them), or None for devices without any (CPU, GPU)."""
    coords = [getattr(d, "coords", None) for d in mesh.devices.flat]
    if any(c is None for c in coords):
        return None
    return [tuple(int(v) for v in c) for c in coords]


def dims_spanned(group: Sequence[int], coords: Sequence[Sequence[int]]) -> int:
    """Torus dimensions along which the group's chips differ (0: one chip)."""
    points = np.asarray([coords[i] for i in group])
    return int(np.sum(np.ptp(points, axis=0) > 0))


def ring_equivalent_wire_bytes(
    hlo_text: str, coords: Sequence[Sequence[int]], max_dims: int
) -> float:
    """`hlo_wire_bytes` with each collective's bytes divided by the torus dimensions its
    first group spans (at least 1, at most `max_dims`, the chip's links / 2): the bytes
    one ring would have to carry in the time the collective takes. A permute keeps its
    bytes (a neighbour exchange uses one link)."""
    cache: dict[str, float] = {}

    def scale(instr_text: str) -> float:
        if "source_target_pairs=" in instr_text:
            return 1.0
        # The groups attribute alone (not the op's name or metadata) keys the cache.
        found = re.search(r"replica_groups=(?:mesh\[[^\]]*\]\s*\{[^}]*\}|\S+)", instr_text)
        key = found.group(0) if found else ""
        if key not in cache:
            groups = replica_groups(instr_text, len(coords))
            dims = dims_spanned(groups[0], coords) if groups and groups[0] else 1
            cache[key] = 1.0 / min(max(dims, 1), max_dims)
        return cache[key]

    return hlo_wire_bytes(hlo_text, scale=scale)
