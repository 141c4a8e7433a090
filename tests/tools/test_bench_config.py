"""`python -m launch.bench.step --config ...`: step rate, MFU, input rate against the step's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, cpu_env


def test_bench_reports_step_and_input_rates_and_whether_input_keeps_up():
    cmd = [sys.executable, "-m", "launch.bench.step", "--config", "configs/bert.py:tiny"]
    cmd += ["--steps", "2", "--repeats", "1", "--input_workers", "0", "--json"]
    cmd += ["--config.model.hidden_size=32", "--config.model.mlp_dim=64"]
    out = subprocess.run(cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout[out.stdout.index("{") :])
    assert r["config"] == "bert:tiny" and r["mesh"] == {"data": 2, "model": 4}
    assert r["global_batch_size"] == 64
    assert r["examples_per_s"] > 0 and r["input_examples_per_s"] > 0
    assert 0 < r["mfu"] == r["model_flops_per_s"] / r["peak_flops_per_s"]
    assert r["peak_source"] == "measured fp32 matmul (cpu host)"
    assert r["step_ms"] == pytest.approx(1000.0 / r["steps_per_s"], rel=1e-12)
    assert r["synthetic"] is False
    assert r["input_to_step_ratio"] == r["input_examples_per_s"] / r["examples_per_s"]
    # The verdict the command exits on (without --json: exit code 1 when it is False).
    assert r["input_keeps_up"] == (r["input_to_step_ratio"] >= 3.0)
    assert set(r["host_input_examples_per_s_by_workers"]) == {"0"}


def test_synthetic_times_the_step_of_a_config_whose_data_is_absent(tmp_path):
    """bert:wikitext reads files from data.data_dir; --synthetic prepares and reads none.
    --profile_dir adds a jax.profiler trace of the step after the timed repeats, and each
    stage before the first step reports its end (a GPU run cut short shows where)."""
    data_dir, trace_dir = tmp_path / "data", tmp_path / "trace"
    data_dir.mkdir()
    cmd = [sys.executable, "-m", "launch.bench.step", "--config", "configs/bert.py:wikitext"]
    cmd += [f"--config.data.data_dir={data_dir}", "--steps", "1", "--repeats", "1"]
    cmd += ["--synthetic", "--json", "--config.model.hidden_size=32", "--config.model.mlp_dim=64"]
    cmd += [f"--profile_dir={trace_dir}", "--trace_steps=2"]
    out = subprocess.run(cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout[out.stdout.index("{") :])
    assert r["synthetic"] is True and r["mesh"] == {"data": 1, "model": 1}
    assert r["examples_per_s"] > 0 and r["mfu"] > 0 and r["compile_s"] > 0
    assert "input_examples_per_s" not in r
    assert not list(data_dir.iterdir())  # nothing prepared there
    assert r["trace_dir"] == str(trace_dir / "profile")
    assert list(trace_dir.glob("profile/plugins/profile/*/*.xplane.pb"))
    progress = [line for line in out.stderr.splitlines() if line.startswith("bench: ")]
    stages = ["compiled the train step", "initialised the state", "warm-up step", "wrote a trace"]
    first = [min((i for i, line in enumerate(progress) if s in line), default=-1) for s in stages]
    assert -1 not in first and first == sorted(first), progress


def test_a_trace_of_no_steps_is_a_usage_error(tmp_path):
    cmd = [sys.executable, "-m", "launch.bench.step", "--config", "configs/bert.py:tiny"]
    cmd += ["--synthetic", f"--profile_dir={tmp_path}", "--trace_steps=0"]
    out = subprocess.run(cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "multipod: error: --trace_steps=0: a trace needs 1 step or more" in out.stderr


def test_a_missing_data_file_is_one_line_not_a_traceback(tmp_path):
    cmd = [sys.executable, "-m", "launch.bench.step", "--config", "configs/bert.py:wikitext"]
    cmd += [f"--config.data.data_dir={tmp_path}", "--steps", "1", "--input_workers", "0"]
    out = subprocess.run(cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "multipod: error: WordPiece vocab file not found" in out.stderr
