"""parallel/ici_links.py: a collective's ring bytes over the torus dimensions its group
spans, on hand-written HLO for 8 chips of a 2x2x2 torus (position i at x = bit 0,
y = bit 1, z = bit 2)."""

from __future__ import annotations

import pytest

from parallel.hlo_counts import hlo_wire_bytes
from parallel.ici_links import dims_spanned, mesh_coords, ring_equivalent_wire_bytes

COORDS = [(i & 1, (i >> 1) & 1, (i >> 2) & 1) for i in range(8)]

HLO = """
ENTRY %main (p: f32[1024], q: f32[1024], r: f32[1024], s: f32[64]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  %q = f32[1024]{0} parameter(1)
  %r = f32[1024]{0} parameter(2)
  %s = f32[64]{0} parameter(3)
  %x = f32[1024]{0} all-reduce(f32[1024]{0} %p), replica_groups={{0,1},{2,3},{4,5},{6,7}}
  %xy = f32[1024]{0} all-reduce(f32[1024]{0} %q), replica_groups=[2,4]<=[8]
  %xyz = f32[1024]{0} all-reduce(f32[1024]{0} %r), replica_groups={{0,1,2,3,4,5,6,7}}
  %n = f32[64]{0} collective-permute(f32[64]{0} %s), source_target_pairs={{0,1},{1,0}}
  ROOT %out = f32[1024]{0} add(%x, %xy)
}
"""


def test_a_group_spans_the_dimensions_its_chips_differ_in():
    assert dims_spanned([0, 1], COORDS) == 1
    assert dims_spanned([0, 2], COORDS) == 1
    assert dims_spanned([0, 1, 2, 3], COORDS) == 2
    assert dims_spanned(list(range(8)), COORDS) == 3
    assert dims_spanned([5], COORDS) == 0


def test_each_collective_counts_its_bytes_over_the_dimensions_it_spans():
    ring = 2 * (1 / 2) * 4096 + 2 * (3 / 4) * 4096 + 2 * (7 / 8) * 4096 + 256
    assert hlo_wire_bytes(HLO) == pytest.approx(ring)  # every collective on one ring
    assert ring_equivalent_wire_bytes(HLO, COORDS, max_dims=3) == pytest.approx(
        4096 * (1 / 2) * 2 + 2 * (3 / 4) * 4096 / 2 + 2 * (7 / 8) * 4096 / 3 + 256
    )
    # A 2D torus chip (4 links) drives at most two dimensions' links.
    assert ring_equivalent_wire_bytes(HLO, COORDS, max_dims=2) == pytest.approx(
        4096 + 2 * (3 / 4) * 4096 / 2 + 2 * (7 / 8) * 4096 / 2 + 256
    )


def test_coordinates_come_from_the_devices_of_a_topology_only():
    class Mesh:
        def __init__(self, devices):
            import numpy as np

            self.devices = np.array(devices, dtype=object)

    class Chip:
        def __init__(self, coords):
            self.coords = coords

    assert mesh_coords(Mesh([Chip([1, 0, 2]), Chip([0, 0, 0])])) == [(1, 0, 2), (0, 0, 0)]
    assert mesh_coords(Mesh([object(), object()])) is None  # CPU devices: no torus
