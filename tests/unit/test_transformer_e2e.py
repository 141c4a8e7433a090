"""End-to-end Transformer runs: the tiny run reaches its BLEU target with a compliant MLPerf
log, and in-loop BLEU on 2 processes x 4 devices equals 1 process x 8 devices."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


# Small enough that the two runs (1x8, then 2x4) take well under 3 minutes on a loaded
# 2-core machine: compiling the train step and the beam search dominates, so the model,
# the corpus, the eval set and the decode length are all cut down.
OVERRIDES = [
    "--config.train.steps=20",
    "--config.train.log_every_steps=10",
    "--config.train.eval_every_samples=640",  # one eval, at the last step
    "--config.train.stop_at_target=False",
    "--config.checkpoint.enabled=False",
    "--config.model.num_layers=1",
    "--config.model.emb_dim=32",
    "--config.model.mlp_dim=64",
    "--config.data.tiny_train_pairs=1000",
    "--config.optimizer.warmup_steps=5",  # past always-EOS output within 20 steps
    "--config.data.max_eval_examples=14",  # one global batch of 16, padded
    "--config.train.eval_batch_size=16",
    "--config.eval.max_extra_length=8",
]


def _start(workdir, cache, processes: int, devices: int) -> subprocess.Popen:
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
    # Output to a file, not a pipe: a full pipe would block a run nobody reads yet.
    log = open(f"{workdir}.log", "wb")  # noqa: SIM115 - closed when the run is collected
    proc = subprocess.Popen(cmd, cwd=REPO, env=cpu_env(devices), stdout=log, stderr=log)
    proc.log = log
    return proc


def _result(proc: subprocess.Popen, workdir, processes: int) -> dict:
    proc.wait(timeout=600)
    proc.log.close()
    output = Path(f"{workdir}.log").read_bytes().decode(errors="replace")
    assert proc.returncode in (0, 1), output[-6000:]
    result = json.loads((workdir / "result.json").read_text())
    assert result["processes"] == processes and result["devices"] == 8
    return result


@pytest.mark.xdist_group("transformer_multiprocess")
def test_bleu_on_2_processes_x_4_devices_equals_1_x_8(tmp_path):
    cache = tmp_path / "cache"
    # Both runs at once (the data cache is built under file locks): on a shared machine the
    # wall time is close to one run's instead of the sum.
    procs = [_start(tmp_path / "p1", cache, 1, 8), _start(tmp_path / "p2", cache, 2, 4)]
    one = _result(procs[0], tmp_path / "p1", 1)
    two = _result(procs[1], tmp_path / "p2", 2)
    assert one["eval"]["eval_examples"] == two["eval"]["eval_examples"] == 14
    # Same data, same parameters, statistics summed over hosts: the same BLEU, exactly.
    for key in ("bleu", "bleu_sys_len", "bleu_ref_len"):
        assert one["eval"][key] == two["eval"][key], (key, one["eval"], two["eval"])
    assert one["eval"]["bleu_sys_len"] > 0
    assert one["params_fingerprint"] == two["params_fingerprint"] or (
        abs(one["train_loss"] - two["train_loss"]) < 1e-4
    )
