"""The COMET-style planner: candidates, ranking, the analytic cluster model, honesty rows."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, cpu_env, small_bert_config

from configs.bert import get_config
from mlperf.inspection import inspect_config
from mlperf.planning import reports as plan_reports
from mlperf.planning import search as plan

pytestmark = pytest.mark.xdist_group("aot")


def test_candidates_start_with_the_config_and_respect_the_batch():
    config = small_bert_config()  # mesh (2, 4), GBS 16
    cands = plan.candidates(config, "v3:2x2", 8, full=False)
    assert cands[0] == plan.Candidate("v3:2x2", 4, "wus", 1, remat=False)
    assert {c.model for c in cands} == {1, 2, 4, 8}
    assert {c.remat for c in cands} == {False, True}  # BERT's model.remat switch
    assert {c.mode for c in cands} == {"wus", "fsdp", "replicated"}
    for c in cands:  # every candidate's batch splits over data x microbatches
        assert config.train.global_batch_size % ((8 // c.model) * c.microbatches) == 0
    assert plan.Candidate("v3:2x2", 1, "wus", 4, remat=False) not in cands  # 16 % (8 x 4) != 0
    full = plan.candidates(config, "v3:2x2", 8, full=True)
    assert len(full) > len(cands) and len(set(full)) == len(full)


def test_model_parallel_degrees_reach_256_where_the_slice_allows():
    config = small_bert_config(**{"train.global_batch_size": 512})
    models = {c.model for c in plan.candidates(config, "v3:16x16", 512, full=False)}
    assert models == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert max(c.model for c in plan.candidates(config, "v3:4x4", 32, full=False)) == 32


def test_knobs_outside_their_range_are_named_with_the_range():
    assert plan.check_knob("hbm_scale", 1.6) is None and plan.check_knob("price", None) is None
    assert plan.check_knob("hbm_scale", 0.0) == (
        "--hbm_scale=0 is out of range; use a value in [0.01, 1000]."
    )
    assert "--slices=-2 is out of range" in plan.check_knob("slices", -2)
    assert "--price=0 is out of range" in plan.check_knob("price", 0.0)


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--hbm_scale=-1", "--hbm_scale=-1 is out of range; use a value in [0.01, 1000]."),
        ("--ici_scale=0", "--ici_scale=0 is out of range"),
        ("--dcn_scale=0", "--dcn_scale=0 is out of range"),
        ("--slices=0", "--slices=0 is out of range; use a value in [1, 4096]."),
        ("--budget_s=0", "--budget_s=0 is out of range"),
        ("--price=-2", "--price=-2 is out of range"),
        ("--chips=0", "--chips '0' is not a chip count"),
        ("--cluster=t4x9", "--cluster 't4x9' is unknown; use one of t4x8x32-10gbe, dgx-a100x8."),
    ],
)
def test_plan_cli_rejects_a_bad_knob_in_one_line_before_compiling(flag, message):
    cmd = [sys.executable, "-m", "launch.plan", "--config", "configs/bert.py:tiny"]
    proc = subprocess.run(
        [*cmd, "--topology", "v3:2x2", flag],
        cwd=REPO, env=cpu_env(8), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"multipod: error: {message}" or (
        message in proc.stderr.strip().splitlines()[-1]
    ), proc.stderr[-1000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_apply_candidate_sets_mesh_and_sharding_mode():
    c = plan.apply_candidate(small_bert_config(), plan.Candidate("v3:2x2", 2, "fsdp", 2), 8)
    assert tuple(c.mesh.ici_shape) == (4, 2)
    assert c.parallel.fsdp and c.parallel.weight_update_sharding and c.train.microbatches == 2


def test_steps_to_target_come_from_the_plan_fields():
    assert plan.steps_to_target(get_config("mlperf_v07")) == 560
    assert plan.steps_to_target(get_config("tiny")) == get_config("tiny").train.steps


def test_rank_orders_fitting_by_time_then_misfits_then_failures():
    rows = [
        {"candidate": "broken", "error": "x"},
        {"candidate": "slow", "fits": True, "time_to_train_s": 9.0, "chips": 4,
         "samples_per_s_per_chip": 1.0},
        {"candidate": "oom", "fits": False, "time_to_train_s": 1.0, "chips": 4,
         "samples_per_s_per_chip": 9.0},
        {"candidate": "fast", "fits": True, "time_to_train_s": 2.0, "chips": 16,
         "samples_per_s_per_chip": 0.5},
    ]  # fmt: skip
    ranked = plan.rank(rows)
    assert [r["candidate"] for r in ranked] == ["fast", "slow", "oom", "broken"]
    assert ranked[0]["scaling_efficiency"] == pytest.approx(0.5 / 9.0)
    assert "failed: x" in plan.table(ranked)


@pytest.mark.slow
def test_planner_ranks_a_model_split_of_a_tiny_model_below_data_parallel():
    """A 32-wide BERT split 4 ways over `model` only adds collectives; the compiler's
    estimate and the planner put pure data parallelism first."""
    config = small_bert_config()
    good = plan.evaluate(config, plan.Candidate("v3:2x2", 1, "wus", 1), {})
    bad = plan.evaluate(config, plan.Candidate("v3:2x2", 4, "wus", 1), {})
    assert good["fits"] and bad["fits"]
    assert bad["comm_s"] > good["comm_s"]
    ranked = plan.rank([bad, good])
    assert ranked[0]["candidate"] == good["candidate"]
    assert good["cost_usd"] < bad["cost_usd"]
    assert good["time_to_train_s"] == pytest.approx(good["steps"] * good["step_s"])


def test_analytic_param_and_optimizer_bytes_match_the_compiled_arguments(devices):
    """On 8 fake CPU devices the layout's per-device params + optimizer bytes agree with
    memory_analysis's argument bytes (which add only the batch and the key) within 10%."""
    r = inspect_config(small_bert_config(), devices)  # data=2 x model=4, WUS
    state = r["bytes_per_device"]["params"] + r["bytes_per_device"]["opt_state"]
    argument = r["train"]["memory"]["argument"]
    assert 0.9 <= state / argument <= 1.0, (state, argument)


COSTS = {"flops_per_example": 1e12, "bytes_per_example": 1e9, "grad_bytes": 1.4e9}


def test_cluster_weak_scaling_falls_with_nodes_on_slow_ethernet():
    rows = plan_reports.cluster_scaling(None, "t4x8x32-10gbe", 32, 8, costs=COSTS)
    assert [r["devices"] for r in rows] == [1, 8, 16, 32, 64, 128, 256]
    assert rows[0]["weak_scaling_efficiency"] == 1.0
    assert rows[1]["inter_node_s"] == 0.0 and rows[2]["inter_node_s"] > 0
    effs = [r["weak_scaling_efficiency"] for r in rows]
    assert effs == sorted(effs, reverse=True) and effs[-1] < 1.0
    # 10x the Ethernet bandwidth (what-if by data) scales better.
    fast = plan_reports.cluster_scaling(None, "dgx-a100x8", 32, 8, costs=COSTS)
    assert fast[-1]["weak_scaling_efficiency"] > effs[-1]
    with pytest.raises(ValueError, match="unknown cluster 'nope'.*t4x8x32-10gbe"):
        plan_reports.cluster_scaling(None, "nope", 32, 8, costs=COSTS)


def test_honesty_table_marks_models_not_built():
    assert plan_reports.load_v07_config("no_such_benchmark") is None
    rows = [
        {"benchmark": "ssd", "chips": 2048, "published_s": 32.8, "status": "not built"},
        {"benchmark": "bert", "chips": 4096, "published_s": 24.0, "status": "predicted",
         "predicted_s": 12.0, "steps": 560, "step_s": 12.0 / 560, "ratio": 0.5,
         "candidate": "v3:64x64 model=4 wus micro=1", "compile_time_s": 100.0},
    ]  # fmt: skip
    text = plan_reports.honesty_table(rows)
    assert "| ssd | 2048 | 32.8 s | not built |" in text
    assert "| bert | 4096 | 24.0 s | 12.0 s (560 steps x 21.4 ms) | 0.50 |" in text
