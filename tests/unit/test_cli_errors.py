"""Bad input fails before anything compiles, with one message naming the value and the fix."""

from __future__ import annotations

import subprocess

import pytest
from conftest import REPO, cpu_env, tiny_train_command

pytestmark = pytest.mark.xdist_group("cli")


def _train(tmp_path, *overrides):
    workdir = tmp_path / "work"
    proc = subprocess.run(
        tiny_train_command(workdir, f"--config.data.cache_dir={tmp_path / 'cache'}", *overrides),
        cwd=REPO,
        env=cpu_env(8),
        capture_output=True,
        text=True,
        timeout=300,
    )
    mllog = workdir / "mllog.txt"
    compiled = mllog.exists() and "init_stop" in mllog.read_text()
    return proc, compiled


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--config.train.no_such_key=1"], "no_such_key"),
        (["--config.train.steps=many"], "steps"),
        (["--config.mesh.ici_shape=(3,4)"], "needs 12 devices but 8 are available"),
        (["--config.train.global_batch_size=31"], "train.global_batch_size=31 is not divisible"),
        (["--config.data.vocab_file=/nonexistent/vocab.txt"], "/nonexistent/vocab.txt"),
        (
            [
                "--config.data.corpus=files",
                "--config.data.train_files=('/nonexistent/corpus.txt',)",
            ],
            "/nonexistent/corpus.txt",
        ),
    ],
)
def test_bad_input_fails_before_compiling(tmp_path, overrides, message):
    proc, compiled = _train(tmp_path, *overrides)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-2000:]
    assert not compiled


def test_empty_corpus_names_the_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    proc, compiled = _train(
        tmp_path, "--config.data.corpus=files", f"--config.data.train_files=('{empty}',)"
    )
    assert proc.returncode == 2
    assert str(empty) in proc.stderr and "multipod: error:" in proc.stderr
    assert not compiled


@pytest.mark.parametrize(
    "flags_, message",
    [
        (
            ["--num_processes=2", "--process_id=2", "--coordinator=127.0.0.1:1"],
            "--process_id=2 is out of range for --num_processes=2",
        ),
        (["--num_processes=2", "--process_id=1"], "needs --coordinator host:port"),
        (
            [
                "--num_processes=2",
                "--process_id=1",
                "--coordinator=127.0.0.1:9",
                "--init_timeout_s=3",
            ],
            "could not reach the coordinator 127.0.0.1:9 within 3 s",
        ),
    ],
)
def test_bad_cluster_coordinates_fail_clearly_without_hanging(tmp_path, flags_, message):
    proc, compiled = _train(tmp_path, *flags_)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr[-2000:]
    assert not compiled
