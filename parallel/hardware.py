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
# read for early 2025 (v2/v3 per chip = the 8-core board price / 4). Chip specs: the
# Cloud TPU "System architecture" pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e;
# read 2025-01): peak bf16 FLOP/s, HBM capacity and bandwidth, and the interchip
# interconnect (ICI) bandwidth per chip, split here over its links (v4/v5p: 6 links of
# a 3-D torus; v5e/v6e: 4 links of a 2-D torus); v2/v3 from Jouppi et al. (CACM 2020),
# v4 also from Jouppi et al. (ISCA 2023). DCN is the host's NIC shared by its chips
# (v2/v3/v4/v5p hosts: 4 chips; v5e/v6e hosts: 8 chips at most), a round figure from
# the same pages' host descriptions: 100 Gb/s (v2-v4), 200 Gb/s (v5e, v5p), 400 Gb/s
# (v6e), not a measured throughput.
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
        "Cloud TPU v4 system architecture (275 TFLOP/s bf16, 32 GiB HBM2 at 1228 GB/s, "
        "6 ICI links); Jouppi et al. ISCA 2023; Cloud TPU pricing ($3.22/chip-h)",
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
        "Cloud TPU v5e system architecture (197 TFLOP/s bf16, 16 GB HBM2e at 819 GB/s, "
        "ICI 1600 Gb/s over 4 links); Cloud TPU pricing ($1.20/chip-h)",
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
        "Cloud TPU v5p system architecture (459 TFLOP/s bf16, 95 GB HBM2e at 2765 GB/s, "
        "ICI 4800 Gb/s over 6 links); Cloud TPU pricing ($4.20/chip-h)",
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
        "Cloud TPU v6e (Trillium) system architecture (918 TFLOP/s bf16, 32 GB HBM at "
        "1640 GB/s, ICI 3584 Gb/s over 4 links); Cloud TPU pricing ($2.70/chip-h)",
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
    # Hopper: dense bf16 (the data sheets' 1979 TFLOP/s is with 2:4 sparsity); NVLink 4
    # is 900 GB/s per GPU both directions over 18 links; between nodes one 400 Gb/s NIC
    # per GPU (the DGX H100/H200 reference design). Prices: GCP a3-highgpu-8g /
    # a3-ultragpu-8g on demand (us-central1) divided by 8, as read for early 2025.
    "h100": Chip(
        "NVIDIA H100 80GB HBM3",
        989e12,
        80 * GB,
        3350 * GB,
        450 * GB,
        1,
        "switch",
        400 * GBIT,
        11.06,
        "2025-01",
        "NVIDIA H100 SXM5 data sheet (989 TFLOP/s dense bf16, 3.35 TB/s); GCP a3-highgpu",
    ),
    "h200": Chip(
        "NVIDIA H200",
        989e12,
        141 * GB,
        4800 * GB,
        450 * GB,
        1,
        "switch",
        400 * GBIT,
        10.60,
        "2025-01",
        "NVIDIA H200 SXM data sheet (989 TFLOP/s dense bf16, 141 GB HBM3e at 4.8 TB/s); "
        "GCP a3-ultragpu",
    ),
}
# TensorCore clock (Hz) per TPU generation, to turn the TPU compiler's per-op
# `estimated_cycles` into time (parallel/hlo_profile.py): Jouppi et al., CACM 2020
# (v2 700 MHz, v3 940 MHz) and ISCA 2023 (v4 1050 MHz). Other generations: unknown here.
CLOCK_HZ: dict[str, float] = {"v2": 700e6, "v3": 940e6, "v4": 1050e6}
# JAX device kinds that name a chip differently from CHIPS (one device per chip).
_KIND_ALIASES = {"TPU v5e": "v5e", "TPU v5p": "v5p", "TPU v6e": "v6e", "Tesla T4": "t4"}
# Generations whose JAX device is one TensorCore, half a chip (v4 runs in megacore).
_CORES_PER_DEVICE_CHIP = {"v2": 2, "v3": 2}


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
        "Lin et al.'s cluster (PCIe 3.0 x16 inside a node)",
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


def chip_key_for_device_kind(device_kind: str) -> str | None:
    """The CHIPS key of a JAX device_kind ('TPU v3', 'TPU v5 lite', 'NVIDIA H100 80GB
    HBM3'); GPU kinds match by model name ('NVIDIA H100 PCIe' is an H100). None if unknown."""
    if device_kind in _KIND_ALIASES:
        return _KIND_ALIASES[device_kind]
    for key, chip in CHIPS.items():
        if chip.name == device_kind:
            return key
    for key, chip in CHIPS.items():
        model = " ".join(chip.name.split()[:2])  # "NVIDIA H100"
        if chip.name.startswith("NVIDIA") and device_kind.startswith(model):
            return key
    return None


def chip_for_device_kind(device_kind: str) -> Chip:
    """The Chip of a JAX device_kind such as 'TPU v3' or 'TPU v5 lite'."""
    key = chip_key_for_device_kind(device_kind)
    if key is None:
        known = ", ".join(sorted(c.name for c in CHIPS.values()))
        raise KeyError(f"no hardware data for device kind {device_kind!r}; known: {known}.")
    return CHIPS[key]


def bf16_peak_flops_per_device(device_kind: str) -> float | None:
    """Published dense bf16 FLOP/s of one JAX device of this kind (a v2/v3 device is
    one of the chip's two cores); None for kinds without data here."""
    key = chip_key_for_device_kind(device_kind)
    if key is None:
        return None
    return CHIPS[key].peak_flops / _CORES_PER_DEVICE_CHIP.get(key, 1)


def override(chip: Chip, **changes: float) -> Chip:
    """A copy of `chip` with some fields replaced (the planner's what-if knobs)."""
    return dataclasses.replace(chip, **{k: v for k, v in changes.items() if v is not None})


# Purchase prices (US$ per accelerator card, list price), for buy-versus-rent studies:
# (price, date read, source). The rental price is Chip.price_per_hour.
PURCHASE_PRICES: dict[str, tuple[float, str, str]] = {
    "t4": (
        1880.0,
        "2026-12",
        "NVIDIA Tesla T4 MSRP as listed by chipversus.com/hardware/gpu/tesla-t4 "
        "(street price then about $1,000)",
    ),
}
