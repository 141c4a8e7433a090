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


def test_a_tensor_parallel_degree_that_does_not_divide_the_heads_is_an_error_row():
    """4 heads do not split 8 ways: a row naming the heads, before any compile."""
    with pytest.raises(ValueError, match="does not divide the 4 attention heads"):
        plan.apply_candidate(small_bert_config(), plan.Candidate("v3:2x2", 8, "fsdp", 1), 8)
    row = plan.evaluate(small_bert_config(), plan.Candidate("v3:2x2", 8, "fsdp", 1), {})
    assert row["error"].startswith("ValueError: model=8 does not divide the 4 attention heads")


def test_the_planner_reports_libtpus_pick_of_gradient_all_reduce():
    """`plan --collectives`: a compiled candidate carries libtpu's estimate of psum and of
    every algorithm over its data axis at its gradient bytes; the cheapest is the pick."""
    cand = plan.Candidate("v3:2x2", 2, "replicated", 1)
    row = plan.evaluate(small_bert_config(), cand, {}, collectives=True)
    choice = row["allreduce"]
    assert set(choice["estimates"]) == {
        "xla_psum", "linear_pipeline", "ring", "tree", "bidirectional_exchange"
    }  # fmt: skip
    usable = {k: v for k, v in choice["estimates"].items() if v}
    assert choice["algorithm"] == min(usable, key=usable.get)
    assert choice["seconds"] == min(usable.values()) and choice["bytes"] > 0
    assert choice["xla_psum_s"] == choice["estimates"]["xla_psum"]
    text = plan.table(plan.rank([row]))
    assert "all-reduce pick (libtpu) |" in text and f"| {choice['algorithm']} " in text


def test_no_usable_estimate_means_no_pick():
    from parallel.allreduce_choice import pick

    rows = [{"algorithm": "ring", "tpu_estimate_s": None}, {"algorithm": "tree", "error": "x"}]
    assert pick(rows) == {"algorithm": None, "why": "no usable compiler estimate"}
    rows.append({"algorithm": "xla_psum", "tpu_estimate_s": 2e-3})
    assert pick(rows)["algorithm"] == "xla_psum"

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
    assert "| ssd | 2048 | 32.8 s | not built | - | - | |" in text
    assert "| bert | 4096 | 24.0 s | 12.0 s (560 steps x 21.4 ms) | 0.50 |" in text
    assert "no published step time" in text  # the row gives none
    rows[1]["published_step_s"] = 0.017
    assert "| 21.4 / 17.0 ms = 1.26 |" in plan_reports.honesty_table(rows)


def test_half_precision_gradients_halve_the_cluster_all_reduce():
    f32 = plan_reports.cluster_scaling(None, "t4x8x32-10gbe", 32, 4, costs=COSTS)
    f16 = plan_reports.cluster_scaling(
        None, "t4x8x32-10gbe", 32, 4, costs=COSTS, grad_reduce_dtype="float16"
    )
    assert f16[-1]["inter_node_s"] == pytest.approx(f32[-1]["inter_node_s"] / 2)
    assert f16[-1]["weak_scaling_efficiency"] > f32[-1]["weak_scaling_efficiency"]
    config = get_config("large")
    config.parallel.grad_reduce_dtype = "bfloat16"  # what --grad_reduce_dtype sets
    bf16 = plan_reports.cluster_scaling(config, "t4x8x32-10gbe", 32, 4, costs=COSTS)
    assert bf16[-1]["grad_reduce_dtype"] == "bfloat16"
    assert bf16[-1]["step_s"] == pytest.approx(f16[-1]["step_s"])


def test_per_step_bytes_do_not_grow_with_the_batch():
    from parallel.costmodel import cluster_step_time

    def memory_s(batch, micro=1):
        return cluster_step_time(
            0.0, 1e6, 0.0, batch, 8, 1, 1e12, 1e9, 1e9, 1e9,
            bytes_per_step=1e9, microbatches=micro,
        ).memory_s  # fmt: skip

    assert memory_s(64) == pytest.approx((64e6 + 1e9) / 1e9)
    assert memory_s(32, micro=2) == pytest.approx((64e6 + 2e9) / 1e9)


LIN_PHASE_COSTS = [  # per phase, as reference_costs returns them (made-up round figures)
    {"flops_per_example": 2.5e11, "bytes_per_example": 2e8, "flops_per_step": 1e10,
     "bytes_per_step": 6e9, "grad_bytes": 1.34e9, "params": 3.35e8},
    {"flops_per_example": 1.1e12, "bytes_per_example": 8e8, "flops_per_step": 1e10,
     "bytes_per_step": 6e9, "grad_bytes": 1.34e9, "params": 3.35e8},
]  # fmt: skip


def test_lin_cluster_study_figures_come_from_its_assumptions():
    from mlperf.planning.lin_cluster_study import (
        LIN_CLUSTER_STUDY,
        lin_cluster_study,
        lin_cluster_study_text,
    )

    base = lin_cluster_study(study=LIN_CLUSTER_STUDY, costs=LIN_PHASE_COSTS)
    assert [r["nodes"] for r in base["phases"][0]["scaling"]] == [1, 1, 8, 32]
    assert base["phases"][0]["global_batch"] == 256 * 32 * 4
    days = sum(p["examples"] / p["scaling"][-1]["samples_per_s"] for p in base["phases"]) / 86400
    assert base["pretrain_days"] == pytest.approx(days)
    assert base["rent_usd"] == pytest.approx(256 * 0.35 * days * 24)
    text = lin_cluster_study_text(base)
    assert "12 days |" in text and "~70% (published)" in text and "4 accumulation steps" in text
    # More accumulation steps amortise the all-reduce: efficiency up, time down.
    more = lin_cluster_study(study={**LIN_CLUSTER_STUDY, "micro": 8}, costs=LIN_PHASE_COSTS)
    eff = [p["scaling"][-1]["weak_scaling_efficiency"] for p in (base, more) for p in p["phases"]]
    assert eff[2] > eff[0] and eff[3] > eff[1]
    assert more["pretrain_days"] < base["pretrain_days"]
    # fp32 gradients: twice the bytes over Ethernet, slower.
    fp32 = lin_cluster_study(
        study={**LIN_CLUSTER_STUDY, "grad_reduce_dtype": "float32"}, costs=LIN_PHASE_COSTS
    )
    assert fp32["pretrain_days"] > base["pretrain_days"]
    assert fp32["buy_usd"] == base["buy_usd"] and fp32["rent_usd"] > base["rent_usd"]


def test_lin_cluster_row_and_reference_costs_compile_a_tiny_bert():
    """The Lin et al. row's path (`lin_cluster_row`) end to end on a tiny BERT: two reference
    compiles (1 and 2 examples per core) separate per-example from per-step bytes."""
    config = small_bert_config(**{"data.seq_length": 32, "data.max_predictions": 4})
    costs = plan_reports.reference_costs(config)
    assert costs["flops_per_example"] > 0 and costs["bytes_per_example"] > 0
    assert costs["bytes_per_step"] > 0  # weights and optimizer state, once per step
    row = plan_reports.lin_cluster_row(small_bert_config())
    assert row["assumptions"]["micro"] == 4 and row["chips"] == 256
    assert 0 < row["predicted_efficiency"] <= 1.0
    assert "T4" in plan_reports.honesty_table([row])


@pytest.mark.slow
def test_honesty_row_for_bert_on_a_per_core_proxy():
    (row,) = plan_reports.honesty_rows("v3:2x2", lin_cluster=False, benchmarks=("bert",))
    assert row["status"] == "predicted" and row["proxy_for"] == "v3:64x64"
    assert 0.3 < row["ratio"] < 3.0 and 0.3 < row["step_ratio"] < 3.0, row


@pytest.mark.slow  # compiles a 6-layer 4096-wide BERT thrice (~45 s): make test-ci-slow
def test_a_candidate_out_of_hbm_gets_a_step_time_and_fits_at_a_larger_scale():
    """Six scanned 4096-wide layers with replicated f32 Adam state need about 35 GiB per
    v3 core (16 GiB) by the compiler's out-of-HBM message: the planner extrapolates the
    step's costs from 1- and 2-layer compiles, reports the need and the scale it fits at;
    planned at 3x HBM the candidate fits, gets a step time and ranks with the fitting
    candidates."""
    config = small_bert_config(
        **{"model.hidden_size": 4096, "model.mlp_dim": 16384, "model.num_heads": 32,
           "model.num_layers": 6, "model.scan_layers": True}
    )  # fmt: skip
    cand = plan.Candidate("v3:2x2", 1, "replicated", 1, remat=False)
    grown = plan.evaluate(config, cand, {"hbm_scale": 3.0})
    assert "out of HBM as compiled" in grown["estimate_method"], grown  # at the real 16 GiB
    assert "memory: the compiler's out-of-HBM figure" in grown["estimate_method"]
    assert 1.0 < grown["min_hbm_scale"] < 3.0 and grown["fits"] is True
    assert grown["step_s"] > 0 and grown["compute_s"] > 0
    # MFU counts the task's analytic FLOPs; the compiled ones are within 2x of them.
    assert 0.0 < grown["mfu"] < 1.0 and 0.5 < grown["flops_vs_analytic"] < 2.0
    assert grown["compiler_s"] is not None  # v3's own estimate, not a roofline
    assert grown["memory_per_device"] == pytest.approx(grown["min_hbm_scale"] * (16 << 30))
    assert "more than the real 16 GiB" in grown["note"]
    # The same row at the real capacity: does not fit, says the scale it needs.
    real = {**grown, "fits": False}
    slow = grown["time_to_train_s"] * 10
    fitting = {"candidate": "slow but fits", "fits": True, "chips": 4,
               "time_to_train_s": slow, "samples_per_s_per_chip": 1.0}  # fmt: skip
    assert plan.rank([fitting, real])[0] is fitting  # at 1.0 it ranks below any that fits
    assert plan.rank([fitting, grown])[0] is grown  # at the scale it needs, it competes


def test_half_precision_gradient_reduction_halves_the_modelled_dcn_term():
    from parallel import costmodel

    def dcn_s(dtype):
        return costmodel.tpu_step_time(
            1e12, 1e9, 0.0, None, 1e14, 1e12, 1e11, slices=4,
            dcn_bytes=1e9 * costmodel.grad_bytes_ratio(dtype), dcn_bandwidth=1e9,
        ).dcn_s  # fmt: skip

    assert dcn_s("bfloat16") == pytest.approx(dcn_s("float32") / 2) == dcn_s("float16")
    with pytest.raises(ValueError, match="grad_reduce_dtype='int8' is unknown"):
        costmodel.grad_bytes_ratio("int8")


def test_without_a_compiler_estimate_the_step_is_bracketed_by_the_overlap_bounds():
    from parallel import costmodel

    step = costmodel.tpu_step_time(1e12, 4e9, 3e9, None, 1e14, 1e12, 1e11)
    # compute 10 ms, HBM 4 ms, ICI 30 ms: no overlap 40 ms, all of ICI hidden 30 ms.
    assert step.total_s == step.serial_s == pytest.approx(0.040)
    assert step.overlapped_s == pytest.approx(0.030)
    with_compiler = costmodel.tpu_step_time(1e12, 4e9, 3e9, 0.02, 1e14, 1e12, 1e11)
    assert with_compiler.total_s == pytest.approx(0.020)
    assert with_compiler.overlapped_s == pytest.approx(step.overlapped_s)
    assert with_compiler.serial_s == pytest.approx(0.040)


@pytest.mark.slow  # BERT-large layer compiles (40-50 s each): make test-ci-slow
@pytest.mark.parametrize(("topology", "ici"), [("v3:2x2", (2, 4)), ("v5p:2x2x1", (2, 2))])
def test_the_compilers_estimate_is_never_below_the_overlapped_bound(topology, ici):
    """Where libtpu's estimate is usable, it is at or above the roofline with every ICI
    collective hidden behind compute: that figure is a floor for v4, v5e and v6e, where
    the estimate is not usable. BERT-large, one unrolled layer (no loop the estimate
    sees once). The no-overlap figure is no ceiling: on this small program, compute and
    HBM time are close and the compiler's per-kernel sum exceeds it."""
    from parallel import costmodel
    from parallel.topology import get_topology

    config = get_config("mlperf_v07")
    config.model.update(num_layers=1, scan_layers=False)
    config.train.global_batch_size = 16
    config.mesh.ici_shape = ici
    train = inspect_config(config, topology=topology, layer_estimate=False)["train"]
    topo = get_topology(topology)
    per_chip = topo.devices_per_chip
    step = costmodel.tpu_step_time(
        flops=train["flops_per_device"],
        bytes_accessed=train["bytes_accessed_per_device"],
        wire_bytes=train["wire_bytes_per_device"],
        compiler_s=None,
        peak_flops=topo.chip.peak_flops / per_chip,
        hbm_bandwidth=topo.chip.hbm_bandwidth / per_chip,
        ici_bandwidth=2 * topo.chip.link_bandwidth / per_chip,
    )
    assert step.ici_s > 0.1 * step.total_s  # the bounds are apart
    assert step.overlapped_s <= train["compiler_step_s"]
