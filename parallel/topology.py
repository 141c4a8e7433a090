"""TPU topologies for ahead-of-time compilation on a machine without TPUs.

`jax.experimental.topologies.get_topology_desc` (libtpu from PyPI) describes every
device of a named slice such as "v3:64x64" (the 4096-chip v3 multipod, 8192 cores);
meshes built from those devices lower and compile with the real TPU compiler, and
nothing is allocated. It works with JAX_PLATFORMS=cpu (the tests' setting).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

from parallel.hardware import CHIPS, Chip

# Names checked against libtpu 0.0.42 (`<generation>:<chips per torus dimension>`).
# Any shape libtpu accepts works; these are the ones docs/aot-and-planning.md and the planner use.
KNOWN_TOPOLOGIES = (
    "v2:2x2",
    "v2:4x4",
    "v3:2x2",
    "v3:4x4",
    "v3:8x8",
    "v3:16x16",
    "v3:32x32",
    "v3:64x64",
    "v4:2x2x1",
    "v4:4x4x4",
    "v4:16x16x16",
    "v5e:16x16",
    "v5p:8x8x8",
    "v5p:16x16x16",
    "v6e:16x16",
)


class TopologyError(ValueError):
    """An unknown topology name or a mesh that does not fit one."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """A TPU slice: its devices (cores, as JAX sees them), chips, torus shape, hardware."""

    name: str
    devices: tuple[Any, ...]
    chips: int
    torus: tuple[int, ...]  # chips per torus dimension, e.g. (64, 64)
    chip: Chip

    @property
    def generation(self) -> str:
        return self.name.split(":")[0]

    @property
    def devices_per_chip(self) -> int:
        return len(self.devices) // self.chips

    @property
    def hbm_per_device(self) -> float:
        """HBM bytes one JAX device (core) can use: the chip's HBM over its cores."""
        return self.chip.hbm_bytes / self.devices_per_chip


def _parse(name: str) -> tuple[str, tuple[int, ...]]:
    generation, _, shape = name.partition(":")
    dims = shape.split("x")
    if generation not in CHIPS or not shape or not all(d.isdigit() and int(d) > 0 for d in dims):
        raise TopologyError(
            f"unknown TPU topology {name!r}: use <generation>:<AxB[xC]> with a generation "
            f"in {sorted(k for k in CHIPS if k.startswith('v'))}; known topologies: "
            f"{', '.join(KNOWN_TOPOLOGIES)}."
        )
    return generation, tuple(int(d) for d in dims)


@functools.cache
def get_topology(name: str) -> Topology:
    """The devices and hardware of a named TPU slice (cached: one libtpu call per name)."""
    generation, torus = _parse(name)
    # libtpu takes a machine-wide lock file when it loads, which would make a second
    # process (another test worker, another user) fail; AOT never touches a real TPU.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=name)
    except Exception as e:  # libtpu's INVALID_ARGUMENT for shapes it does not support
        raise TopologyError(
            f"libtpu cannot describe TPU topology {name!r} ({str(e).splitlines()[0]}); "
            f"known topologies: {', '.join(KNOWN_TOPOLOGIES)}."
        ) from None
    devices = tuple(desc.devices)
    chips = len({tuple(d.coords) for d in devices})
    return Topology(name, devices, chips, torus, CHIPS[generation])


def topology_for_chips(generation: str, chips: int) -> str:
    """The most square slice name of `generation` with `chips` chips (2-D or 3-D torus)."""
    three_d = CHIPS[generation].topology == "3d-torus"
    if chips < 1 or chips & (chips - 1):
        raise TopologyError(f"chips={chips}: use a power of two.")
    exp = int(math.log2(chips))
    parts = [exp // 3 + (i < exp % 3) for i in range(3)] if three_d else [exp - exp // 2, exp // 2]
    return f"{generation}:" + "x".join(str(1 << p) for p in parts)


def check_mesh_fits(topology: Topology, mesh_sizes: dict[str, int]) -> None:
    """Raises a TopologyError naming both numbers when a mesh does not use every device."""
    needed = math.prod(mesh_sizes.values())
    if needed != len(topology.devices):
        raise TopologyError(
            f"mesh {mesh_sizes} has {needed} devices but topology {topology.name} has "
            f"{len(topology.devices)} ({topology.chips} chips x {topology.devices_per_chip} "
            f"cores); choose sizes whose product is {len(topology.devices)}."
        )
