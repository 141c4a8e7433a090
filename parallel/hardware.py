"""Accelerators and clusters as dated data, for the planner's analytic model.

Every figure is a published peak or list price, recorded with where it comes from and
when it was read, so a reader can check or replace it (the planner takes overrides).
Peaks are never tuned to make a prediction match a measurement: the honesty table in
docs/aot-and-planning.md compares the model against published MLPerf times with these numbers as
they are.

Units: FLOP/s, bytes, bytes/s, US dollars per accelerator-hour.
"""

from __future__ import annotations

import dataclasses

GB = 1e9
GiB = 1 << 30
GBIT = 1e9 / 8  # bytes/s in one Gbit/s


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip (a TPU chip may show as 2 JAX devices: one per core)."""

    name: str
    peak_flops: float  # dense bf16 (fp16 where there is no bf16) FLOP/s per chip
    hbm_bytes: float  # per chip
    hbm_bandwidth: float  # bytes/s per chip
    link_bandwidth: float  # bytes/s per direction of one interconnect link
    links: int  # interconnect links per chip
    topology: str  # "2d-torus", "3d-torus", "switch" (NVSwitch / PCIe), ...
    dcn_bandwidth: float  # bytes/s per chip to other slices / nodes (host NIC share)
    price_per_hour: float  # US$ per chip-hour, on demand
    price_date: str
    source: str


# Cloud TPU prices: cloud.google.com/tpu/pricing, on-demand, us-central regions, as
# recalled for early 2025 (v2/v3 per chip = the 8-core board price / 4). DCN is the
# host's NIC shared by its 4 (v5e/v6e: up to 8) chips. Specs: Cloud TPU "System
# architecture" pages and Jouppi et al. (CACM 2020, ISCA 2023).
CHIPS: dict[str, Chip] = {
    "v2": Chip(
        "TPU v2",
        45e12,
        16 * GiB,
        700 * GB,
        496 * GBIT,
        4,
        "2d-torus",
        100 * GBIT / 4,
        1.125,
        "2025-01",
        "Cloud TPU pricing (v2-8 $4.50/h); Jouppi et al. CACM 2020",
    ),
    "v3": Chip(
        "TPU v3",
        123e12,
        32 * GiB,
        900 * GB,
        656 * GBIT,
        4,
        "2d-torus",
        100 * GBIT / 4,
        2.00,
        "2025-01",
        "Cloud TPU pricing (v3-8 $8.00/h); Jouppi et al. CACM 2020",
    ),
    "v4": Chip(
        "TPU v4",
        275e12,
        32 * GiB,
        1228 * GB,
        400 * GBIT,
        6,
        "3d-torus",
        100 * GBIT / 4,
        3.22,
        "2025-01",
        "Cloud TPU pricing; Jouppi et al. ISCA 2023",
    ),
    "v5e": Chip(
        "TPU v5 lite",
        197e12,
        16 * GiB,
        819 * GB,
        400 * GBIT,
        4,
        "2d-torus",
        200 * GBIT / 8,
        1.20,
        "2025-01",
        "Cloud TPU pricing; Cloud TPU v5e system architecture",
    ),
    "v5p": Chip(
        "TPU v5",
        459e12,
        95 * GB,
        2765 * GB,
        800 * GBIT,
        6,
        "3d-torus",
        200 * GBIT / 4,
        4.20,
        "2025-01",
        "Cloud TPU pricing; Cloud TPU v5p system architecture",
    ),
    "v6e": Chip(
        "TPU v6 lite",
        918e12,
        32 * GiB,
        1640 * GB,
        896 * GBIT,
        4,
        "2d-torus",
        400 * GBIT / 8,
        2.70,
        "2025-01",
        "Cloud TPU pricing; Cloud TPU v6e (Trillium) system architecture",
    ),
    # GPUs: NVIDIA data sheets; prices: Google Cloud on-demand GPU list (us-central1).
    "t4": Chip(
        "NVIDIA T4",
        65e12,
        16 * GB,
        320 * GB,
        15.75 * GB,
        1,
        "pcie",
        10 * GBIT / 8,
        0.35,
        "2025-01",
        "NVIDIA T4 data sheet (fp16 tensor); GCP GPU pricing",
    ),
    "a100": Chip(
        "NVIDIA A100 40GB SXM",
        312e12,
        40 * GB,
        1555 * GB,
        300 * GB,
        1,
        "switch",
        200 * GBIT,
        3.67,
        "2025-01",
        "NVIDIA A100 data sheet; GCP a2-highgpu pricing",
    ),
}


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A cluster without a compiler here: planned from FLOPs and bytes analytically."""

    name: str
    chip: str  # key of CHIPS
    devices_per_node: int
    nodes: int
    intra_node_bandwidth: float  # bytes/s per device inside a node (PCIe / NVLink)
    inter_node_bandwidth: float  # bytes/s per node across nodes (the NIC)
    description: str

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes


CLUSTERS: dict[str, Cluster] = {
    # Lin et al., "Multi-node BERT pretraining: cost-efficient approach": 32 nodes of
    # 8 T4s, 10 Gb/s Ethernet between nodes.
    "t4x8x32-10gbe": Cluster(
        "32 nodes x 8 NVIDIA T4, 10 Gb/s Ethernet",
        "t4",
        8,
        32,
        CHIPS["t4"].link_bandwidth,
        10 * GBIT,
        "the seed paper's cluster (PCIe 3.0 x16 inside a node)",
    ),
    "dgx-a100x8": Cluster(
        "8 DGX A100 (64 GPUs), 8 x 200 Gb/s HDR InfiniBand per node",
        "a100",
        8,
        8,
        CHIPS["a100"].link_bandwidth,
        8 * 200 * GBIT,
        "NVSwitch inside a node (600 GB/s per GPU, both directions)",
    ),
}


def chip_for_device_kind(device_kind: str) -> Chip:
    """The Chip whose name is a JAX device_kind such as 'TPU v3' or 'TPU v5 lite'."""
    for chip in CHIPS.values():
        if chip.name == device_kind:
            return chip
    known = ", ".join(sorted(c.name for c in CHIPS.values()))
    raise KeyError(f"no hardware data for device kind {device_kind!r}; known: {known}.")


def override(chip: Chip, **changes: float) -> Chip:
    """A copy of `chip` with some fields replaced (the planner's what-if knobs)."""
    return dataclasses.replace(chip, **{k: v for k, v in changes.items() if v is not None})
