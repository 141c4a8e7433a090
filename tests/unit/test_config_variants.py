"""Every variant of every config file in configs/ builds and validates on its mesh:
`get_config(variant)` returns the config, its task builds, and `mlperf.validate.validate`
accepts it against the device count the variant is meant for (docs/benchmarks.md). No
data is read and nothing compiles."""

from __future__ import annotations

import glob
import importlib
import os

import pytest

from mlperf.validate import validate

CONFIGS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs"
)
# The multi-thousand-chip variants validate on 1,024 devices (512 TPU-v3 chips), as
# `launch.plan` and the AOT tests use them; every other variant on the 8 test devices.
LARGE_VARIANTS = {"mlperf_v07", "10b", "100b", "1t"}


def _variants() -> list[tuple[str, str]]:
    """(config module, variant) for every config file: its VARIANTS, or bert_scale's SIZES."""
    found = []
    for path in sorted(glob.glob(os.path.join(CONFIGS, "*.py"))):
        with open(path) as f:
            if "def get_config(" not in f.read():
                continue  # __init__.py, common.py: shared blocks, no variants
        name = os.path.basename(path)[: -len(".py")]
        module = importlib.import_module(f"configs.{name}")
        variants = getattr(module, "VARIANTS", None) or tuple(getattr(module, "SIZES", ()))
        assert variants, f"configs/{name}.py lists no VARIANTS (or SIZES)"
        found += [(name, v) for v in variants]
    return found


VARIANTS = _variants()


def test_every_config_file_is_covered():
    modules = {m for m, _ in VARIANTS}
    assert {"bert", "bert_scale", "transformer", "ssd", "maskrcnn"} <= modules
    assert len(VARIANTS) >= 20


@pytest.mark.parametrize("module, variant", VARIANTS, ids=[f"{m}:{v}" for m, v in VARIANTS])
def test_every_variant_builds_and_validates(module, variant):
    config = importlib.import_module(f"configs.{module}").get_config(variant)
    # mesh.num_devices > 0: the run uses that many devices (wikitext, multi30k: one).
    devices = config.mesh.num_devices or (1024 if variant in LARGE_VARIANTS else 8)
    sizes = validate(config, devices)
    assert sizes["data"] * sizes.get("model", 1) == devices, sizes
    assert config.train.global_batch_size % sizes["data"] == 0
