"""Logical mesh axes onto a TPU slice's physical axes (cores on a chip, torus x, y, z).

A TPU slice is a torus of chips; on v2/v3 (and v4 outside megacore mode) each chip
shows two JAX devices, its TensorCores, which talk through the chip itself, faster
than any ICI link. The mesh axes of a config are ordered by how much they talk, least
first (`data`, then `model`), so the mapping walks them from the last: the most
communication-heavy axis takes the fastest physical axes first (the core axis, then
x, y, z), and each physical axis it only partly fills is split, that axis keeping the
minor (nearest-neighbour) part. Every logical axis size that divides what is left
maps; a mesh whose sizes do not multiply to the slice's devices cannot be built, and
`MeshMappingError` says which sizes would.

Everything here is arithmetic on shapes: `mesh_positions` gives, for each position of
the logical mesh, the physical coordinate; `physical_device_array` arranges real (or
AOT topology) devices by coordinate so the two meet.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# Physical axes, fastest first: the chip's own cores, then the torus dimensions.
PHYSICAL_ORDER = ("core", "x", "y", "z")


class MeshMappingError(ValueError):
    """A logical mesh that cannot be laid out on a slice; the message says what fits."""


@dataclasses.dataclass(frozen=True)
class AxisMapping:
    """How each logical axis is laid out: its (physical axis, size) pieces, minor first."""

    physical: tuple[tuple[str, int], ...]  # (name, size), fastest first
    logical: tuple[tuple[str, int], ...]  # (name, size), mesh order
    pieces: dict[str, tuple[tuple[str, int], ...]]

    @property
    def split(self) -> tuple[str, ...]:
        """Physical axes shared by more than one logical axis."""
        owners: dict[str, int] = {}
        for pieces in self.pieces.values():
            for axis, _ in pieces:
                owners[axis] = owners.get(axis, 0) + 1
        return tuple(a for a, _ in self.physical if owners.get(a, 0) > 1)

    def describe(self) -> str:
        """One line, e.g. `model=4 <- core 2 x x 2; data=2 <- y 2 (split: x)`."""
        parts = []
        for name, size in reversed(self.logical):
            pieces = self.pieces[name]
            where = " x ".join(f"{a} {s}" for a, s in pieces) if pieces else "-"
            parts.append(f"{name}={size} <- {where}")
        physical = "x".join(f"{s}" for _, s in self.physical)
        text = f"{'; '.join(parts)} on {physical} ({', '.join(a for a, _ in self.physical)})"
        if self.split:
            text += f"; split physical axes: {', '.join(self.split)}"
        return text


def physical_axes(torus: Sequence[int], cores_per_chip: int = 1) -> tuple[tuple[str, int], ...]:
    """(name, size) of a slice's physical axes, fastest first; size-1 axes dropped."""
    dims = list(torus) + [1] * (3 - len(torus))
    axes = [("core", cores_per_chip)] + list(zip(("x", "y", "z"), dims, strict=True))
    return tuple((n, int(s)) for n, s in axes if s > 1)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _feasible_hint(physical: Sequence[tuple[str, int]], logical: Sequence[tuple[str, int]]) -> str:
    """Sizes that would work: the last axis's divisors with the first taking the rest."""
    total = math.prod(s for _, s in physical) or 1
    if len(logical) < 2:
        return f"{logical[0][0] if logical else 'data'}={total}"
    first, last = logical[0][0], logical[-1][0]
    options = [f"{first}={total // d},{last}={d}" for d in _divisors(total) if d <= 64][:8]
    return " or ".join(options)


def map_axes(
    physical: Sequence[tuple[str, int]], logical: Sequence[tuple[str, int]]
) -> AxisMapping:
    """Assigns each logical axis (mesh order, least communication first) physical pieces.

    The last logical axis is placed first, taking from the fastest physical axes the
    largest factor of its remaining size each can give (its minor part); the others
    follow on what is left. Raises MeshMappingError when the sizes do not multiply to
    the devices, naming the physical shape, the mesh and sizes that would fit.
    """
    physical = tuple((str(n), int(s)) for n, s in physical)
    logical = tuple((str(n), int(s)) for n, s in logical)
    total = math.prod(s for _, s in physical)
    wanted = math.prod(s for _, s in logical)
    if wanted != total or any(s < 1 for _, s in logical):
        shape = "x".join(str(s) for _, s in physical) or "1"
        names = ", ".join(n for n, _ in physical) or "-"
        mesh = ",".join(f"{n}={s}" for n, s in logical)
        raise MeshMappingError(
            f"mesh {mesh} ({wanted} devices) cannot be laid out on physical shape {shape} "
            f"({names}; {total} devices): sizes must multiply to {total}, e.g. "
            f"{_feasible_hint(physical, logical)}."
        )
    left = dict(physical)
    pieces: dict[str, tuple[tuple[str, int], ...]] = {}
    for name, size in reversed(logical):
        need, taken = size, []
        for axis, _ in physical:
            g = math.gcd(need, left[axis])
            if g > 1:
                taken.append((axis, g))
                left[axis] //= g
                need //= g
        assert need == 1, (name, size, left)  # the products match, so a factor is left
        pieces[name] = tuple(taken)
    return AxisMapping(physical, logical, pieces)


def mesh_positions(mapping: AxisMapping) -> np.ndarray:
    """Flat physical index (row-major over `mapping.physical`, first axis major) of the
    device at each logical mesh position; shape = the logical sizes.

    Each physical axis is cut into the pieces the logical axes took, in the order
    they took them (minor first), so a piece's index steps through neighbours.
    """
    phys_sizes = [s for _, s in mapping.physical]
    flat = np.arange(math.prod(phys_sizes) or 1).reshape(phys_sizes or [1])
    # Cut every physical axis into its pieces, major piece first (numpy order).
    per_axis: dict[str, list[tuple[str, int]]] = {a: [] for a, _ in mapping.physical}
    for name, _ in reversed(mapping.logical):  # placement order: minor pieces first
        for axis, size in mapping.pieces[name]:
            per_axis[axis].append((name, size))
    cut_shape, cut_owner = [], []
    for axis, _ in mapping.physical:
        for name, size in reversed(per_axis[axis]):
            cut_shape.append(size)
            cut_owner.append((name, axis))
    cut = flat.reshape(cut_shape or [1])
    # Gather each logical axis's cuts, major first: its pieces were taken minor first.
    order = []
    for name, _ in mapping.logical:
        for axis, _ in reversed(mapping.pieces[name]):
            order.append(cut_owner.index((name, axis)))
    out = cut.transpose(order) if order else cut
    return out.reshape([s for _, s in mapping.logical])


def physical_device_array(devices: Sequence[Any]) -> tuple[np.ndarray, tuple[tuple[str, int], ...]]:
    """TPU devices of one slice arranged by (core, x, y, z), fastest axis first, size-1
    axes dropped; with the matching `physical_axes`. Raises MeshMappingError when the
    devices do not fill a box (a partial slice)."""
    coords = np.array([tuple(d.coords) + (0,) * (3 - len(d.coords)) for d in devices])
    cores = np.array([getattr(d, "core_on_chip", 0) for d in devices])
    lo = coords.min(axis=0)
    dims = tuple(int(v) for v in coords.max(axis=0) - lo + 1)
    n_cores = int(cores.max() - cores.min() + 1)
    if math.prod(dims) * n_cores != len(devices):
        raise MeshMappingError(
            f"{len(devices)} devices do not fill a {'x'.join(map(str, dims))} box of chips "
            f"with {n_cores} cores each; give every device of the slice."
        )
    box = np.empty((n_cores, *dims), dtype=object)
    for d, c, k in zip(devices, coords - lo, cores - cores.min(), strict=True):
        box[(int(k), *(int(v) for v in c))] = d
    axes = physical_axes(dims, n_cores)
    return box.reshape([s for _, s in axes] or [1]), axes


def slice_device_mesh(
    devices: Sequence[Any], names: Sequence[str], sizes: Sequence[int]
) -> tuple[np.ndarray, AxisMapping]:
    """One slice's devices as a logical mesh of `sizes` (mesh order), and the mapping."""
    box, axes = physical_device_array(devices)
    mapping = map_axes(axes, list(zip(names, sizes, strict=True)))
    return box.reshape(-1)[mesh_positions(mapping)], mapping
