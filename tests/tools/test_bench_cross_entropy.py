"""launch.bench.cross_entropy: both forms on small logits, the shape parser, the CLI's errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, cpu_env

from launch.bench import cross_entropy as bench_cross_entropy


def test_parse_shape_reads_rows_by_vocab_and_names_a_bad_one():
    assert bench_cross_entropy.parse_shape("640x30522") == (640, 30522)
    for bad in ("640", "0x10", "ax10", "640x30522x2"):
        with pytest.raises(ValueError, match="ROWSxVOCAB"):
            bench_cross_entropy.parse_shape(bad)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_bench_times_both_forms_and_they_agree(smoothing):
    rows = bench_cross_entropy.bench([(32, 64), (16, 500)], smoothing, rounds=1, calls=2)
    assert [(r["rows"], r["vocab"]) for r in rows] == [(32, 64), (16, 500)]
    for r in rows:
        assert r["textbook_ms"] > 0 and r["ours_ms"] > 0
        assert r["speedup"] == pytest.approx(r["textbook_ms"] / r["ours_ms"])
        assert r["max_grad_diff"] < 1e-6
        assert r["smoothing"] == smoothing
    text = bench_cross_entropy.table(rows)
    assert "| [16, 500] |" in text and text.count("\n") == 3


def test_bench_with_a_bias_checks_and_times_the_bias_gradient_too():
    rows = bench_cross_entropy.bench([(24, 300)], rounds=1, calls=2, bias=True)
    (row,) = rows
    assert row["bias"] is True and row["textbook_ms"] > 0 and row["ours_ms"] > 0
    assert row["max_grad_diff"] < 1e-5
    assert "| [24, 300] | 0.0 | yes |" in bench_cross_entropy.table(rows)


def test_cli_prints_json_rows_and_refuses_a_bad_shape():
    cmd = [
        sys.executable,
        "-m",
        "launch.bench.cross_entropy",
        "--xent_shapes",
        "8x32",
        "--rounds",
        "1",
    ]
    out = subprocess.run(cmd + ["--json"], cwd=REPO, env=cpu_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = json.loads(out.stdout)
    assert (row["rows"], row["vocab"]) == (8, 32)
    bad = subprocess.run(
        [*cmd[:-4], "--xent_shapes", "8by32"],
        cwd=REPO,
        env=cpu_env(),
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "multipod: error: --xent_shapes: shape '8by32'" in bad.stderr
