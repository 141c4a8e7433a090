"""Logical mesh axes onto TPU physical axes (parallel/torus.py), against hand-worked orders.

Coordinates are written (core, x, y, z) with size-1 axes dropped, as `physical_axes` does.
"""

from __future__ import annotations

import numpy as np
import pytest

from parallel.torus import (
    MeshMappingError,
    map_axes,
    mesh_positions,
    physical_axes,
)


def _coords(physical, logical):
    """The physical coordinate tuple at every logical mesh position."""
    mapping = map_axes(physical, logical)
    sizes = [s for _, s in physical]
    flat = mesh_positions(mapping)
    return mapping, np.vectorize(lambda i: np.unravel_index(i, sizes), otypes=[object])(flat)


def test_physical_axes_put_the_cores_first_and_drop_size_one():
    assert physical_axes((2, 2, 1), cores_per_chip=2) == (("core", 2), ("x", 2), ("y", 2))
    assert physical_axes((16, 16)) == (("x", 16), ("y", 16))
    assert physical_axes((16, 16, 16)) == (("x", 16), ("y", 16), ("z", 16))


def test_4x4_model_takes_x_then_splits_y():
    # data=2, model=8 on 4x4 chips: model = all of x (4) x the minor half of y (2);
    # data = y's major half. Hand-worked: mesh[d, m] = (x = m % 4, y = m // 4 + 2 d).
    mapping, pos = _coords(physical_axes((4, 4)), [("data", 2), ("model", 8)])
    assert mapping.pieces == {"model": (("x", 4), ("y", 2)), "data": (("y", 2),)}
    assert mapping.split == ("y",)
    expected = [[(m % 4, m // 4 + 2 * d) for m in range(8)] for d in range(2)]
    assert [[tuple(int(v) for v in p) for p in row] for row in pos] == expected


def test_16x16_model_4_is_four_neighbours_on_x():
    # data=64, model=4: model = x mod 4 (4 adjacent chips), data = (x // 4) + 4 y.
    mapping, pos = _coords(physical_axes((16, 16)), [("data", 64), ("model", 4)])
    assert mapping.pieces == {"model": (("x", 4),), "data": (("x", 4), ("y", 16))}
    for d, m in [(0, 0), (0, 3), (1, 0), (5, 2), (63, 3)]:
        assert tuple(int(v) for v in pos[d, m]) == (4 * (d % 4) + m, d // 4)
    assert "split physical axes: x" in mapping.describe()


def test_16x16x16_whole_axes_need_no_split():
    # data=256, model=16: model = the whole x ring, data = y (minor) x z.
    mapping, pos = _coords(physical_axes((16, 16, 16)), [("data", 256), ("model", 16)])
    assert mapping.pieces == {"model": (("x", 16),), "data": (("y", 16), ("z", 16))}
    assert mapping.split == ()
    for d, m in [(0, 0), (0, 15), (17, 3), (255, 15)]:
        assert tuple(int(v) for v in pos[d, m]) == (m, d % 16, d // 16)


def test_2x2x1_with_two_cores_puts_model_on_the_chip_first():
    # 4 chips x 2 cores (v3:2x2, v4:2x2x1 outside megacore): model=4 = the 2 cores of a
    # chip x 2 chips along x; data=2 = y. mesh[d, m] = (core m % 2, x m // 2, y d).
    mapping, pos = _coords(physical_axes((2, 2, 1), 2), [("data", 2), ("model", 4)])
    assert mapping.pieces == {"model": (("core", 2), ("x", 2)), "data": (("y", 2),)}
    expected = [[(m % 2, m // 2, d) for m in range(4)] for d in range(2)]
    assert [[tuple(int(v) for v in p) for p in row] for row in pos] == expected
    # model=2 stays on one chip: each model group is the two cores of one chip.
    _, pos2 = _coords(physical_axes((2, 2, 1), 2), [("data", 4), ("model", 2)])
    assert all(pos2[d, 0][1:] == pos2[d, 1][1:] for d in range(4))


def test_every_position_is_one_device():
    mapping = map_axes(physical_axes((4, 8, 8)), [("data", 32), ("model", 8)])
    flat = mesh_positions(mapping).ravel()
    assert sorted(flat.tolist()) == list(range(256))


def test_a_mesh_that_cannot_fit_says_what_would():
    with pytest.raises(MeshMappingError) as e:
        map_axes(physical_axes((16, 16)), [("data", 60), ("model", 4)])
    message = str(e.value)
    assert "physical shape 16x16" in message and "data=60,model=4" in message
    assert "data=64,model=4" in message and "\n" not in message
