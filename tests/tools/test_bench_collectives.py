"""The collectives benchmark: sizes parse, every algorithm is timed next to psum and the model."""

from __future__ import annotations

import pytest

from launch.bench import collectives as bench_collectives


def test_parse_size():
    assert bench_collectives.parse_size("4K") == 4096
    assert bench_collectives.parse_size("64m") == 64 << 20
    assert bench_collectives.parse_size("512") == 512
    with pytest.raises(ValueError, match="'-1K'"):
        bench_collectives.parse_size("-1K")


def test_bench_rows_cover_every_algorithm_with_psum_as_baseline(devices, tmp_path):
    rows = bench_collectives.bench([4096], [2, 4], repeats=1, aot_topologies=())
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


def test_tpu_compiler_estimates_every_algorithm_on_a_v3_slice():
    """AOT through libtpu: v3:4x4 is 32 cores; every algorithm and psum compile and get
    an estimated time; the alpha-beta model is there for all but psum."""
    rows = bench_collectives.aot_estimates([1 << 20], ["v3:4x4"])
    assert {r["algorithm"] for r in rows} == {
        bench_collectives.XLA,
        "linear_pipeline",
        "ring",
        "tree",
        "bidirectional_exchange",
    }
    for r in rows:
        assert r["P"] == 32 and "error" not in r
        assert r["tpu_estimate_s"] > 0
        assert (r["model_s"] is None) == (r["algorithm"] == bench_collectives.XLA)
    by = {r["algorithm"]: r["tpu_estimate_s"] for r in rows}
    # A binomial tree sends the whole message log2(32) = 5 times each way: the slowest.
    assert by["tree"] > by["ring"]
    text = bench_collectives.table(rows)
    assert "| v3:4x4 (32) | 1,048,576 |" in text


def test_no_tpu_estimates_flag_skips_the_aot_compiles(tmp_path):
    """`launch.bench.collectives --no_tpu_estimates`: CPU rows only, no topology rows."""
    import json
    import subprocess
    import sys

    from conftest import REPO, cpu_env

    proc = subprocess.run(
        [sys.executable, "-m", "launch.bench.collectives", "--no_tpu_estimates"]
        + ["--sizes=4K", "--device_counts=2", "--repeats=1", "--json"],
        cwd=REPO,
        env=cpu_env(2),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert {r["P"] for r in rows} == {2} and len(rows) == 5  # psum + 4 algorithms
    assert not any("topology" in r for r in rows)
