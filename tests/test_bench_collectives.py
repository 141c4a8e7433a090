"""The collectives benchmark: sizes parse, every algorithm is timed next to psum and the model."""

from __future__ import annotations

import pytest

from launch import bench_collectives


def test_parse_size():
    assert bench_collectives.parse_size("4K") == 4096
    assert bench_collectives.parse_size("64m") == 64 << 20
    assert bench_collectives.parse_size("512") == 512
    with pytest.raises(ValueError, match="'-1K'"):
        bench_collectives.parse_size("-1K")


def test_bench_rows_cover_every_algorithm_with_psum_as_baseline(devices, tmp_path):
    rows = bench_collectives.bench([4096], [2, 4], repeats=1)
    for P in (2, 4):
        algorithms = {r["algorithm"] for r in rows if r["P"] == P}
        assert algorithms == {
            bench_collectives.XLA,
            "linear_pipeline",
            "ring",
            "tree",
            "bidirectional_exchange",
        }
    for r in rows:
        assert r["measured_s"] > 0
        if r["algorithm"] == bench_collectives.XLA:
            assert r["vs_xla"] == 1.0 and r["model_s"] is None
        else:
            assert r["model_s"] > 0 and r["vs_xla"] == pytest.approx(
                r["measured_s"]
                / next(
                    x["measured_s"]
                    for x in rows
                    if x["P"] == r["P"] and x["algorithm"] == "xla_psum"
                )
            )
    assert "| 4 | 4,096 | ring |" in bench_collectives.table(rows)
