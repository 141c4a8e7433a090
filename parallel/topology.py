"""TPU topologies for ahead-of-time compilation on a machine without TPUs.

`jax.experimental.topologies.get_topology_desc` (libtpu from PyPI) describes every
device of a named slice such as "v3:64x64" (the 4096-chip v3 multipod, 8192 cores);
meshes built from those devices lower and compile with the real TPU compiler, and
nothing is allocated. It works with JAX_PLATFORMS=cpu (the tests' setting).

Devices are as a real pod shows them: v2/v3 one JAX device per TensorCore (2 per
chip); v4 in megacore mode, one device per chip (libtpu's `chip_config_name=
"megacore"`, what Cloud TPU v4 VMs run); v5e, v5p and v6e one device per chip.
`slices > 1` describes that many identical slices joined over the data-centre network
(DCN); each device then carries its `slice_index`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

from parallel.hardware import CHIPS, Chip

# Names checked against libtpu 0.0.42 (`<generation>:<chips per torus dimension>`).
# Any shape libtpu accepts works; these are the ones the docs and planner use.
KNOWN_TOPOLOGIES = (
    "v2:2x2",
    "v2:4x4",
    "v3:2x2",
    "v3:4x4",
    "v3:8x8",
    "v3:16x16",
    "v3:32x32",
    "v3:32x64",
    "v3:64x64",
    "v4:2x2x1",
    "v4:4x4x4",
    "v4:8x8x8",
    "v4:16x16x16",
    "v5e:2x2",
    "v5e:4x4",
    "v5e:8x16",
    "v5e:16x16",
    "v5p:2x2x1",
    "v5p:4x4x4",
    "v5p:8x8x8",
    "v5p:16x16x16",
    "v6e:2x2",
    "v6e:4x4",
    "v6e:8x16",
    "v6e:16x16",
)
# libtpu's chip configuration per generation: v4 pods run in megacore mode (one JAX
# device per chip, both TensorCores driven as one); the default elsewhere.
_CHIP_CONFIG = {"v4": "megacore"}


def known_topologies_text() -> str:
    """The known topology names grouped by generation, for error messages."""
    groups: dict[str, list[str]] = {}
    for name in KNOWN_TOPOLOGIES:
        groups.setdefault(name.split(":")[0], []).append(name.split(":")[1])
    return "; ".join(f"{g}: {', '.join(shapes)}" for g, shapes in groups.items())


class TopologyError(ValueError):
    """An unknown topology name or a mesh that does not fit one."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """A TPU slice: its devices (cores, as JAX sees them), chips, torus shape, hardware."""

    name: str
    devices: tuple[Any, ...]
    chips: int  # in all slices
    torus: tuple[int, ...]  # chips per torus dimension of one slice, e.g. (64, 64)
    chip: Chip
    slices: int = 1

    @property
    def generation(self) -> str:
        return self.name.split(":")[0]

    @property
    def devices_per_chip(self) -> int:
        return len(self.devices) // self.chips

    @property
    def label(self) -> str:
        """The name, with ` x N slices` when there is more than one."""
        return self.name + (f" x {self.slices} slices" if self.slices > 1 else "")

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
            f"{known_topologies_text()}."
        )
    return generation, tuple(int(d) for d in dims)


@functools.cache
def get_topology(name: str, slices: int = 1) -> Topology:
    """The devices and hardware of a named TPU slice, or of `slices` such slices joined
    over DCN (cached: one libtpu call per name and slice count)."""
    generation, torus = _parse(name)
    if slices < 1:
        raise TopologyError(f"slices={slices}: use 1 or more.")
    # libtpu takes a machine-wide lock file when it loads, which would make a second
    # process (another test worker, another user) fail; AOT never touches a real TPU.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    options: dict[str, Any] = {}
    if generation in _CHIP_CONFIG:
        options["chip_config_name"] = _CHIP_CONFIG[generation]
    if slices > 1:
        options["num_slices"] = slices
    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=name, **options)
    except Exception as e:  # libtpu's INVALID_ARGUMENT for shapes it does not support
        raise TopologyError(
            f"libtpu cannot describe TPU topology {name!r} ({str(e).splitlines()[0]}); "
            f"known topologies: {known_topologies_text()}."
        ) from None
    devices = tuple(desc.devices)
    chips = len({(getattr(d, "slice_index", 0), tuple(d.coords)) for d in devices})
    return Topology(name, devices, chips, torus, CHIPS[generation], slices)


def topology_for_chips(generation: str, chips: int) -> str:
    """The most square slice name of `generation` with `chips` chips (2-D or 3-D torus)."""
    three_d = CHIPS[generation].topology == "3d-torus"
    if chips < 1 or chips & (chips - 1):
        raise TopologyError(f"chips={chips}: use a power of two.")
    exp = int(math.log2(chips))
    parts = [exp // 3 + (i < exp % 3) for i in range(3)] if three_d else [exp - exp // 2, exp // 2]
    return f"{generation}:" + "x".join(str(1 << p) for p in parts)


def mesh_fit_text(topology: Topology, axis_names: list[str]) -> str:
    """`physical shape 4x4 chips; sizes that fit: data=16,model=1 or ...` for messages."""
    total = len(topology.devices)
    if len(axis_names) > 1:
        first, last = axis_names[0], axis_names[-1]
        per_slice = total // topology.slices
        options = [
            f"{first}={total // m},{last}={m}" for m in (1, 2, 4, 8, 16) if per_slice % m == 0
        ]
        hint = " or ".join(options)
    else:
        hint = f"{axis_names[0] if axis_names else 'data'}={total}"
    shape = "x".join(str(t) for t in topology.torus)
    cores = f" x {topology.devices_per_chip} cores" if topology.devices_per_chip > 1 else ""
    slices = f" x {topology.slices} slices" if topology.slices > 1 else ""
    return f"physical shape {shape} chips{cores}{slices}, {total} devices; sizes that fit: {hint}"


def check_mesh_fits(topology: Topology, mesh_sizes: dict[str, int]) -> None:
    """Raises a one-line TopologyError naming the physical shape, the requested mesh and
    sizes that would fit, when a mesh does not use every device of the topology."""
    needed = math.prod(mesh_sizes.values())
    if needed == len(topology.devices):
        return
    mesh = ",".join(f"{k}={v}" for k, v in mesh_sizes.items())
    raise TopologyError(
        f"mesh {mesh} has {needed} devices but topology {topology.label} does not "
        f"({mesh_fit_text(topology, list(mesh_sizes))})."
    )
