"""BERT tiny AOT-compiled for a small slice of every TPU generation libtpu knows, and for
two slices joined over DCN (libtpu's compiler on this CPU machine, nothing allocated)."""

from __future__ import annotations

import pytest

from configs.bert import get_config
from mlperf.inspection import inspect_config
from parallel.topology import TopologyError, check_mesh_fits, get_topology

pytestmark = pytest.mark.xdist_group("aot")

# (topology, slices, (data, model) per slice, devices, device kind)
CASES = [
    ("v3:2x2", 1, (2, 4), 8, "TPU v3"),  # model = the 2 cores of a chip x 2 chips
    ("v4:2x2x1", 1, (2, 2), 4, "TPU v4"),  # megacore: one device per chip
    ("v5e:4x4", 1, (8, 2), 16, "TPU v5 lite"),  # model=2 splits the x axis (4)
    ("v5p:2x2x1", 1, (2, 2), 4, "TPU v5"),
    ("v6e:2x2", 1, (2, 2), 4, "TPU v6 lite"),
    ("v5e:2x2", 2, (2, 2), 8, "TPU v5 lite"),  # data = 2 per slice x 2 slices over DCN
]


@pytest.mark.parametrize(("topology", "slices", "ici", "devices", "kind"), CASES)
def test_bert_tiny_compiles_on_every_generation(topology, slices, ici, devices, kind):
    config = get_config("tiny")
    config.mesh.ici_shape = ici
    r = inspect_config(config, topology=topology, slices=slices, layer_estimate=False)
    assert "error" not in r["train"], r["train"].get("error")
    assert r["devices"] == devices and r["device_kind"] == kind
    assert r["mesh"] == {"data": ici[0] * slices, "model": ici[1]}
    assert r["gather_scatter"] == 0 and r["fits"] is True
    assert r["train"]["flops_per_device"] > 0
    # A usable step estimate on every generation (v4's own compiler estimate is
    # negative in libtpu 0.0.42; inspect then uses the roofline).
    assert r["train"]["estimated_step_s"] > 0
    mapping = r["mesh_mapping"]
    assert mapping.startswith(f"model={ici[1]} <- ")
    if topology == "v5e:4x4":
        assert "split physical axes: x" in mapping
    if slices > 1:
        assert f"DCN: data x {slices} slices" in mapping
        # The gradient reduction over `data` crosses slices: its DCN part is a host
        # transfer (all-reduce or reduce-scatter) with bytes on the wire.
        crossing = r["train"]["dcn_collectives"]
        assert crossing.get("all-reduce", 0) + crossing.get("reduce-scatter", 0) > 0
        assert r["train"]["dcn_wire_bytes"] > 0
    else:
        assert "dcn_collectives" not in r["train"]


def test_v4_is_one_device_per_chip_and_slices_multiply_devices():
    assert len(get_topology("v4:4x4x4").devices) == 64  # megacore, as on a v4 pod
    two = get_topology("v5e:2x2", 2)
    assert len(two.devices) == 8 and two.chips == 8 and two.label == "v5e:2x2 x 2 slices"
    assert {d.slice_index for d in two.devices} == {0, 1}


def test_unknown_topology_lists_the_known_ones_by_generation():
    with pytest.raises(TopologyError, match=r"v4: 2x2x1, .*16x16x16; v5e: .*; v6e: ") as e:
        get_topology("v7q:4x4")
    assert "\n" not in str(e.value)


def test_a_mesh_that_does_not_fit_names_shape_mesh_and_sizes_that_would():
    topo = get_topology("v5e:4x4")
    with pytest.raises(TopologyError) as e:
        check_mesh_fits(topo, {"data": 6, "model": 2})
    text = str(e.value)
    assert "physical shape 4x4" in text and "data=6,model=2" in text
    assert "data=8,model=2" in text and "\n" not in text
    config = get_config("tiny")
    config.mesh.ici_shape = (6, 2)  # 12 devices: inspect stops before building anything
    with pytest.raises(TopologyError) as e:
        inspect_config(config, topology="v5e:4x4")
    text = str(e.value)
    assert text.startswith("mesh data=6,model=2 does not fit topology v5e:4x4")
    assert "physical shape 4x4 chips, 16 devices; sizes that fit: " in text
    assert "data=8,model=2" in text and "\n" not in text


def test_plan_applies_the_dcn_term_to_the_collectives_that_cross_slices():
    from mlperf.planning import search as plan
    from parallel.hardware import CHIPS

    config = get_config("tiny")
    cand = plan.Candidate("v5e:2x2", 2, "wus", 1)
    row = plan.evaluate(config, cand, {"slices": 2})
    assert "error" not in row, row.get("error")
    assert row["chips"] == 8 and row["mesh"] == {"data": 4, "model": 2}
    assert sum(row["dcn_collectives"].values()) > 0
    # dcn_s is the crossing collectives' bytes over one v5e chip's share of its host NIC.
    assert 0 < row["dcn_s"] < row["step_s"]
    assert row["dcn_s"] * CHIPS["v5e"].dcn_bandwidth == pytest.approx(row["dcn_wire_bytes"])


def test_inspect_cli_says_what_fits_in_one_line():
    import subprocess
    import sys

    from conftest import REPO, cpu_env

    proc = subprocess.run(
        [sys.executable, "-m", "launch.inspect", "--config", "configs/bert.py:tiny"]
        + ["--topology", "v5e:4x4", "--mesh", "data=6,model=2", "--eval=false"],
        cwd=REPO,
        env=cpu_env(8),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("multipod: error:")]
    assert "v5e:4x4 (physical shape 4x4 chips, 16 devices; sizes that fit: " in line
    assert "flags:" not in proc.stderr  # no help dump


@pytest.mark.slow  # two TPU compiles (~30 s): make test-ci-slow
def test_v5e_chained_collectives_count_as_the_same_program_on_v6e():
    """libtpu splits v5e's large all-gathers into chains of fusions; counted once per
    chain, the same program and mesh sends what it sends on v6e (one link each)."""
    from mlperf.trainer import build_trainer
    from parallel.aot import compiled_stats
    from parallel.hlo_text import chain_links

    stats, links = {}, {}
    for generation in ("v5e", "v6e"):
        config = get_config("tiny")
        config.train.global_batch_size = 256
        config.mesh.ici_shape = (4, 4)
        devices = get_topology(f"{generation}:4x4").devices
        trainer = build_trainer(config, devices=devices, prepare_data=False)
        compiled = trainer.lower_train_step(trainer.phases[0]).compile()
        stats[generation] = compiled_stats(compiled)
        links[generation] = chain_links(compiled.as_text())
    assert max(links["v5e"].values()) > 1 and not links["v6e"]  # the case this test is about
    v5e, v6e = stats["v5e"], stats["v6e"]
    assert v5e["collectives"] == v6e["collectives"]
    assert v5e["collective_bytes"] == v6e["collective_bytes"]
    assert v5e["wire_bytes"] == pytest.approx(v6e["wire_bytes"])
