"""Golden sharding tables: every benchmark's parameter and weight-update PartitionSpecs on
its tiny mesh (8 devices) and its MLPerf v0.7 slice equal the files in
tests/golden/sharding/. A difference is a change of a model's parallelism layout: if it
is meant, regenerate with `python -m launch.sharding_golden` and review the diff."""

from __future__ import annotations

import json
import os

import pytest
from conftest import REPO

from mlperf.sharding_table import GOLDEN_CASES, GOLDEN_DIR, golden_record

pytestmark = pytest.mark.xdist_group("aot")  # the v0.7 cases load libtpu's topologies


def _differences(want: dict, got: dict) -> list[str]:
    """Readable lines for every parameter whose entry differs (or exists on one side)."""
    lines = []
    for key in ("mesh", "devices"):
        if want.get(key) != got.get(key):
            lines.append(f"{key}: golden {want.get(key)} != now {got.get(key)}")
    a, b = want["params"], got["params"]
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            lines.append(f"{name}: golden {a.get(name)} != now {b.get(name)}")
    return lines


@pytest.mark.parametrize("case", GOLDEN_CASES, ids=lambda c: c.name)
def test_sharding_table_matches_golden(case, devices):
    path = os.path.join(REPO, GOLDEN_DIR, f"{case.name}.json")
    with open(path) as f:
        want = json.load(f)
    got = json.loads(json.dumps(golden_record(case, devices)))  # tuples -> lists as on disk
    diff = _differences(want, got)
    assert not diff, (
        f"{case.name} differs from {path} (regenerate: python -m launch.sharding_golden "
        f"--only {case.name}, then review):\n" + "\n".join(diff[:40])
    )


# Models whose `model` axis splits activations only (SSD: image height, spatial
# partitioning); their parameters are replicated over it.
ACTIVATIONS_ONLY_ON_MODEL = {"ssd"}


def test_golden_tables_shard_something_over_every_mesh_axis():
    """Each table puts some weight-update shard on `data` and, where the mesh has a
    model axis larger than 1 that splits weights, some parameter on `model` (a table of
    replicated parameters would pass the comparison but say nothing)."""
    for case in GOLDEN_CASES:
        with open(os.path.join(REPO, GOLDEN_DIR, f"{case.name}.json")) as f:
            record = json.load(f)
        entries = record["params"].values()

        def axes(spec):
            return {a for e in spec if e for a in ([e] if isinstance(e, str) else e)}

        assert any("data" in axes(p["update"]) for p in entries), case.name
        if record["mesh"].get("model", 1) > 1 and case.benchmark not in ACTIVATIONS_ONLY_ON_MODEL:
            assert any("model" in axes(p["param"]) for p in entries), case.name
