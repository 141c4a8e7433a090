"""End-to-end Transformer runs: the tiny run reaches its BLEU target with a compliant MLPerf
log, and in-loop BLEU on 2 processes x 4 devices equals 1 process x 8 devices."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, compliance_check, cpu_env, on_processes

from configs.transformer import get_config
from mlperf.train import run

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("transformer_tiny")
    config = get_config("tiny")
    config.data.cache_dir = str(tmp_path_factory.mktemp("cache"))
    return workdir, run(config, str(workdir))


@pytest.mark.xdist_group("transformer_e2e")
def test_tiny_run_reaches_its_bleu_target(tiny_run):
    workdir, result = tiny_run
    assert result["reached_target"], result
    target = get_config("tiny").train.target
    assert result["eval"]["bleu"] >= target
    assert result["eval"]["eval_examples"] == get_config("tiny").data.tiny_eval_pairs
    on_disk = json.loads((workdir / "result.json").read_text())
    assert on_disk["benchmark"] == "transformer" and on_disk["mesh"] == {"data": 2, "model": 4}


@pytest.mark.xdist_group("transformer_e2e")
def test_tiny_mllog_passes_the_compliance_checker(tiny_run):
    workdir, _ = tiny_run
    output, failures = compliance_check(workdir / "mllog.txt")
    # The tiny run's BLEU passes 25 (eval_accuracy 0.25) on the way, so even the quality
    # target check passes.
    assert failures == [], output


OVERRIDES = [
    "--config.train.steps=30",
    "--config.train.log_every_steps=10",
    "--config.train.eval_every_samples=960",
    "--config.train.stop_at_target=False",
    "--config.model.num_layers=1",
    "--config.data.max_eval_examples=60",  # one padded global batch of 64
    "--config.train.eval_batch_size=64",
]


def _train(workdir, cache, processes: int, devices: int) -> dict:
    train = [
        sys.executable,
        "-m",
        "launch.train",
        "--config",
        "configs/transformer.py:tiny",
        "--workdir",
        str(workdir),
        f"--config.data.cache_dir={cache}",
        *OVERRIDES,
    ]
    cmd = on_processes(train, processes, devices)
    proc = subprocess.run(
        cmd, cwd=REPO, env=cpu_env(devices), capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((workdir / "result.json").read_text())
    assert result["processes"] == processes and result["devices"] == 8
    return result


@pytest.mark.xdist_group("transformer_multiprocess")
def test_bleu_on_2_processes_x_4_devices_equals_1_x_8(tmp_path):
    cache = tmp_path / "cache"
    one = _train(tmp_path / "p1", cache, 1, 8)
    two = _train(tmp_path / "p2", cache, 2, 4)
    assert one["eval"]["eval_examples"] == two["eval"]["eval_examples"] == 60
    # Same data, same parameters, statistics summed over hosts: the same BLEU, exactly.
    for key in ("bleu", "bleu_sys_len", "bleu_ref_len"):
        assert one["eval"][key] == two["eval"][key], (key, one["eval"], two["eval"])
    assert one["eval"]["bleu_sys_len"] > 0
    assert one["params_fingerprint"] == two["params_fingerprint"] or (
        abs(one["train_loss"] - two["train_loss"]) < 1e-4
    )
