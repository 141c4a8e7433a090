"""Where every parameter and its weight-update shard live, as a table for golden files.

For each benchmark on its tiny mesh (8 devices) and on its MLPerf v0.7 slice, the table
gives every parameter's shape, its PartitionSpec and the PartitionSpec of its weight-update
view (gradient shard, optimizer state). It is read off the trainer's abstract state
layout: nothing is compiled, allocated or read. The files live in tests/golden/sharding/
(`python -m launch.sharding_golden` writes them; tests/unit/test_sharding_golden.py compares):
a change there is a change of a model's parallelism layout, to be reviewed as such.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

import jax
from jax.sharding import PartitionSpec

from mlperf.validate import set_config_key
from parallel.weight_update import is_layout

GOLDEN_DIR = "tests/golden/sharding"


@dataclasses.dataclass(frozen=True)
class GoldenCase:
    """One benchmark config on one set of devices."""

    benchmark: str
    variant: str
    topology: str = ""  # a TPU slice (libtpu's description, no TPU needed); "": 8 CPU devices
    overrides: tuple[tuple[str, Any], ...] = ()  # dotted config key -> value

    @property
    def name(self) -> str:
        where = self.topology.replace(":", "_") if self.topology else "cpu8"
        return f"{self.benchmark}_{self.variant}_{where}"

    def config(self):
        config = importlib.import_module(f"configs.{self.benchmark}").get_config(self.variant)
        for key, value in self.overrides:
            set_config_key(config, key, value)
        return config


# The v0.7 slices: Google's published chip counts (BERT and Transformer 4096 chips, SSD
# 2048); Mask R-CNN on 256 chips, where its config's (-1, 8) mesh gives data=64.
GOLDEN_CASES = (
    GoldenCase("bert", "tiny"),
    GoldenCase("transformer", "tiny"),
    GoldenCase("ssd", "tiny"),
    # Tiny Mask R-CNN takes its class count from the data; the shapes set has 3.
    GoldenCase("maskrcnn", "tiny", overrides=(("model.num_classes", 3),)),
    GoldenCase("bert", "mlperf_v07", "v3:64x64"),
    GoldenCase("transformer", "mlperf_v07", "v3:64x64"),
    GoldenCase("ssd", "mlperf_v07", "v3:64x32"),
    GoldenCase("maskrcnn", "mlperf_v07", "v3:16x16"),
)


def spec_entries(spec: PartitionSpec) -> list[Any]:
    """A PartitionSpec as JSON: one entry per dimension (None, an axis, or a list)."""
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def _by_path(tree: Any) -> dict[str, Any]:
    leaves = jax.tree_util.tree_leaves_with_path(
        tree, is_leaf=lambda x: isinstance(x, PartitionSpec | jax.ShapeDtypeStruct) or is_layout(x)
    )
    return {"/".join(str(getattr(k, "key", k)) for k in path): v for path, v in leaves}


def sharding_table(layout) -> dict[str, dict[str, Any]]:
    """Parameter path -> shape, parameter spec and weight-update spec of a StateLayout;
    `view` is the weight-update view's shape where it is a flat padded view."""
    shapes = _by_path(layout.abstract_train_state["params"])
    params = _by_path(layout.param_specs)
    updates = _by_path(layout.update_layouts)
    table = {}
    for name in sorted(shapes):
        row = {
            "shape": list(shapes[name].shape),
            "param": spec_entries(params[name]),
            "update": spec_entries(updates[name].spec),
        }
        if updates[name].flat:
            row["view"] = list(updates[name].view_shape)
        table[name] = row
    return table


def golden_text(record: dict[str, Any]) -> str:
    """The record as JSON with one line per parameter (a layout change is a one-line diff)."""
    head = {k: v for k, v in record.items() if k != "params"}
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    rows = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in record["params"].items()]
    return "{\n" + "\n".join(lines) + '\n "params": {\n' + ",\n".join(rows) + "\n }\n}\n"


def golden_record(case: GoldenCase, devices=None) -> dict[str, Any]:
    """The golden file's content for one case: its mesh and sharding table.
    `devices` (tiny cases): the 8 devices to build the mesh over (default jax.devices())."""
    from mlperf.trainer import build_trainer
    from parallel.mesh import mesh_shape
    from parallel.topology import get_topology

    if case.topology:
        devices = get_topology(case.topology).devices
    devices = list(jax.devices() if devices is None else devices)
    if not case.topology and len(devices) != 8:
        raise ValueError(
            f"the tiny golden tables are for 8 devices, got {len(devices)}: run with "
            "JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8."
        )
    trainer = build_trainer(case.config(), devices=devices, prepare_data=False)
    return {
        "benchmark": case.benchmark,
        "variant": case.variant,
        "devices": case.topology or f"{len(devices)} x {devices[0].platform}",
        "mesh": mesh_shape(trainer.partitioner.mesh),
        "params": sharding_table(trainer.layout),
    }
