"""COMET's study (`launch.plan --scale_study`): points, the row cache, memory expansion and
the tables. The compiles themselves are the planner's (`test_plan.py`); a 100B candidate
on a 4096-chip slice compiles in `test_aot_multipod.py` (make test-system)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, cpu_env

from mlperf.planning import scale_study as study
from mlperf.planning import search


def _row(size, topology, model, mode, step_s, need):
    """A planner row as `search.evaluate` makes it, reduced to what the study reads."""
    return {
        "size": size, "topology": topology, "model": model, "mode": mode, "step_s": step_s,
        "compute_s": step_s / 2, "memory_s": step_s / 4, "comm_s": step_s / 4, "dcn_s": 0.0,
        "memory_per_device": need * (32 << 30), "min_hbm_scale": need, "mfu": 0.4,
        "flops_vs_analytic": 1.3, "wall_s": 100.0,
    }  # fmt: skip


def test_points_parse_and_bad_points_name_the_form():
    points = study.parse_points("100b/v4:16x16x16/16/wus; 1t/v5p:16x16x16/64;1t/v4/256/fsdp/8")
    assert points == (
        study.StudyPoint("100b", "v4:16x16x16", 16, "wus"),
        study.StudyPoint("1t", "v5p:16x16x16", 64, "fsdp"),
        study.StudyPoint("1t", "v4", 256, "fsdp", 8),
    )
    assert points[2].key == "1t-v4-model256-fsdp-micro8" and "micro" not in points[0].key
    bad_points = ("2t/v4/16", "100b/v4/x", "100b/v4/16/zero3", "100b/v4/0", "1t/v4/8/fsdp/0")
    for bad in bad_points:
        with pytest.raises(ValueError, match="size/topology/model"):
            study.parse_points(bad)
    with pytest.raises(ValueError, match="no scale-study points given"):
        study.parse_points(" ; ")
    # The default study sweeps tensor parallelism over the degrees each size allows.
    v4 = {p.model for p in study.DEFAULT_POINTS if (p.size, p.topology) == ("100b", "v4:16x16x16")}
    assert {4, 8, 16, 32} <= v4
    one_t = {p.model for p in study.DEFAULT_POINTS if p.size == "1t"}
    assert {64, 128, 256} <= one_t  # 256 heads: tensor parallelism up to 256


@pytest.mark.parametrize("size", ["10b", "100b", "1t"])
def test_scaled_berts_keep_their_layers_in_a_rematerialised_loop(size):
    """`mlperf_v07` unrolls its 24 layers whole; the scaled configs built from it must not
    (48-80 layers unrolled: a 100b compile twice as long, at 16 GB of host memory). A
    loop's step time is the planner's 1- and 2-layer extrapolation."""
    from configs.bert import get_config as bert_config
    from configs.bert_scale import get_config
    from mlperf.inspection import layer_loop

    assert bert_config("mlperf_v07").model.scan_unroll == 0
    model = get_config(size).model
    assert model.scan_layers and model.scan_unroll == 1 and model.remat
    assert layer_loop(model)


def test_memory_expansion_finds_the_split_a_larger_hbm_makes_best():
    """A split that needs 1.5x the HBM and steps 1.3x faster is the best only once the
    memory grows to 1.6x; the gain is the real HBM's best step over it."""
    rows = [
        _row("100b", "v4:16x16x16", 16, "fsdp", 2.6, 0.8),
        _row("100b", "v4:16x16x16", 8, "fsdp", 2.0, 1.5),
        _row("100b", "v4:16x16x16", 64, "fsdp", 5.2, 0.5),
        _row("100b", "v4:16x16x16", 16, "replicated", 1.0, 3.0),  # fits at none of them
        {"size": "100b", "topology": "v4:16x16x16", "model": 256, "mode": "fsdp", "error": "x"},
    ]
    (entry,) = study.memory_expansion(rows)
    assert entry["best"][1.0]["model"] == 16
    assert entry["best"][1.6]["model"] == 8 and entry["best"][2.0]["model"] == 8
    assert entry["gain"][1.6] == pytest.approx(1.3)
    assert entry["spread"] == pytest.approx(5.2)  # 5.2 / 1.0, fitting or not
    text = study.study_text(rows)
    assert "| 100b | v4:16x16x16 | model=8 fsdp | 48.0 GiB | NO (x1.50) | 2,000 |" in text
    assert "| 100b | v4:16x16x16 | model=256 fsdp | failed: x |" in text
    assert "| 1.30x / 1.30x | 5.2x |" in text


def test_no_split_fits_says_so():
    (entry,) = study.memory_expansion([_row("1t", "v4:16x16x16", 64, "fsdp", 9.0, 1.8)])
    assert entry["best"][1.0] is None and entry["best"][2.0]["model"] == 64
    assert entry["gain"][2.0] is None
    assert "none fits" in study.study_text([_row("1t", "v4:16x16x16", 64, "fsdp", 9.0, 1.8)])


def test_cached_rows_are_reused_and_the_budget_skips_the_rest(tmp_path, monkeypatch):
    """A row cached for the same config and compiler is read back without compiling; a
    changed config has another key; once the budget is spent the rest are skipped."""
    point = study.StudyPoint("10b", "v4:16x16x16", 8)
    config = study.config_for(point)
    cached = _row("10b", "v4:16x16x16", 8, "fsdp", 0.5, 0.2)
    (tmp_path / f"{study._cache_key(point, config)}.json").write_text(json.dumps(cached))

    def no_compile(*args, **kwargs):
        raise AssertionError("a cached point was compiled")

    monkeypatch.setattr(search, "evaluate", no_compile)
    other = study.StudyPoint("100b", "v4:16x16x16", 16)
    rows = study.run_study((point, other), str(tmp_path), budget_s=0.0)
    assert rows[0] == cached
    assert rows[1]["skipped"] == "compile budget spent" and rows[1]["size"] == "100b"
    shallow = study.config_for(point, num_layers=2)
    assert study._cache_key(point, shallow) != study._cache_key(point, config)


def test_scale_study_cli_rejects_a_bad_point_in_one_line():
    cmd = [sys.executable, "-m", "launch.plan", "--scale_study", "--points=100b/v4:4x4x4/big"]
    done = subprocess.run(cmd, cwd=REPO, env=cpu_env(1), capture_output=True, text=True)
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "size/topology/model[/mode[/microbatches]]" in lines[0], done.stderr
