"""`launch.train`'s exit codes classify bad input where it is detected, not by the type
of the exception that ends the run (docs/multi-host.md): a bad config value ends with
code 2 and one line; a ValueError raised mid-run by anything else is a bug, code 70 with
its traceback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from conftest import REPO, cpu_env, tiny_train_command

from launch.cli import EXIT_BAD_INPUT, EXIT_CRASH
from launch.train import bad_input_errors

pytestmark = pytest.mark.xdist_group("cli")

# The tiny BERT run cut to 4 steps of one small layer, evaluated after step 2.
SHORT_RUN = [
    "--config.train.steps=4",
    "--config.train.eval_every_samples=128",
    "--config.train.log_every_steps=1",
    "--config.model.num_layers=1",
    "--config.model.hidden_size=32",
    "--config.model.num_heads=4",
    "--config.model.mlp_dim=64",
]
# launch.train with the first eval's device pass raising ValueError, as a bug deep inside
# JAX would (say, a shape mismatch), after training steps have run.
BROKEN_EVAL = """
import sys
from absl import app
from launch import train
from launch.cli import parse_flags
from mlperf.evaluate import Evaluator

def run_pass(self, params):
    raise ValueError("injected: operands of incompatible shapes (4, 32) and (5, 32)")

Evaluator.run_pass = run_pass
sys.argv = ["launch.train", *sys.argv[1:]]
app.run(train.main, flags_parser=parse_flags)
"""


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=REPO, env=cpu_env(8), capture_output=True, text=True, timeout=300
    )


def test_a_value_error_mid_run_is_a_bug_with_its_traceback(tmp_path):
    argv = tiny_train_command(tmp_path / "w", *SHORT_RUN)
    argv[1:3] = ["-c", BROKEN_EVAL]  # `python -m launch.train ...` -> `python -c ... ...`
    proc = _run(argv)
    assert proc.returncode == EXIT_CRASH, proc.stderr[-3000:]
    assert re.search(r"^step +2/4 ", proc.stdout, re.M), proc.stdout[-2000:]  # trained first
    assert "Traceback (most recent call last)" in proc.stderr
    # The traceback runs from the training loop down to the line that raised.
    assert "mlperf/loop.py" in proc.stderr and ", in run_pass\n" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("multipod: unexpected error: ValueError: injected"), last
    assert "multipod: error:" not in proc.stderr


def test_a_bad_config_value_is_bad_input_in_one_line(tmp_path):
    proc = _run(tiny_train_command(tmp_path / "w", "--config.train.global_batch_size=31"))
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("multipod: error: "), proc.stderr[-3000:]
    assert "train.global_batch_size=31 is not divisible" in lines[0]


def test_bad_input_is_the_checks_error_types_not_every_value_error():
    from input_pipeline.input_errors import InputError
    from mlperf.validate import ConfigError

    bad = bad_input_errors()
    assert isinstance(ConfigError("x"), bad) and isinstance(InputError("x"), bad)
    assert isinstance(FileNotFoundError("x"), bad)
    assert not isinstance(ValueError("x"), bad) and not isinstance(TypeError("x"), bad)


def test_an_empty_training_set_is_bad_input_in_one_line(tmp_path):
    # The tiny TFRecord config with its training files swapped for one empty file.
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(os.path.join(REPO, "tests/fixtures/bert_tfrecord/eval_tiny"), data)
    (data / "part-00000-of-00001").write_bytes(b"")
    argv = tiny_train_command(
        tmp_path / "w", f"--config.data.data_dir={data}", "--config.data.train_files=('part-*',)"
    )
    argv[argv.index("configs/bert.py:tiny")] = "configs/bert.py:tiny_tfrecord"
    proc = _run(argv)
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("multipod: error: "), proc.stderr[-3000:]
    assert "training TFRecord files hold no records" in lines[0]
