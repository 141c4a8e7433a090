"""The op profile of a compiled step: per-op compiler cycles, kinds, loops x trip count."""

from __future__ import annotations

import pytest

from parallel.hlo_profile import by_kind, op_profile, profile_table, summarize

HLO = """
%fused_dot (p0: bf16[8,16], p1: bf16[16,16]) -> bf16[8,16] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[16,16]{1,0} parameter(1)
  ROOT %d = bf16[8,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (t: (s32[], bf16[8,16], bf16[16,16])) -> (s32[], bf16[8,16], bf16[16,16]) {
  %t = (s32[], bf16[8,16], bf16[16,16]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[8,16]{1,0} get-tuple-element(%t), index=1
  %w = bf16[16,16]{1,0} get-tuple-element(%t), index=2
  %f = bf16[8,16]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(step)/layer/dot_general"}, backend_config={"window_config":{"estimated_cycles":"1000"}}
  %ar = bf16[8,16]{1,0} all-reduce(%f), replica_groups={{0,1,2,3}}, to_apply=%add, metadata={op_name="jit(step)/psum"}
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %r = (s32[], bf16[8,16], bf16[16,16]) tuple(%n, %ar, %w)
}

%cond (t: (s32[], bf16[8,16], bf16[16,16])) -> pred[] {
  %t = (s32[], bf16[8,16], bf16[16,16]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %k = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %k), direction=LT
}

ENTRY %main (a: bf16[8,16], b: bf16[16,16], c: f32[64,64]) -> f32[64,64] {
  %a = bf16[8,16]{1,0} parameter(0)
  %b = bf16[16,16]{1,0} parameter(1)
  %c = f32[64,64]{1,0} parameter(2)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[8,16], bf16[16,16]) tuple(%zero, %a, %b)
  %loop = (s32[], bf16[8,16], bf16[16,16]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %cp = f32[64,64]{0,1} copy(%c), backend_config={"window_config":{"estimated_cycles":"500"}}
}
"""  # noqa: E501


def test_ops_carry_the_compiler_cycles_times_their_loop_trips():
    rows = op_profile(HLO, clock_hz=1e9, link_bandwidth=1e9)
    by_name = {r["name"]: r for r in rows}
    dot = by_name["f"]
    assert dot["kind"] == "matmul" and dot["count"] == 3 and dot["cycles"] == 3000
    assert dot["seconds"] == pytest.approx(3e-6) and dot["method"] == "compiler cycles"
    assert dot["flops"] == 3 * 2 * 8 * 16 * 16
    assert dot["source"] == "jit(step)/layer/dot_general"
    copy = by_name["cp"]
    assert copy["kind"] == "copy/transpose" and copy["seconds"] == pytest.approx(5e-7)
    # No cycles for a collective: ring all-reduce over 4 devices, 2 (g-1)/g x 256 bytes.
    ar = by_name["ar"]
    assert ar["kind"] == "collective" and ar["method"] == "ring model"
    assert ar["seconds"] == pytest.approx(3 * 2 * 0.75 * 256 / 1e9)
    assert rows[0]["name"] == "f"  # heaviest first
    assert "loop" not in by_name and "init" not in by_name  # control and plumbing skipped


def test_totals_per_kind_and_the_table():
    rows = op_profile(HLO, clock_hz=1e9, link_bandwidth=1e9)
    kinds = by_kind(rows)
    assert kinds["matmul"]["ops"] == 3 and kinds["matmul"]["seconds"] == pytest.approx(3e-6)
    assert kinds["copy/transpose"]["ops"] == 1
    summary = summarize(rows, top=2)
    assert len(summary["top"]) == 2 and summary["sum_s"] == pytest.approx(
        sum(k["seconds"] for k in kinds.values())
    )
    text = profile_table(summary)
    assert "matmul" in text and "layer/dot_general" in text


def test_without_cycles_ops_rank_by_the_roofline():
    rows = op_profile(HLO.replace("estimated_cycles", "other"), peak_flops=1e9, hbm_bandwidth=1e9)
    dot = next(r for r in rows if r["name"] == "f")
    assert dot["method"] == "roofline"
    assert dot["seconds"] == pytest.approx(max(dot["flops"], dot["bytes"]) / 1e9)


@pytest.mark.xdist_group("aot")
def test_inspect_profiles_a_tpu_compiled_step():
    """BERT tiny compiled for v3:2x2 by libtpu: the compiler writes per-op cycles."""
    from configs.bert import get_config
    from mlperf.inspection import inspect_config, table

    config = get_config("tiny")
    config.mesh.ici_shape = (4, 2)
    report = inspect_config(config, topology="v3:2x2", profile=5)
    profile = report["train"]["profile"]
    assert profile["clock_hz"] == 940e6 and len(profile["top"]) == 5
    assert {"matmul", "collective", "elementwise"} <= set(profile["by_kind"])
    assert "compiler cycles" in {r["method"] for r in profile["top"]} and profile["sum_s"] > 0
    # Every dot and convolution is in a matmul kernel (with the elementwise ops fused to it).
    kinds, train = profile["by_kind"], report["train"]
    assert kinds["matmul"]["flops"] >= 0.99 * train["matmul_flops_per_device"]
    total = sum(k["flops"] for k in kinds.values())
    assert total == pytest.approx(train["flops_per_device"], rel=0.05)
    assert "train step op profile" in table(report)
