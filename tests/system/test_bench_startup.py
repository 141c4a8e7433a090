"""`python -m launch.bench.startup`: time to run_start, first run against a repeat on one
fresh compilation cache."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, cpu_env

from launch.bench import startup as bench_startup


def _mllog_line(key: str, time_ms: int) -> str:
    record = {
        "namespace": "",
        "time_ms": time_ms,
        "event_type": "INTERVAL_START",
        "key": key,
        "value": None,
        "metadata": {},
    }
    return ":::MLLOG " + json.dumps(record)


def test_the_log_times_are_read_and_a_half_written_line_is_skipped(tmp_path):
    mllog = tmp_path / "mllog.txt"
    assert bench_startup._mllog_times(mllog) == {}
    mllog.write_text(
        "\n".join(
            [
                _mllog_line("init_start", 1000),
                _mllog_line("cache_clear", 1100),
                _mllog_line("run_start", 4500),
                ':::MLLOG {"key": "run_st',
            ]
        )
    )
    assert bench_startup._mllog_times(mllog) == {"init_start": 1000, "run_start": 4500}


def test_known_configs_are_benchmark_variant_pairs():
    assert bench_startup.known_config("bert:tiny")
    assert bench_startup.known_config("transformer:multi30k")
    assert not bench_startup.known_config("bert:huge")
    assert not bench_startup.known_config("resnet:tiny")
    assert not bench_startup.known_config("bert")


def test_the_table_prints_each_run_and_an_error_row():
    ok = {"to_run_start_s": 20.0, "init_s": 15.0, "cache_entries_added": 9}
    again = {"to_run_start_s": 8.0, "init_s": 4.0, "cache_entries_added": 0}
    rows = [
        {"config": "bert:tiny", "first": ok, "repeat": again, "speedup": 2.5},
        {"config": "ssd:tiny", "first": {"error": "ended before run_start: boom"}, "repeat": again},
    ]
    text = bench_startup.table(rows)
    assert "| bert:tiny | 20.0 s (15.0 s) | 8.0 s (4.0 s) | 2.50x | 9, 0 |" in text
    assert "| ssd:tiny | ended before run_start: boom | ok |" in text


def test_an_unknown_config_is_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "launch.bench.startup", "--startup_configs", "bert:huge"],
        cwd=REPO,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("multipod: error: --startup_configs: unknown bert:huge")
    )


@pytest.mark.slow
def test_the_repeat_compiles_nothing_and_reaches_run_start():
    (row,) = bench_startup.bench(["bert:tiny"])
    first, repeat = row["first"], row["repeat"]
    assert "error" not in first and "error" not in repeat, row
    assert first["cache_entries_added"] > 0  # the first run compiled and wrote the cache
    assert repeat["cache_entries_added"] == 0  # the repeat loaded every program from it
    for run in (first, repeat):
        assert 0 < run["init_s"] <= run["to_run_start_s"]
    assert row["speedup"] == pytest.approx(first["to_run_start_s"] / repeat["to_run_start_s"])
