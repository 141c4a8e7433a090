"""JAX's persistent compilation cache: a repeated run of the same config loads every
compiled program from the cache (no miss) and trains exactly as the first run did."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import REPO, cpu_env, tiny_train_command

from mlperf import compilation_cache

SHORT = ["--config.train.steps=6", "--config.train.eval_every_samples=96"]


def _run(workdir, cache_dir) -> dict:
    command = tiny_train_command(workdir, *SHORT, f"--compilation_cache={cache_dir}")
    proc = subprocess.run(
        command, cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: target not reached in 6 steps
    with open(workdir / "result.json") as f:
        return json.load(f)


@pytest.mark.slow
def test_second_run_loads_every_program_from_the_cache(tmp_path):
    cache_dir = tmp_path / "xla"
    first = _run(tmp_path / "first", cache_dir)
    second = _run(tmp_path / "second", cache_dir)
    assert first["compilation_cache"]["directory"] == str(cache_dir)
    assert first["compilation_cache"]["misses"] > 0 and any(cache_dir.iterdir())
    assert second["compilation_cache"]["misses"] == 0
    assert second["compilation_cache"]["hits"] >= first["compilation_cache"]["misses"]
    # The cached executables compute what the compiled ones did.
    assert second["params_fingerprint"] == first["params_fingerprint"]
    assert second["train_loss"] == first["train_loss"]


def test_off_and_unwritable_directories_leave_the_cache_off(tmp_path, capsys):
    assert compilation_cache.enable("none") is None
    assert compilation_cache.enable("") is None
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert compilation_cache.enable(str(blocker / "xla")) is None
    assert "compilation cache off: cannot create" in capsys.readouterr().out
